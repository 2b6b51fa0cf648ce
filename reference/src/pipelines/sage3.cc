#include "qattn/reference/sage3.h"

namespace qattn::ref {

FlashKernel sage3_kernel(const Sage3Params& p) {
  FlashKernel k;
  k.name = "sage3";
  k.qk.format = p.qk_mxfp4 ? KernelFormat::mxfp4 : KernelFormat::nvfp4;
  k.qk.unit = p.qk_mxfp4 ? SUnit::b200_mxf4 : SUnit::b200_nvf4;
  k.qk.granularity = SageGranularity::block;  // (unused: NVFP4 blocks run along the channels)
  k.qk.scale = ScaleRule::amax;
  k.qk.arith = ScaleArith::f32;
  k.qk.rounding = QuantRounding::half_even;
  k.qk.smooth_k = true;
  k.qk.smooth_q = true;
  k.qk.groups.block_q = p.per_block_mean ? 128 : 1 << 30;  // triton_group_mean's GROUP_SIZE, or one mean
  k.v.format = KernelFormat::nvfp4;
  k.v.scale = VScale::block16;
  k.v.arith = ScaleArith::f32;
  exp2_softmax(k, ScaleAt::exp);
  k.softmax.max_rule = MaxRule::raw;
  k.softmax.scale_log2 = ScaleArith::f64;  // api.cu: softmax_scale * M_LOG2E, a float times a double
  k.softmax.ref_rule = RefRule::fma;       // row_max * softmax_scale_log2 + fp8_scalexfp4_scale_log2, contracted
  k.softmax.row_sum_threads = 4;
  k.softmax.row_sum_update = RowSumUpdate::running;
  k.softmax.row_sum_tile = RowSumTile::octets32;
  k.softmax.row_sum_combine = RowSumCombine::pairs_01_23;  // shfl_xor 1, then 2
  k.p.offset = 11.392317422778762;  // -fp8_scalexfp4_scale_log2: log2(448 x 6), a float32 constant in the kernel
  k.p.format = KernelFormat::nvfp4;
  k.pv = {PvUnit::b200_nvf4, 128, true};  // a fresh accumulator per block, then rescale_o: O r + acc
  k.keys.block = 128;
  fa3_epilogue(k, p.output_bf16);
  return k;
}

}  // namespace qattn::ref
