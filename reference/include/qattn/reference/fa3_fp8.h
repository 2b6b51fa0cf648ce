// FlashAttention-3's FP8 forward pass on an H100 as a reference pipeline (docs/pipelines/fa3-fp8.md), every step
// as the official Hopper kernel computes it (Dao-AILab/flash-attention, hopper/: mainloop_fwd_sm90_tma_gmma_ws.hpp,
// softmax.h, tile_size.h). One call, Q [L_q, d], K [L_k, d], V [L_k, d_v]:
//   (1) Q8, K8, V8: E4M3 codes of each tensor, with a descale factor each (the kernel takes FP8 tensors and
//       q/k/v_descale from its caller): scale=amax: descale = fl32(amax / 448), X8 = E4M3(fl32(fl32(X) / descale)),
//       round to nearest even; scale=none: descale 1, X8 = E4M3(fl32(X)) as torch's .to(float8_e4m3fn) (values
//       that cast makes NaN, |x| >= 464, are refused)
//   (2) S = Q8 K8^T on the FP8 wgmma (h100-wgmma-e4m3): d in fused steps of 32 from a zero accumulator, float32
//   (3) online softmax over key blocks of kBlockN (tile_size_fwd_sm90: 160, 128, 224, 160, 128 keys for d <= 64,
//       96, 128, 192, 256), the blocks in REVERSE order (last block first), for each query tile of kBlockM rows
//       (192 or 128) only the blocks that hold a visible key of the tile; with s2 = fl32(fl32(fl32(scale) log2 e)
//       fl32(q_descale k_descale)) (the host's softmax_scale_log2, then the kernel's *= q_descale * k_descale):
//         m_new = max(m, rowmax S_blk)                               (raw S, float32)
//         r = exp2((m - m_new) s2); l_t = l_t r                      (four partial sums l_t per row)
//         P~ = exp2(fma(S, s2, -(m_new s2 - 8)))                     float32 in (0, 256]
//         l_t += sum of the P~ of the columns thread t holds         (t = (column mod 8) / 2, columns in order)
//         P8 = E4M3(P~), round to nearest even, saturating           (cvt.rn.satfinite)
//         O = O r, then P8 V8 onto O on the wgmma in steps of 32 keys (one accumulator for the whole key loop)
//   (4) l = (l_0 + l_2) + (l_1 + l_3); O = O fl32(fl32(1 / l) v_descale); out=bf16: O rounded to bfloat16 (the
//       kernel's output dtype) or out=fp32
// exp2 is computed in float64 and rounded once to float32; the kernel's ex2.approx.ftz.f32 (and the approximate division of
// --use_fast_math) are not modelled, the one approximation in this model (docs/pipelines/fa3-fp8.md).
#pragma once

#include <cstdint>

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"

namespace qattn::ref {

enum class Fa3Scaling { amax, none };

struct Fa3Fp8Params {
  Fa3Scaling scaling = Fa3Scaling::amax;
  bool output_bf16 = true;
  int key_block = 0;    // kBlockN; 0: the kernel's tile size for the head dimension
  int query_tile = 0;   // kBlockM; 0: the kernel's tile size for the head dimension
  // The FlashAttention-3 paper's FP8 accuracy features (Sec. 3.3), not in the official kernel's call with per-tensor
  // descales: block quantisation (a descale per 128 queries of Q and per 128 keys of K; V stays per tensor) and
  // incoherent processing (Q and K times the same random-sign Hadamard matrix before quantising).
  bool block_quant = false;
  bool incoherent = false;
  std::uint64_t hadamard_seed = 0;
};

// The description of these steps for the one flash loop (flash_kernel.h). The kernel's tile sizes for FP8
// (tile_size_fwd_sm90 with element size 1, no paged KV, V row-major, no softcap) are fa3_fp8_key_block and
// fa3_fp8_query_tile there.
FlashKernel fa3_fp8_kernel(const Fa3Fp8Params& p);
// Step (1) in a description: Q, K and V as E4M3 codes per tensor (round to nearest even), each with its descale by
// `rule` (amax: fl32(amax / 448) in float32; one: cast as is). fa4-fp8 quantises its inputs the same way.
void fp8_tensor_inputs(FlashKernel& k, ScaleRule rule);

AttentionResult fa3_fp8_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                  const AttentionMask& mask, const Fa3Fp8Params& p);
// The same call prepared (Method::prepare): step (1) and K8's wgmma layout first, then any block of query rows.
std::unique_ptr<PreparedCall> prepare_fa3_fp8(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                              double scale, const AttentionMask& mask, const Fa3Fp8Params& p);

}  // namespace qattn::ref
