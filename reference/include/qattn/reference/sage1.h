// SageAttention 1 as a reference pipeline (docs/pipelines/sage1.md), step by step as its official Triton code
// computes it (thu-ml/SageAttention v1: quant_per_block.py, attn_qk_int8_per_block*.py). One call, Q [L_q, d],
// K [L_k, d], V [L_k, d_v]:
//   (1) K' = K - mean_tokens(K) (smooth-k; softmax-invariant), in float64, then read as float32
//   (2) Q per block of 128 queries: x = fl32(fl32(Q) fl32(scale 1.44269504)) (the log2 e of the official code),
//       s_Q = fl32(max|x| / 127), code = trunc(fl32(fl32(x / s_Q) + 0.5 sign(x))) (half away from zero); K' per
//       block of 64 keys the same, without the factor
//   (3) S = fl32(fl32(A s_Q) s_K), A the exact integer dot products (base-2 logits); masked pairs -inf
//   (4) online softmax over key blocks of 64, first to last: m_new = max(m, rowmax S_blk), P~ = exp2(fl32(S -
//       m_new)) in float32, l = l exp2(m - m_new) + sum P~ (float32, in key order; l starts at 1 as upstream)
//   (5) P16 = binary16(P~), V16 = binary16(V) (round to nearest even); per key block a fresh FP16 accumulator: 4
//       fused steps of 16 keys on HMMA.16816.F16 (h100-hmma-f16-acc16, hmma_f16_acc16_step), then added to the
//       float32 output after its rescale: acc = acc exp2(m - m_new) + block (acc=f16; acc=fp32: float32 adds)
//   (6) O = fl32(acc / l); out=fp16: rounded to binary16 (the kernel's output dtype), or out=fp32
// pad=upstream: keys past the last multiple of 64 are loaded as zeros and not masked, as in the official
// non-causal kernel, so each counts as a logit of 0 in the row max and sum (with V = 0); pad=masked (default): they
// do not exist (the paper's softmax). exp2 is computed in float64 and rounded once to float32 (Triton's
// ex2.approx is not modelled).
#pragma once

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"

namespace qattn::ref {

enum class Sage1Accumulation { f16, fp32 };

struct Sage1Params {
  bool smooth_k = true;
  Sage1Accumulation accumulation = Sage1Accumulation::f16;
  bool output_fp16 = true;
  bool pad_upstream = false;
  int block_q = 128, block_k = 64;  // BLKQ, BLKK of the quantiser; block_k is also the kernel's BLOCK_N
};

// The description of these steps for the one flash loop (flash_kernel.h).
FlashKernel sage1_kernel(const Sage1Params& p);

AttentionResult sage1_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage1Params& p);
// The same call prepared (Method::prepare): steps (1), (2) and V16 first, then any block of query rows.
std::unique_ptr<PreparedCall> prepare_sage1(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                            double scale, const AttentionMask& mask, const Sage1Params& p);

}  // namespace qattn::ref
