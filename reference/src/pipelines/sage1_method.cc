// The "sage1" method: SageAttention 1 in the registry (docs/pipelines/sage1.md).
#include "qattn/reference/method_entries.h"
#include "qattn/reference/sage1.h"

namespace qattn::ref {
namespace {

constexpr Choice<Sage1Accumulation> kAccumulations[] = {{"f16", Sage1Accumulation::f16},
                                                        {"fp32", Sage1Accumulation::fp32}};
constexpr Choice<bool> kPads[] = {{"masked", false}, {"upstream", true}};

FlashKernel kernel_from_params(const ParamMap& m) {
  Sage1Params p;
  p.smooth_k = m.boolean("smooth-k");
  p.accumulation = choice_value(m, "acc", kAccumulations);
  p.output_fp16 = output_rounded(m, kFp16Outputs);
  p.pad_upstream = choice_value(m, "pad", kPads);
  return sage1_kernel(p);
}

}  // namespace

// Traits: the description's (K INT8 and V FP16: 12 bits; K's scales and blocks follow the token order, so reordering
// keys regroups them; smoothing, Q/K codes and scales and V16 in prepare()'s first pass).
void register_sage1_method(Registry& registry) {
  MethodEntry e = flash_pipeline_entry(kernel_from_params);
  e.name = "sage1";
  e.summary = "SageAttention 1: smoothed K, per-block INT8 Q/K, FP16 P and V, P V on HMMA with an FP16 accumulator "
              "per 64-key block";
  e.params = {
      {"smooth-k", ParamType::boolean, "true", "subtract the token mean of K (softmax-invariant)"},
      {"acc", ParamType::choice, "f16",
       "P V per 64-key block: f16 = HMMA.16816.F16, an FP16 accumulator (h100-hmma-f16-acc16) added to fp32; fp32 = "
       "float32 adds",
       choice_names(kAccumulations)},
      output_dtype_param(kFp16Outputs, "O as stored: fp16 (the kernel's output dtype) or fp32 (before the store)"),
      {"pad", ParamType::choice, "masked",
       "keys past the last multiple of 64: masked (the paper) or upstream (zeros with logit 0 in the row max and sum, "
       "as the official non-causal kernel)",
       choice_names(kPads)},
  };
  e.overflow_note = "Q, K beyond float32, V beyond binary16, S beyond float32 and a P V block beyond binary16 are "
                    "refused";
  e.doc = "docs/pipelines/sage1.md";
  registry.add(std::move(e));
}

}  // namespace qattn::ref
