// I-BERT's integer-only softmax (Kim et al., ICML 2021; docs/methods/ibert.md): the exponential as a second-order
// polynomial on (-ln 2, 0] after an ln 2 range reduction, and an integer normalisation to `out_bits` bits.
//
// Integer logits q <= 0 (q - max q of a row) with scale S (real logit = S q):
//   paper (Algorithms 1-2):  q_ln2 = floor(ln2 / S),  z = floor(-q / q_ln2),  q_p = q + z q_ln2 in (-q_ln2, 0]
//                            q_L = (q_p + floor(b / S))^2 + floor(c / (a S^2)),  a, b, c = 0.3585, 1.353, 0.344
//                            q_exp = q_L >> z   (scale a S^2)
//   upstream (official code): x0 = floor(-0.6931 / S) < 0,  q' = max(q, 30 x0),  z = floor(q' / x0),  r = q' - x0 z
//                            q_L = (r + floor(b' / S)) r + floor(c' / S^2),  b', c' = 0.96963238 / a', 1 / a',
//                            a' = 0.35815147;  q_exp = max(floor(q_L 2^(30 - z)), 0)   (scale a' S^2 / 2^30),
//                            then QuantAct(16): round-half-even(q_exp a' S^2 / 2^30 / s16), s16 = 1 / 32767
//   normalisation:           division (paper): P_int = floor(q_exp 2^M / sum q_exp)
//                            factor32 (official code): P_int = floor(q_exp floor(2^32 / sum q_exp) / 2^(32 - M))
//                            P = P_int / 2^M, M = out_bits; the largest entry of a one-entry row is P = 1 (2^M)
// Every step is evaluated exactly in 64-bit integers (the official code holds these integers in float32 tensors and
// rounds them above 2^24; qattn does not emulate that). Float logits are quantised first: q = round-half-even(x / S),
// S = max |x| / (2^(in_bits - 1) - 1) over the tensor or each row (1 / (2^(in_bits - 1) - 1) if every |x| is 0).
// -inf entries are masked (P = 0).
#pragma once

#include <optional>

#include <cstdint>
#include <span>

#include "qattn/tensor.h"

namespace qattn::ref {

enum class IbertExp { paper, upstream };
enum class IbertScope { tensor, row };
enum class IbertNorm { division, factor32 };

struct IbertParams {
  IbertExp exp = IbertExp::paper;
  int in_bits = 12;   // the integer grid of float logits (I-BERT's own input is the INT32 Q K^T with its scale)
  int out_bits = 8;   // the paper quantises the softmax output to 8 bits
  IbertNorm norm = IbertNorm::division;
  IbertScope scope = IbertScope::tensor;
};

// The i-exp of one integer logit q <= 0 at scale S, as the integer q_exp (paper: scale a S^2; upstream: after the
// 16-bit requantisation, scale 1 / 32767). Throws InputError when a polynomial value leaves int32 (the paper's INT32
// budget; S too small for it).
std::int64_t ibert_exp(std::int64_t q, double scale, IbertExp variant);

// One row of integer logits (visible[j] false = masked) into P_int; returns sum q_exp.
std::int64_t ibert_softmax_row(std::span<const std::int64_t> q, std::span<const bool> visible, double scale,
                               const IbertParams& p, std::span<std::int64_t> p_int);

// Row-wise softmax of float logits [rows, L]: P = P_int / 2^out_bits.
// With tensor_max_abs, scope=tensor takes its grid from that max |x| (the whole call's, when logits are a block of
// its rows) instead of the logits' own.
RowMatrixXd ibert_softmax_rows(const MatrixView& logits, const IbertParams& p,
                               std::optional<double> tensor_max_abs = std::nullopt);
// max |x| over the finite entries of logits (0 if none): the maximum scope=tensor takes its grid S from.
double ibert_max_abs(const MatrixView& logits);

}  // namespace qattn::ref
