// SageAttention2 as a reference pipeline (docs/pipelines/sage2.md). One call, Q [L_q, d], K [L_k, d], V [L_k, d_v]:
//   (1) smoothing: K' = K - mean_tokens(K) (softmax-invariant: each row's logits shift by one constant);
//       optional Q' = Q - mean over each block of b_q tokens, with Delta S = mean_b(Q) K'^T (fp32) added back;
//       optional V' = V - mean_tokens(V), the mean added to O at the end (rows of P sum to 1)
//   (2) Q', K' quantised per group (sage_quant.h): INT8 or INT4, half-away or half-even
//   (3) S = fl32(fl32(A) * fl32(sQ_g sK_g scale)) + Delta S, A the exact integer dot products; masked pairs -inf
//   (4) online softmax over key blocks of 64: m_new = max(m, rowmax S_blk);
//       P~ = fl32(448 e^{S - m_new}) (e4m3: in (0, 448]; the upstream m shift by log2 448), the fp32 row sum l takes
//       P~ before it is rounded; then P8 = round(P~) to the P format (E4M3/E5M2 RNE saturating, INT8, or FP16)
//   (5) V per channel in the matching format: FP8 v8 = fp8(v 448 / amax_c) (57344 for E5M2), INT8 amax_c/127, FP16
//   (6) PV accumulation: two-level (each block into a fresh FP22 buffer, round toward zero after every add, then added
//       to the fp32 output after the rescale e^{m - m_new}), single-level FP22 (one FP22 accumulator, rescaled), or fp32
//   (7) O = acc * (V channel scale) / l (+ mean V)
#pragma once

#include "qattn/method.h"
#include "qattn/reference/sage_quant.h"

namespace qattn::ref {

enum class SagePFormat { e4m3, e5m2, int8, fp16 };
enum class SageAccumulation { two_level_fp22, fp22, fp32 };

struct Sage2Params {
  bool smooth_k = true, smooth_q = false, smooth_v = false;
  SageGranularity granularity = SageGranularity::thread;
  int qk_bits = 8;
  SageRounding rounding = SageRounding::half_away;
  SagePFormat p_format = SagePFormat::e4m3;
  SageAccumulation accumulation = SageAccumulation::two_level_fp22;
  int kv_block = 64;
  SageGroupSizes groups;
};

AttentionResult sage2_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage2Params& p);

}  // namespace qattn::ref
