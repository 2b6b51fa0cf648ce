// TurboAttention (FlashQ + SAS) as a reference pipeline (docs/pipelines/turbo.md). No official code exists; this is
// Algorithm 1 (prefill) and Algorithm 2 (decode) of the paper with every open choice named. Steps (1)-(5) and (8)
// are a description of the one flash loop (turbo_kernel, flash_kernel.h); decode's cache, steps (6) and (7), is the
// loop's key side (FlashKeyCodes), built here.
//
// Prefill, one call Q [L_q, d], K [L_k, d], V [L_k, d_v]:
//   (1) Q in row blocks of B_r, K and V in key blocks of B_c, each block symmetric INT8 with s = max|x|/119 (flashq.h)
//   (2) per block pair A = Q8 K8^T exact in integers; S = fl32(A) * fl32(sQ sK scale); masked pairs -inf
//   (3) online softmax: m_new = max(m, rowmax S_blk) (fp32); P~ = fl32(SAS(m_new - S)); r = fl32(SAS(m_new - m))
//       (0 for the first visible block); l = fl32(l r + rowsum P~) over P~ before quantisation
//   (4) P~ of the tile quantised with s_P = max(P~ tile)/119: P8 = round_half_even(P~ / s_P) in [0, 119]
//   (5) O = fl32(O r + fl32(sum_j P8 V8 * s_P sV)), the integer sum exact; finally O = fl32(O / l)
// Decode (every query row is one decode step against the cache as it stands when that query arrives):
//   (6) keys [0, P) went through prefill: INT8 per B_c block, then compressed channel-wise to kv_bits (8 = kept)
//   (7) keys [P, L_k) arrived one by one into the INT8 buffer with the universal scale s_u = max of the prefill
//       blocks' scales (K and V separately), clamped to +-119; each time n_b tokens fill it, they are compressed as
//       one block (scale s_u). A query that sees n keys sees the chunks completed by then compressed, the rest raw.
//   (8) the query row is INT8 with its own scale (a block of one row); key blocks are the prefill blocks followed by
//       the buffer chunks; (2)-(5) as in prefill, the quantised cache dequantised to INT8 first
#pragma once

#include <vector>

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/sas.h"

namespace qattn::ref {

enum class TurboMode { prefill, decode };

struct TurboParams {
  Eigen::Index block_r = 64, block_c = 64;
  SasParams sas;
  bool exact_exp = false;          // e^{-y} in place of SAS for P~ and the rescale (isolates FlashQ's error)
  TurboMode mode = TurboMode::prefill;
  int kv_bits = 4;                 // decode cache: 8 (INT8 kept), 4 or 2
  int heads_2bit = 0;              // n_h: the lowest-priority heads of a layer take 2 bits (turbo_attention_heads)
  HeadPriority priority = HeadPriority::channel_gaps;  // Eq. 11's std (flashq.h)
  int int8_max = kFlashQRange;     // R of the INT8 blocks and of P~: 119 (Algorithm 1) or 126 (after Eq. 3)
  Eigen::Index buffer = 64;        // n_b
  Eigen::Index prefill_len = -1;   // decode: P; -1 = auto, min(L_k, B_c max(1, floor(L_k / (2 B_c))))
  IntScaleRounding int_scale = IntScaleRounding::round;
};

// Counts of the saturating steps of one call, for the doc's claims and the tests.
struct TurboStats {
  Eigen::Index buffer_clamped = 0;       // (7) entries clamped to +-119 under the universal scale
  Eigen::Index dequant_saturated = 0;    // (3) of flashq.h: entries of (code - z) s outside INT8
};

// Steps (1)-(5) as a flash-loop description: prefill's; decode's with a block of one query (each row a step).
// `qattn kernel show turbo` prints the prefill one.
FlashKernel turbo_kernel(const TurboParams& p);

// kv_bits overrides p.kv_bits for this head (the mixed-precision assignment passes it).
AttentionResult turbo_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const TurboParams& p, int kv_bits, TurboStats* stats = nullptr);

// The same call prepared (Method::prepare): K and V's blocks and cache once, then any block of query rows whose
// first row is a multiple of B_r (prefill) or any row (decode). turbo_attention is this with one block of every row.
std::unique_ptr<PreparedCall> prepare_turbo(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const TurboParams& p, int kv_bits);

// All heads of one layer: kv bits per head from flashq_head_bits(priority of each head, p.heads_2bit, 2, p.kv_bits).
std::vector<AttentionResult> turbo_attention_heads(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                                   const std::vector<MatrixView>& v, double scale,
                                                   const AttentionMask& mask, const TurboParams& p);

// The resolved decode prefill length P for L_k keys.
Eigen::Index turbo_prefill_len(const TurboParams& p, Eigen::Index lk);

}  // namespace qattn::ref
