// The "fa3-fp8" method: FlashAttention-3's FP8 forward pass in the registry (docs/pipelines/fa3-fp8.md).
#include "qattn/error.h"
#include "qattn/reference/fa3_fp8.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

FlashKernel kernel_from_params(const ParamMap& m) {
  Fa3Fp8Params p;
  p.scaling = e4m3_amax_scaling(m) ? Fa3Scaling::amax : Fa3Scaling::none;
  p.output_bf16 = output_rounded(m, kBf16Outputs);
  p.key_block = static_cast<int>(m.integer("kv-block"));
  p.block_quant = m.boolean("block-quant");
  p.incoherent = m.boolean("incoherent");
  p.hadamard_seed = static_cast<std::uint64_t>(m.integer("hadamard-seed"));
  if (p.key_block % 32 != 0)
    throw SpecError("method 'fa3-fp8': kv-block must be a multiple of 32 (the wgmma's k), or 0");
  return fa3_fp8_kernel(p);
}

}  // namespace

// Traits: the description's (E4M3 K and V: 8 bits; per-tensor scales span every key, masked ones too; key blocks run
// last first, so key order changes the bits; E4M3 codes and descales in prepare()'s first pass, query tiles from
// absolute rows).
void register_fa3_fp8_method(Registry& registry) {
  MethodEntry e = flash_pipeline_entry(kernel_from_params);
  e.name = "fa3-fp8";
  e.summary = "FlashAttention-3 FP8 forward: E4M3 Q/K/V with descale factors, S and P V on the H100's FP8 wgmma, "
              "FP8 P in (0, 256], one accumulator over the key loop (last key block first)";
  e.params = {
      e4m3_scale_param("how Q, K, V become E4M3: amax = per tensor, descale amax/448 (round to nearest even); none = "
                       "cast as is (descale 1; |x| >= 464 refused)"),
      output_dtype_param(kBf16Outputs, "O as stored: bf16 (the kernel's output dtype) or fp32 (before the store)"),
      {"kv-block", ParamType::integer, "0", "keys per block (kBlockN); 0: the kernel's tile for the head dim", {}, 0, 4096},
      {"block-quant", ParamType::boolean, "false",
       "the paper's block quantisation (FlashAttention-3 Sec. 3.3): a descale per 128 queries of Q and per 128 keys of "
       "K (V per tensor); the running max is then of fma(S, s2, -8)"},
      {"incoherent", ParamType::boolean, "false",
       "the paper's incoherent processing: Q and K times one random-sign Hadamard matrix (d a power of 2) before FP8"},
      {"hadamard-seed", ParamType::integer, "0", "incoherent: seed of std::mt19937_64 for the signs", {}, 0, 1 << 30},
  };
  e.presets = {
      {"paper", {{"block-quant", "true"}, {"incoherent", "true"}},
       "FlashAttention-3's FP8 with the paper's block quantisation and incoherent processing (Sec. 3.3), on the "
       "official kernel's other parts; not validated by measured vectors: the official kernel takes per-tensor "
       "descales"},
  };
  e.overflow_note = kE4m3InputsOverflowNote;
  e.doc = "docs/pipelines/fa3-fp8.md";
  registry.add(std::move(e));
}

}  // namespace qattn::ref
