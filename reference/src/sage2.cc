#include "qattn/reference/sage2.h"

namespace qattn::ref {

namespace {

// The official sm90 kernel (thu-ml/SageAttention; file and line for each part in docs/pipelines/sage2.md).
FlashKernel sage2_sm90_kernel(const Sage2Params& p) {
  FlashKernel k;
  k.name = "sage2";
  k.qk.format = KernelFormat::int8;
  k.qk.granularity = SageGranularity::thread;
  k.qk.groups = SageGroupSizes{64, 128, 16, 128};  // per_thread_int8(BLKQ=64, WARPQ=16, BLKK=128, WARPK=128)
  k.qk.scale = ScaleRule::amax_eps;                 // max|x| / 127 + 1e-7, float32 (Triton)
  k.qk.arith = ScaleArith::f32;
  k.qk.rounding = QuantRounding::half_away;
  k.qk.smooth_k = p.smooth_k;
  k.v.format = KernelFormat::e4m3;
  k.v.scale = VScale::channel;
  k.v.arith = ScaleArith::f32;  // v_scale = amax / 448, v * (448 / amax) (fused.cu MeanScaleKernel)
  k.softmax.scale_at = ScaleAt::exp;
  k.softmax.base = SoftmaxBase::two;
  k.softmax.exp = ExpImpl::f64_rounded;  // ex2.approx is not modelled
  k.softmax.max_rule = MaxRule::scaled;  // m = fmaf(max S, sm_scale, -8.807)
  k.softmax.scale_log2 = ScaleArith::f32;
  k.softmax.row_sum_threads = 4;
  k.softmax.row_sum_update = RowSumUpdate::running;
  k.softmax.row_sum_tile = RowSumTile::mma16;
  k.softmax.row_sum_combine = RowSumCombine::pairs_01_23;
  k.p.offset = 8.807;  // S_FP8_OFFSET (log2 448, as a float literal)
  k.p.format = KernelFormat::e4m3;
  k.keys.block = 128;  // CTA_K
  k.pv = {PvUnit::h100_wgmma_e4m3, 128};
  k.output.finalize = Finalize::reciprocal_channel;
  k.output.format = p.output;
  return k;
}

}  // namespace

FlashKernel sage2_kernel(const Sage2Params& p) {
  if (p.sm90) return sage2_sm90_kernel(p);
  FlashKernel k;
  k.name = "sage2";
  k.qk.format = p.qk_bits == 4 ? KernelFormat::int4 : KernelFormat::int8;
  k.qk.granularity = p.granularity;
  k.qk.groups = p.groups;
  k.qk.scale = ScaleRule::amax_eps;
  k.qk.arith = ScaleArith::f64;
  k.qk.rounding = p.rounding == SageRounding::half_away ? QuantRounding::half_away : QuantRounding::half_even;
  k.qk.transform = static_cast<QkTransform>(p.qk_transform);
  k.qk.alpha = p.alpha;
  k.qk.hadamard_seed = p.hadamard_seed;
  k.qk.smooth_k = p.smooth_k;
  k.qk.smooth_q = p.smooth_q;
  const KernelFormat f = p.p_format == SagePFormat::e4m3   ? KernelFormat::e4m3
                         : p.p_format == SagePFormat::e5m2 ? KernelFormat::e5m2
                         : p.p_format == SagePFormat::int8 ? KernelFormat::int8
                                                           : KernelFormat::fp16;
  k.v.format = f;
  k.v.scale = VScale::channel;
  k.v.smooth = p.smooth_v;
  k.softmax.scale_at = ScaleAt::dequant;
  k.softmax.base = SoftmaxBase::e;
  k.softmax.exp = ExpImpl::libm_f32;
  k.softmax.row_sum_update = RowSumUpdate::running;
  k.p.format = f;
  k.p.scale = f == KernelFormat::e4m3 ? 448 : f == KernelFormat::e5m2 ? 57344 : f == KernelFormat::int8 ? 127 : 1;
  k.keys.block = p.key_block();
  switch (p.accumulation) {
    case SageAccumulation::wgmma: k.pv = {PvUnit::h100_wgmma_e4m3, k.keys.block}; break;
    case SageAccumulation::wgmma_single: k.pv = {PvUnit::h100_wgmma_e4m3, 0}; break;
    case SageAccumulation::mma: k.pv = {PvUnit::h100_mma_e4m3, k.keys.block}; break;
    case SageAccumulation::two_level_fp22: k.pv = {PvUnit::fp22, k.keys.block}; break;
    case SageAccumulation::fp22: k.pv = {PvUnit::fp22, 0}; break;
    case SageAccumulation::fp32: k.pv = {PvUnit::fp32, 0}; break;
  }
  k.output.finalize = Finalize::f64;
  k.output.format = p.output;
  return k;
}

void sage2_transform_qk(RowMatrixXd& q, RowMatrixXd& k, const Sage2Params& p) {
  transform_qk(q, k, static_cast<QkTransform>(p.qk_transform), p.alpha, p.hadamard_seed, "sage2");
}

AttentionResult sage2_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage2Params& p) {
  return flash_attention(q, k, v, scale, mask, sage2_kernel(p));
}

std::unique_ptr<PreparedCall> prepare_sage2(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                            double scale, const AttentionMask& mask, const Sage2Params& p) {
  return prepare_flash(q, k, v, scale, mask, sage2_kernel(p));
}

}  // namespace qattn::ref
