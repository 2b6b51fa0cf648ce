// IndexSoftmax (IntAttention): softmax of INT32 logits through a 2^b-entry UINT8 exp table, with integer
// normalisation to an integer P. Derivation, every rounding choice and its paper/upstream provenance:
// docs/methods/index-softmax.md.
//
// For one row of integer logits a_j (valid entries only), with clip c_int and table size T = 2^b:
//   (1) m = max_j a_j
//   (2) Δ'_j = min(m - a_j, c_int)                                        (int64, exact)
//   (3) idx_j = index_rule(Δ'_j)  in [0, T-1]                              (Eq. 11 or upstream variants)
//   (4) E_j = LUT[idx_j],  LUT[i] = lut_rounding(255 exp(-c i / (T-1))),  LUT[0] = 255, LUT[T-1] = 0
//   (5) S = Σ_j E_j                                                        (int64: never 16 bits)
//   (6) P_j = normalization(E_j, S) in [0, s_P]                            (s_P = 255 for u8, 127 for s8)
// Masked entries give E = 0 and P = 0; a fully masked row gives all zeros without any division.
//
// c_int comes from the quantisation scales: c_int = cint_rounding(c / α) with α = s_Q s_K / sqrt(d), saturated to
// [1, kCintMax] so that tiny scales can neither overflow an int32/int64 product nor divide by zero.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <string_view>
#include <vector>

#include "qattn/index_softmax_params.h"
#include "qattn/key_groups.h"
#include "qattn/tensor.h"

namespace qattn::ref {

using qattn::CintRounding;
using qattn::IndexRule;
using qattn::IndexSoftmaxParams;
using qattn::kCintMax;
using qattn::LutRounding;
using qattn::Normalization;
using qattn::PFormat;
using qattn::cint_from_alpha;
using qattn::to_string;

// LUT[i] for i in [0, 2^bits): lut_rounding(255 exp(-c i / (2^bits - 1))) in double arithmetic (certified against
// 50-digit exp by tests/exact/certify_index_test.cc), then LUT[0] = 255 and LUT[last] = 0.
// For bits = 1 the table is {255, 0}.
std::vector<std::uint8_t> index_lut(int bits, double c, LutRounding rounding);

// alpha = sQ sK / sqrt(d), evaluated as c * sqrt(d) / (sQ * sK) in double (the upstream expression).
std::int64_t cint_from_scales(double c, double s_q, double s_k, std::int64_t d, CintRounding rounding);

// Index of one clipped distance Δ' in [0, c_int] (IndexRule), clamped to [0, 2^bits - 1].
int index_of(std::int64_t delta, std::int64_t c_int, int bits, IndexRule rule);
// The Q26 multiplier of the NEON rules: floor((2^bits - 1) 2^26 / c_int + 1/2), exact.
std::int64_t q26_multiplier(std::int64_t c_int, int bits);
// P of one E given the row sum S (Normalization). Requires S >= 1.
std::int32_t normalize(std::int32_t e, std::int64_t row_sum, int p_scale, Normalization rule);

// Intermediate values of one row, for golden tests and debugging.
struct IndexSoftmaxTrace {
  std::vector<int> idx;  // -1 for masked entries
  std::vector<int> e;
  std::int64_t row_sum = 0;
  std::int64_t q8_ns = -1;  // the reciprocal, when Normalization::q8_reciprocal divided
};


// One row. `valid` may be null (no mask). Writes P into `p_out` (length L).
void index_softmax_row(const std::int32_t* logits, const bool* valid, Eigen::Index length, std::int64_t c_int,
                       const IndexSoftmaxParams& params, const std::vector<std::uint8_t>& lut, std::int32_t* p_out,
                       IndexSoftmaxTrace* trace = nullptr);

// Row-wise over [rows, L]. `valid` is empty (no mask) or of the same shape. Returns integer P in [0, s_P].
RowMatrixXi32 index_softmax(const Eigen::Ref<const RowMatrixXi32>& logits, std::int64_t c_int, const IndexSoftmaxParams& params,
                            const RowMatrixXb& valid = {});

// Group-wise clipping (IntAttention Eq. 16-18) over blocks of `block` keys (the last may be shorter): block j has
// its fixed-point scale ratio ratio[j] and its clip c_int[j] (Eq. 16); one LUT for every block (Eq. 18); the row
// maximum read by `rule` (qattn/key_groups.h); Eq. 15 over the whole row. Masked entries and fully masked blocks
// take no part; a fully masked row is all zeros.
struct KeyGroupClip {
  Eigen::Index block = 0;
  std::vector<std::int64_t> ratio;  // rho_j, qattn/key_groups.h
  std::vector<std::int64_t> c_int;  // c_int^(j)
  GroupMax rule = GroupMax::global;
  double offset_scale = 0;          // kappa, for GroupMax::offset
};
void index_softmax_grouped_row(const std::int32_t* logits, const bool* valid, Eigen::Index length,
                               const KeyGroupClip& clip, const IndexSoftmaxParams& params,
                               const std::vector<std::uint8_t>& lut, std::int32_t* p_out);
RowMatrixXi32 index_softmax_grouped(const Eigen::Ref<const RowMatrixXi32>& logits, const KeyGroupClip& clip,
                                    const IndexSoftmaxParams& params, const RowMatrixXb& valid = {});

// IndexSoftmaxOnly (the upstream baseline on FP logits): Δ = min(rowmax - x, c) in double, idx = trunc(Δ (T-1) / c),
// E = LUT[idx], probabilities E / S in double. -inf entries are masked. Returns probabilities.
Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> index_softmax_fp(
    const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>& logits, const IndexSoftmaxParams& params);

}  // namespace qattn::ref
