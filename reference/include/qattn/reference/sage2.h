// SageAttention2 as a reference pipeline (docs/pipelines/sage2.md). One call, Q [L_q, d], K [L_k, d], V [L_k, d_v]:
//   (0) optional, for the paper's baselines (Sec. 4.1, Table 4): Q and K through a change of basis that keeps Q K^T,
//       in float64: hadamard (HadmdAttn, after QuaRot): x -> (x D) H / sqrt(d), D a diagonal of random signs from
//       hadamard-seed, H Sylvester's Hadamard matrix applied as the fast Walsh-Hadamard transform (d a power of 2);
//       smoothquant (SmoothQuant's rule): s_c = max|Q_c|^alpha / max|K_c|^(1 - alpha), Q_c / s_c, K_c s_c;
//       qserve (QServe's SmoothAttention, K alone): l_c = max|K_c|^alpha, K_c / l_c, Q_c l_c. A channel whose
//       maximum is 0 keeps scale 1. Maxima over every token, masked keys included.
//   (1) smoothing: K' = K - mean_tokens(K) (softmax-invariant: each row's logits shift by one constant);
//       optional Q' = Q - mean over each block of b_q tokens, with Delta S = mean_b(Q) K'^T (fp32) added back;
//       optional V' = V - mean_tokens(V), the mean added to O at the end (rows of P sum to 1)
//   (2) Q', K' quantised per group (sage_quant.h): INT8 or INT4, half-away or half-even
//   (3) S = fl32(fl32(A) * fl32(sQ_g sK_g scale)) + Delta S, A the exact integer dot products; masked pairs -inf
//   (4) online softmax over key blocks of 64: m_new = max(m, rowmax S_blk);
//       P~ = fl32(448 e^{S - m_new}) (e4m3: in (0, 448]; the upstream m shift by log2 448), the fp32 row sum l takes
//       P~ before it is rounded; then P8 = round(P~) to the P format (E4M3/E5M2 RNE saturating, INT8, or FP16)
//   (5) V per channel in the matching format: FP8 v8 = fp8(v 448 / amax_c) (57344 for E5M2), INT8 amax_c/127, FP16
//   (6) PV accumulation (docs/pipelines/sage2.md, docs/mma.md), one of
//       wgmma         the official Hopper kernel: per key block of 128 a fresh H100 FP8 wgmma accumulator (fused steps
//                     of 32 keys, h100-wgmma-e4m3), added in fp32 to the output after the rescale e^{m - m_new}
//       wgmma-single  one wgmma accumulator over the whole key loop, rescaled in fp32 between blocks
//       mma           per key block of 64 a fresh buffer through H100 FP8 mma.sync (h100-mma-e4m3, 32 keys each),
//                     added in fp32 to the output: the Ada kernel's layout on an H100
//       two-level     the per-product FP22 bound (per-product-fp22) in a fresh buffer per 64-key block
//       fp22          the per-product FP22 bound in one accumulator
//       fp32          float32 adds
//   (7) O = acc * (V channel scale) / l (+ mean V)
#pragma once

#include <cstdint>

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"
#include "qattn/reference/sage_quant.h"

namespace qattn::ref {

enum class SagePFormat { e4m3, e5m2, int8, fp16 };
enum class SageQkTransform { none, hadamard, smoothquant, qserve };
// ada_f16 / ada / ada_single: Ada's FP8 mma.sync (MMA-Sim's models) as SageAttention2's sm89 kernels use it for
// pv_accum_dtype fp32+fp16 (an f16 accumulator per 64-key block, V scaled to 2.25), fp32+fp32 (an f32 buffer per block)
// and fp32 (in place into the rescaled float32 output).
enum class SageAccumulation { wgmma, wgmma_single, mma, two_level_fp22, fp22, fp32, ada_f16, ada, ada_single };
// model: the steps above; sm90 / sm89: an official kernel's arithmetic (docs/pipelines/sage2.md).
enum class Sage2Kernel { model, sm90, sm89 };

struct Sage2Params {
  SageQkTransform qk_transform = SageQkTransform::none;  // step (0)
  double alpha = 0.5;                                    // smoothquant and qserve
  std::uint64_t hadamard_seed = 0;                       // hadamard: the signs D, from std::mt19937_64(seed)
  bool smooth_k = true, smooth_q = false, smooth_v = false;
  SageGranularity granularity = SageGranularity::thread;
  int qk_bits = 8;
  SageRounding rounding = SageRounding::half_away;
  SagePFormat p_format = SagePFormat::e4m3;
  SageAccumulation accumulation = SageAccumulation::wgmma;
  int kv_block = 0;  // keys per online-softmax block; 0: 128 for the wgmma choices (CTA_K of the sm90 kernel), else 64

  int key_block() const {
    if (kv_block > 0) return kv_block;
    return accumulation == SageAccumulation::wgmma || accumulation == SageAccumulation::wgmma_single ? 128 : 64;
  }
  SageGroupSizes groups;
  // An official kernel's arithmetic instead of the steps above (docs/pipelines/sage2.md, "sage2@sm90", "sage2@sm89"):
  // per-thread groups quantised in float32 (sm90: BLKQ 64, WARPQ 16, BLKK 128, WARPK 128; sm89: the default groups),
  // base 2 with sm_scale log2 e in float32, the max of fma(S, s2, -8.807), the mma row-sum layout, V per channel in
  // float32 (sm89 fp32+fp16: scaled to 2.25), O times fl32(1 / l) then the V scale; keys in blocks of 128 (sm90,
  // wgmma) or 64 (sm89, Ada's mma.sync).
  Sage2Kernel kernel = Sage2Kernel::model;
  KernelFormat output = KernelFormat::fp32;  // O as stored: fp32, fp16 or bf16
};

// The description of these steps for the one flash loop (flash_kernel.h). SpecError for an accumulation the P
// format cannot take (wgmma, wgmma-single and mma need p=e4m3).
FlashKernel sage2_kernel(const Sage2Params& p);

// Step (0) alone: q and k in place through p.qk_transform (nothing for none). InputError for hadamard with a head
// dimension that is not a power of 2, or a channel scale that overflows.
void sage2_transform_qk(RowMatrixXd& q, RowMatrixXd& k, const Sage2Params& p);

AttentionResult sage2_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage2Params& p);
// The same call prepared (Method::prepare): steps (1), (2) and (5) over the whole tensors first, then any block of
// query rows; sage2_attention is this with one block of every row, so the two agree by construction. q, k, v and
// mask must outlive the returned call.
std::unique_ptr<PreparedCall> prepare_sage2(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                            double scale, const AttentionMask& mask, const Sage2Params& p);

}  // namespace qattn::ref
