#include "qattn/reference/fa3_fp8.h"

namespace qattn::ref {

void fp8_tensor_inputs(FlashKernel& k, ScaleRule rule) {
  k.qk.format = KernelFormat::e4m3;
  k.qk.granularity = SageGranularity::tensor;
  k.qk.scale = rule;
  k.qk.arith = ScaleArith::f32;
  k.qk.rounding = QuantRounding::half_even;
  k.qk.smooth_k = false;
  k.v.format = KernelFormat::e4m3;
  k.v.scale = VScale::tensor;
  k.v.rule = rule;
  k.v.arith = ScaleArith::f32;
}

FlashKernel fa3_fp8_kernel(const Fa3Fp8Params& p) {
  FlashKernel k;
  k.name = "fa3-fp8";
  fp8_tensor_inputs(k, p.scaling == Fa3Scaling::amax ? ScaleRule::amax : ScaleRule::one);
  k.qk.unit = SUnit::h100_wgmma_e4m3;
  if (p.block_quant) {
    k.qk.granularity = SageGranularity::block;
    k.qk.groups.block_q = 128;
    k.qk.groups.block_k = 128;
    k.softmax.max_rule = MaxRule::scaled;  // an s2 per block pair: the max of fma(S, s2, -8)
  }
  if (p.incoherent) {
    k.qk.transform = QkTransform::hadamard;
    k.qk.hadamard_seed = p.hadamard_seed;
  }
  exp2_softmax(k, ScaleAt::exp);
  k.softmax.row_sum_threads = 4;
  k.softmax.row_sum_update = RowSumUpdate::block;
  k.p.offset = 8;  // Max_offset: P~ in (0, 2^8]
  k.p.format = KernelFormat::e4m3;
  k.pv = {PvUnit::h100_wgmma_e4m3, 0};
  k.keys.block = p.key_block;  // 0: the kernel's tile for the head dimension
  fa3_epilogue(k, p.output_bf16);
  return k;
}

AttentionResult fa3_fp8_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                  const AttentionMask& mask, const Fa3Fp8Params& p) {
  return flash_attention(q, k, v, scale, mask, fa3_fp8_kernel(p));
}

std::unique_ptr<PreparedCall> prepare_fa3_fp8(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                              double scale, const AttentionMask& mask, const Fa3Fp8Params& p) {
  return prepare_flash(q, k, v, scale, mask, fa3_fp8_kernel(p));
}

}  // namespace qattn::ref
