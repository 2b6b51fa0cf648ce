#include "qattn/reference/fa4_fp8.h"

#include "qattn/reference/fa3_fp8.h"

namespace qattn::ref {

FlashKernel fa4_fp8_kernel(const Fa4Fp8Params& p) {
  FlashKernel k;
  k.name = "fa4-fp8";
  fp8_tensor_inputs(k, p.scale_amax ? ScaleRule::amax : ScaleRule::one);  // step (1), as fa3-fp8
  k.qk.unit = p.units == Fa4Units::b200 ? SUnit::b200_tcgen05_e4m3 : SUnit::h100_wgmma_e4m3;
  exp2_softmax(k, ScaleAt::exp);
  k.softmax.scale_log2 = ScaleArith::f32;  // softmax_scale * LOG2_E inside the jitted call, float32
  k.softmax.rescale_threshold = p.rescale_threshold;
  k.softmax.ex2_emu_freq = p.ex2_emu_freq;
  k.softmax.ex2_emu_start = p.ex2_emu_start;
  k.softmax.row_sum_threads = 1;  // one thread holds a row of S (tcgen05.ld from tensor memory)
  k.softmax.row_sum_update = RowSumUpdate::running;
  k.softmax.row_sum_tile = RowSumTile::lanes8;
  k.p.offset = 8;  // max_offset for 1-byte Q
  k.p.format = KernelFormat::e4m3;
  k.pv = {p.units == Fa4Units::b200 ? PvUnit::b200_tcgen05_e4m3 : PvUnit::h100_wgmma_e4m3, 0};
  k.keys.block = 128;
  fa3_epilogue(k, p.output_bf16);
  return k;
}

}  // namespace qattn::ref
