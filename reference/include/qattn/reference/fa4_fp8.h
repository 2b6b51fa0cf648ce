// FlashAttention-4's FP8 forward pass on a B200 as a description for the one flash loop (docs/pipelines/fa4-fp8.md),
// every step as the official CuTe-DSL kernel computes it (Dao-AILab/flash-attention, flash_attn/cute/:
// flash_fwd_sm100.py, softmax.py, utils.py). One call, Q [L_q, d], K [L_k, d], V [L_k, d_v]:
//   (1) Q8, K8, V8: E4M3 codes per tensor with descales, as fa3-fp8 (scale=amax: descale fl32(amax / 448))
//   (2) S = Q8 K8^T on tcgen05.mma kind::f8f6f4 (b200-tcgen05-e4m3: d in fused steps of 32, F = 25, RZ to float32;
//       MMA-Sim's model, not measured here), from a zero accumulator
//   (3) key blocks of 128, last first; s2 = fl32(fl32(fl32(scale) fl32(log2 e)) fl32(q_descale k_descale));
//         m_new = max(m, rowmax S_blk), kept (m_new = m, r = 1) while fl32((m_new - m) s2) <= rescale_threshold
//         r = exp2(fl32((m - m_new) s2));  P~ = exp2(fma(S, s2, -(fl32(m_new s2) - 8)))   (max_offset 8)
//         the exp2 of the pairs ex2_emu_freq selects by the software polynomial (fa4_ex2_emulation), the rest as
//         the hardware's (modelled as exp2 in float64 rounded once)
//         l = fadd_reduce(P~, l r): eight lanes j mod 8, l r in lane 0, ((L0 + L2) + (L4 + L6)) + ((L1 + L3) + (L5 + L7))
//         P8 = E4M3(P~), nearest even, saturating;  O = O r, then P8 V8 onto O on tcgen05.mma, steps of 32 keys
//   (4) O fl32(fl32(1 / l) v_descale), rounded to bfloat16 (out=bf16)
// Not modelled: the hardware's ex2.approx.ftz.f32 and rcp.approx (computed correctly rounded); FA4 picks the software
// exp2 per tile of queries (no mask_fn), qattn per row (the same without a mask).
#pragma once

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"

namespace qattn::ref {

enum class Fa4Units { b200, h100 };

struct Fa4Fp8Params {
  bool scale_amax = true;         // false: Q, K, V cast as is (descale 1)
  bool output_bf16 = true;
  double rescale_threshold = 4;   // flash_fwd_sm100.py: 4.0 for FP8 (8.0 for 16-bit inputs)
  int ex2_emu_freq = 10;          // _FP8_TUNING_CONFIG, d = 128 without a mask: 10; 0: every exp2 by the hardware's
  int ex2_emu_start = 1;
  Fa4Units units = Fa4Units::b200;  // h100: the same kernel with S and P V on the H100's FP8 wgmma
};

FlashKernel fa4_fp8_kernel(const Fa4Fp8Params& p);

}  // namespace qattn::ref
