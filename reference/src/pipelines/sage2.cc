#include "qattn/reference/sage2.h"

namespace qattn::ref {

namespace {

// The official sm90 and sm89 kernels (thu-ml/SageAttention; file and line for each part in docs/pipelines/sage2.md):
// the same quantiser, softmax and row sum, with the groups, key block and P V unit of each.
FlashKernel sage2_official_kernel(const Sage2Params& p) {
  const bool sm90 = p.kernel == Sage2Kernel::sm90;
  FlashKernel k;
  k.name = "sage2";
  k.qk.format = p.qk_bits == 4 ? KernelFormat::int4 : KernelFormat::int8;
  k.qk.granularity = SageGranularity::thread;
  // sm90: per_thread_int8(BLKQ=64, WARPQ=16, BLKK=128, WARPK=128); sm89: BLKQ 128, WARPQ 32, BLKK 64, WARPK 64
  k.qk.groups = sm90 ? SageGroupSizes{64, 128, 16, 128} : SageGroupSizes{128, 64, 32, 64};
  k.qk.scale = ScaleRule::amax_eps;                 // max|x| / qmax + 1e-7, float32 (Triton)
  k.qk.arith = ScaleArith::f32;
  k.qk.rounding = QuantRounding::half_away;
  k.qk.transform = static_cast<QkTransform>(p.qk_transform);  // sm89's baselines only (sage2@sm89-hadmdattn)
  k.qk.alpha = p.alpha;
  k.qk.hadamard_seed = p.hadamard_seed;
  k.qk.smooth_k = p.smooth_k;
  k.v.format = KernelFormat::e4m3;
  k.v.scale = VScale::channel;
  k.v.arith = ScaleArith::f32;  // v_scale = amax / max, v * (max / amax) (fused.cu MeanScaleKernel)
  k.v.max = p.accumulation == SageAccumulation::ada_f16 ? 2.25 : 0;  // core.py: quant_v_scale_max 2.25 for fp32+fp16
  exp2_softmax(k, ScaleAt::exp);
  k.softmax.max_rule = MaxRule::scaled;  // m = fmaf(max S, sm_scale, -8.807)
  k.softmax.scale_log2 = ScaleArith::f32;
  k.softmax.row_sum_threads = 4;
  k.softmax.row_sum_update = RowSumUpdate::running;
  k.softmax.row_sum_tile = RowSumTile::mma16;
  k.softmax.row_sum_combine = RowSumCombine::pairs_01_23;
  k.p.offset = 8.807;  // S_FP8_OFFSET (log2 448, as a float literal)
  k.p.format = KernelFormat::e4m3;
  k.keys.block = sm90 ? 128 : 64;  // CTA_K
  switch (p.accumulation) {
    case SageAccumulation::ada_f16: k.pv = {PvUnit::ada_mma_e4m3_acc16, 64}; break;  // fp32+fp16
    case SageAccumulation::ada: k.pv = {PvUnit::ada_mma_e4m3, 64}; break;            // fp32+fp32
    case SageAccumulation::ada_single: k.pv = {PvUnit::ada_mma_e4m3, 0}; break;      // fp32
    default: k.pv = {PvUnit::h100_wgmma_e4m3, 128}; break;                            // sm90: wgmma
  }
  k.output.finalize = Finalize::reciprocal_channel;
  k.output.format = p.output;
  return k;
}

}  // namespace

FlashKernel sage2_kernel(const Sage2Params& p) {
  if (p.kernel != Sage2Kernel::model) return sage2_official_kernel(p);
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
    case SageAccumulation::ada_f16: k.pv = {PvUnit::ada_mma_e4m3_acc16, k.keys.block}; break;
    case SageAccumulation::ada: k.pv = {PvUnit::ada_mma_e4m3, k.keys.block}; break;
    case SageAccumulation::ada_single: k.pv = {PvUnit::ada_mma_e4m3, 0}; break;
  }
  if (p.accumulation == SageAccumulation::ada_f16) k.v.max = 2.25;  // as the sm89 fp32+fp16 path scales V
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
