// The "sage3" method: SageAttention3's NVFP4 attention in the registry (docs/pipelines/sage3.md).
#include "qattn/reference/method_entries.h"
#include "qattn/reference/sage3.h"

namespace qattn::ref {
namespace {

constexpr Choice<bool> kQk[] = {{"nvfp4", false}, {"mxfp4", true}};

FlashKernel kernel_from_params(const ParamMap& m) {
  Sage3Params p;
  p.per_block_mean = m.boolean("per-block-mean");
  p.output_bf16 = output_rounded(m, kBf16Outputs);
  p.qk_mxfp4 = choice_value(m, "qk", kQk);
  return sage3_kernel(p);
}

}  // namespace

void register_sage3_method(Registry& registry) {
  MethodEntry e = flash_pipeline_entry(kernel_from_params);
  e.name = "sage3";
  e.summary = "SageAttention3: smoothed K and Q (Delta S as the MMA's C), NVFP4 Q, K, P~ and V (E2M1, E4M3 scales per "
              "16), P~'s two-level scaling (row top at 448 x 6, then per 16 keys), S and P V on the block-scaled FP4 "
              "step (MMA-Sim's model, not measured here)";
  e.params = {
      {"per-block-mean", ParamType::boolean, "true",
       "Q smoothing: the mean of each block of 128 queries (api.py's default) or one mean over every query"},
      output_dtype_param(kBf16Outputs, "O as stored: bf16 (the kernel's output for bf16 inputs) or fp32"),
      {"qk", ParamType::choice, "nvfp4",
       "Q and K: nvfp4 (E4M3 scale per 16 channels, the kernel's) or mxfp4 (OCP MX: UE8M0 scale 2^(floor(log2 amax) "
       "- 2) per 32 channels, S on b200-mxf4; AMD's MXFP4 scaling, for comparison)",
       choice_names(kQk)},
  };
  e.overflow_note = "Q, K, V read as float32 (beyond it refused); S s2 beyond float32 is refused";
  e.doc = "docs/pipelines/sage3.md";
  // The description's traits, but K and V at NVFP4's 4.5 bits (4 and an E4M3 scale per 16) for either qk; the means
  // and codes are the call's (prepare).
  e.traits = fixed_traits({.rows_independent = false,
                           .key_order_tolerance = std::nullopt,
                           .masked_keys_dropped = false,
                           .kv_bits = 4.5,
                           .query_block_rows = 64});
  registry.add(std::move(e));
}

}  // namespace qattn::ref
