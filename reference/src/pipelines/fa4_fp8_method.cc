// The "fa4-fp8" method: FlashAttention-4's FP8 forward pass in the registry (docs/pipelines/fa4-fp8.md).
#include "qattn/reference/fa4_fp8.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

constexpr Choice<Fa4Units> kUnits[] = {{"b200", Fa4Units::b200}, {"h100", Fa4Units::h100}};

FlashKernel kernel_from_params(const ParamMap& m) {
  Fa4Fp8Params p;
  p.scale_amax = e4m3_amax_scaling(m);
  p.output_bf16 = output_rounded(m, kBf16Outputs);
  p.rescale_threshold = m.real("rescale-threshold");
  p.ex2_emu_freq = static_cast<int>(m.integer("ex2-emu-freq"));
  p.units = choice_value(m, "units", kUnits);
  return fa4_fp8_kernel(p);
}

}  // namespace

// Traits: the description's (E4M3 K and V: 8 bits, per-tensor scales over every key, key blocks last first).
void register_fa4_fp8_method(Registry& registry) {
  MethodEntry e = flash_pipeline_entry(kernel_from_params);
  e.name = "fa4-fp8";
  e.summary = "FlashAttention-4 FP8 forward on a B200: E4M3 Q/K/V with descales, S and P V on tcgen05.mma "
              "(MMA-Sim's model, not measured here), max_offset 8, the max kept while it grows by <= 4, part of the "
              "exp2 by FA4's degree-3 polynomial";
  e.params = {
      e4m3_scale_param("how Q, K, V become E4M3: amax = per tensor, descale amax/448; none = cast as is (descale 1; "
                       "|x| >= 464 refused)"),
      output_dtype_param(kBf16Outputs, "O as stored: bf16 (the kernel's output dtype) or fp32"),
      {"rescale-threshold", ParamType::real, "4",
       "the running max is kept while a block's max exceeds it by at most this many exponent units (4: the FP8 "
       "setting of flash_fwd_sm100.py; 0: every growth rescales)", {}, 0, 64},
      {"ex2-emu-freq", ParamType::integer, "10",
       "the software exp2 on the pairs (k, k + 1) of each 32-key fragment with k mod F >= F - 4 (10: FA4's FP8 tuning "
       "for d = 128 without a mask; 16: its fallback; 0: none)", {}, 0, 32},
      {"units", ParamType::choice, "b200",
       "S's and P V's matrix units: b200 (tcgen05.mma kind::f8f6f4, MMA-Sim's model) or h100 (the H100's FP8 wgmma, "
       "measured): the same kernel on Hopper's units",
       choice_names(kUnits)},
  };
  e.presets = {
      {"exact-exp2", {{"ex2-emu-freq", "0"}}, "every exp2 by the hardware's unit (modelled correctly rounded)"},
      {"no-threshold", {{"rescale-threshold", "0"}},
       "the max follows every growth: P~ stays within 2^8 (the copy of the kernel that sets 0.0 for FP8)"},
  };
  e.overflow_note = kE4m3InputsOverflowNote;
  e.doc = "docs/pipelines/fa4-fp8.md";
  registry.add(std::move(e));
}

}  // namespace qattn::ref
