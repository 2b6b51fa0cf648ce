#include "qattn/reference/sage1.h"

namespace qattn::ref {

FlashKernel sage1_kernel(const Sage1Params& p) {
  FlashKernel k;
  k.name = "sage1";
  k.qk.format = KernelFormat::int8;
  k.qk.granularity = SageGranularity::block;
  k.qk.groups.block_q = p.block_q;
  k.qk.groups.block_k = p.block_k;
  k.qk.scale = ScaleRule::amax;
  k.qk.arith = ScaleArith::f32;
  k.qk.rounding = QuantRounding::half_away;
  k.qk.smooth_k = p.smooth_k;
  k.v.format = KernelFormat::fp16;
  k.v.scale = VScale::none;
  exp2_softmax(k, ScaleAt::q);
  k.softmax.row_sum_update = RowSumUpdate::block;
  k.p.format = KernelFormat::fp16;
  const bool f16 = p.accumulation == Sage1Accumulation::f16;
  k.pv.unit = f16 ? PvUnit::h100_hmma_f16_acc16 : PvUnit::fp32;
  k.pv.promote_keys = f16 ? p.block_k : 0;
  k.keys.block = p.block_k;
  k.keys.pad = p.pad_upstream ? KeyPad::zeros : KeyPad::masked;
  k.output.finalize = Finalize::divide;
  k.output.format = p.output_fp16 ? KernelFormat::fp16 : KernelFormat::fp32;
  return k;
}

AttentionResult sage1_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage1Params& p) {
  return flash_attention(q, k, v, scale, mask, sage1_kernel(p));
}

std::unique_ptr<PreparedCall> prepare_sage1(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                            double scale, const AttentionMask& mask, const Sage1Params& p) {
  return prepare_flash(q, k, v, scale, mask, sage1_kernel(p));
}

}  // namespace qattn::ref
