// SageAttention3's FP4 attention (sageattn3_blackwell) as a description for the one flash loop
// (docs/pipelines/sage3.md), every step as the official code computes it (thu-ml/SageAttention,
// sageattention3_blackwell/: sageattn3/api.py, quantization/fp4_quantization_4d.cu, blackwell/softmax_fused.h,
// blackwell/mainloop_tma_ws.h, blackwell/cute_extension.h). One call, Q [L_q, d], K [L_k, d], V [L_k, d_v]:
//   (1) K - its token mean; Q - the mean of each block of 128 queries (per-block-mean), Delta S = mean K'^T
//   (2) Q, K: NVFP4 per 16 channels, V per 16 keys of a channel: SF = E4M3(fl32(amax / 6)), E2M1(fl32(x fl32(1/SF)))
//   (3) S = Q4 K4^T on the block-scaled FP4 step (b200-nvf4: MMA-Sim's model of tcgen05.mma kind::mxf4nvf4.block16,
//       taken for sm_120's mma.sync block_scale m16n8k64; not measured here), d in steps of 64, Delta S as C
//   (4) key blocks of 128, last first; c = fl32(fl32(scale) log2 e); per row:
//         m' = max(m, rowmax S_blk); max_scaled = fma(m', c, -log2 2688); r = exp2(fl32((m - m') c))
//         P~ = exp2(fma(S, c, -max_scaled))                     (the row's top at 448 x 6: the first level)
//         l_t = l_t r, then + P~ over thread t's keys (8t..8t+7 of every 32), in order
//         per 16 keys: sc = exp2(fma(max S, c, -max_scaled) + log2(1/6)); P4 = E2M1(P~ / sc), scale E4M3(sc)
//         acc = P4 V4 on the FP4 step, steps of 64 keys from 0; O = fma(O, r, acc)
//   (5) l = (l_0 + l_1) + (l_2 + l_3); O fl32(1 / l), rounded to bfloat16 (out=bf16)
// exp2 in float64 rounded once (the kernel's ex2.approx is not modelled), divisions IEEE (--use_fast_math's are not).
#pragma once

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"

namespace qattn::ref {

struct Sage3Params {
  bool per_block_mean = true;  // Q's mean per 128 queries (api.py's default), or one mean over every query
  bool output_bf16 = true;
  bool qk_mxfp4 = false;  // Q and K in MXFP4 (UE8M0 per 32 channels, S on b200-mxf4): AMD's scaling, not sage3's
};

FlashKernel sage3_kernel(const Sage3Params& p);

}  // namespace qattn::ref
