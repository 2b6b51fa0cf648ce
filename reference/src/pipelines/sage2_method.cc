// The "sage2" method: SageAttention2 in the registry.
#include "qattn/error.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/sage2.h"

namespace qattn::ref {
namespace {

constexpr Choice<SageGranularity> kSageGranularities[] = {
    {"tensor", SageGranularity::tensor}, {"block", SageGranularity::block}, {"warp", SageGranularity::warp},
    {"thread", SageGranularity::thread}, {"token", SageGranularity::token}};
constexpr Choice<SageRounding> kRoundings[] = {{"away", SageRounding::half_away}, {"even", SageRounding::half_even}};
constexpr Choice<SageQkTransform> kQkTransforms[] = {{"none", SageQkTransform::none},
                                                    {"hadamard", SageQkTransform::hadamard},
                                                    {"smoothquant", SageQkTransform::smoothquant},
                                                    {"qserve", SageQkTransform::qserve}};
constexpr Choice<SagePFormat> kPFormats[] = {{"e4m3", SagePFormat::e4m3}, {"e5m2", SagePFormat::e5m2},
                                            {"int8", SagePFormat::int8}, {"fp16", SagePFormat::fp16}};
// "auto" is not in the table: wgmma for E4M3 P and V, the per-product FP22 bound (two-level) for the other formats,
// which no FP8 tensor-core instruction takes.
constexpr Choice<SageAccumulation> kAccumulations[] = {
    {"wgmma", SageAccumulation::wgmma},      {"wgmma-single", SageAccumulation::wgmma_single},
    {"mma", SageAccumulation::mma},          {"two-level", SageAccumulation::two_level_fp22},
    {"fp22", SageAccumulation::fp22},        {"fp32", SageAccumulation::fp32},
    {"ada-f16", SageAccumulation::ada_f16},  {"ada", SageAccumulation::ada},
    {"ada-single", SageAccumulation::ada_single}};
constexpr Choice<Sage2Kernel> kKernels[] = {{"model", Sage2Kernel::model}, {"sm90", Sage2Kernel::sm90},
                                            {"sm89", Sage2Kernel::sm89}};
constexpr Choice<KernelFormat> kOutputs[] = {
    {"fp32", KernelFormat::fp32}, {"fp16", KernelFormat::fp16}, {"bf16", KernelFormat::bf16}};

std::vector<std::string> accumulation_names() {
  std::vector<std::string> names{"auto"};
  for (const std::string& n : choice_names(kAccumulations)) names.push_back(n);
  return names;
}

std::vector<ParamInfo> sage2_param_infos() {
  return {
      {"qk-transform", ParamType::choice, "none",
       "Q and K through a change of basis that keeps Q K^T, before smoothing (the paper's baselines): hadamard "
       "(HadmdAttn: random signs, then the normalised Walsh-Hadamard transform), smoothquant (s = max|Q_c|^alpha / "
       "max|K_c|^(1-alpha)), qserve (K_c / max|K_c|^alpha, Q_c times it)",
       choice_names(kQkTransforms)},
      {"alpha", ParamType::real, "0.5", "smoothquant and qserve: the migration strength", {}, 0, 1},
      {"hadamard-seed", ParamType::integer, "0", "hadamard: seed of std::mt19937_64 for the signs", {}, 0, 1 << 30},
      {"smooth-k", ParamType::boolean, "true", "subtract the token mean of K (softmax-invariant)"},
      {"smooth-q", ParamType::boolean, "false", "subtract each Q block's mean, add Delta S = mean(Q) K^T back"},
      {"smooth-v", ParamType::boolean, "false", "subtract the token mean of V, add it to O"},
      {"gran", ParamType::choice, "thread", "Q/K scale groups", choice_names(kSageGranularities)},
      {"qk", ParamType::integer, "8", "Q/K bits: 4 or 8", {}, 4, 8},
      {"round", ParamType::choice, "away", "Q/K rounding: away (upstream Triton) or even (upstream CUDA)",
       choice_names(kRoundings)},
      {"p", ParamType::choice, "e4m3", "P~ and V format", choice_names(kPFormats)},
      {"kernel", ParamType::choice, "model",
       "model: the steps of docs/pipelines/sage2.md (base e, float64 quantiser); sm90 / sm89: the official Hopper / "
       "Ada kernel's arithmetic (qk_int_sv_f8_cuda_sm90 / sm89: its groups, float32 quantiser, base 2, the mma "
       "row-sum layout, O times 1 / l then the V scale). sm90 takes qk=8, acc=wgmma (or auto) and no qk-transform; "
       "sm89 qk=8 or 4 (the template's INT4 branch) and acc=ada-f16 (or auto), ada or ada-single; both p=e4m3, "
       "gran=thread, round=away and no smooth-q or smooth-v",
       choice_names(kKernels)},
      {"out", ParamType::choice, "fp32", "O as stored: fp32, or fp16 / bf16 (the kernels' output dtype, the input's)",
       choice_names(kOutputs)},
      {"acc", ParamType::choice, "auto",
       "PV accumulation (docs/mma.md): wgmma = H100 FP8 wgmma, a fresh accumulator per 128-key block added to fp32 "
       "(the official Hopper kernel); wgmma-single = one wgmma accumulator; mma = H100 FP8 mma.sync per 64-key block; "
       "two-level / fp22 = the per-product FP22 bound per block / in one accumulator; fp32; ada-f16 = Ada's FP8 "
       "mma.sync into an f16 accumulator per 64-key block, V scaled to 2.25 (sm89's fp32+fp16), ada = into an f32 "
       "buffer per block (fp32+fp32), ada-single = into the rescaled output (fp32): MMA-Sim's models, not measured "
       "here; auto = wgmma for p=e4m3 (ada-f16 with kernel=sm89), else two-level",
       accumulation_names()},
  };
}

using PresetValues = std::map<std::string, std::string>;

// `base` with the values of `more` set over it.
PresetValues with(PresetValues base, const PresetValues& more) {
  for (const auto& [key, value] : more) base[key] = value;
  return base;
}

// The presets come in families: the official kernels' settings (per-thread groups, E4M3 P~ and V, FP16 output), and
// the paper's steps on the model arithmetic; the paper's two baselines (Sec. 4.1) run on the sm89 INT4 kernel and on
// the model, each as the same change of basis of Q and K with no smoothing.
std::vector<PresetInfo> sage2_presets() {
  const PresetValues official = {{"gran", "thread"}, {"p", "e4m3"}, {"out", "fp16"}};
  const PresetValues sm89 = with(official, {{"kernel", "sm89"}, {"acc", "ada-f16"}});
  const PresetValues paper_steps = {{"gran", "thread"}, {"p", "e4m3"}, {"acc", "auto"}, {"smooth-q", "false"}};
  const PresetValues hadmdattn = {{"qk-transform", "hadamard"}, {"smooth-k", "false"}, {"qk", "4"}};
  const PresetValues smoothattn = {{"qk-transform", "qserve"}, {"alpha", "0.5"}, {"smooth-k", "false"}, {"qk", "4"}};
  const std::string sm89_not_modelled =
      "ex2.approx, rcp.approx, FP16 inputs, the dequantisation order of the last two blocks and the -5e6 mask "
      "constant are not modelled; the f16-accumulator unit is MMA-Sim's model as its code states it, with no vectors";
  const std::string paper = "the paper's steps on qattn's model arithmetic (base e, a float64 quantiser), not a GPU's "
                            "kernel: ";
  return {
      {"sm90", with(official, {{"kernel", "sm90"}, {"smooth-k", "true"}, {"qk", "8"}, {"acc", "wgmma"}}),
       "the official Hopper kernel (sageattn_qk_int8_pv_fp8_cuda_sm90, pv_accum_dtype fp32+fp32) as it computes: every "
       "part read from its code (docs/pipelines/sage2.md); ex2.approx, rcp.approx, FP16 inputs and the masked last "
       "block's dequantisation order are not modelled"},
      {"sm89", with(sm89, {{"smooth-k", "true"}, {"qk", "8"}}),
       "the official Ada kernel as sageattn() calls it on sm89 (sageattn_qk_int8_pv_fp8_cuda, pv_accum_dtype "
       "fp32+fp16): every part read from its code (docs/pipelines/sage2.md); " + sm89_not_modelled},
      {"sm89-int4", with(sm89, {{"smooth-k", "true"}, {"qk", "4"}}),
       "the sm89 kernel template's INT4 Q K^T branch (mma m16n8k64 s4) with the per-thread INT4 quantiser "
       "(amax / 7 + 1e-7): no official Python call reaches it; otherwise as @sm89"},
      {"sm89-hadmdattn", with(sm89, hadmdattn),
       "the paper's HadmdAttn baseline (Sec. 4.1, after QuaRot) on the sm89 INT4 kernel: a random Hadamard rotation "
       "of Q and K, no smoothing"},
      {"sm89-smoothattn", with(sm89, smoothattn),
       "the paper's SmoothAttn baseline (Sec. 4.1, 'following QServe', alpha = 0.5) on the sm89 INT4 kernel: "
       "max|K_c|^0.5 moved from K to Q, no smoothing"},
      {"paper-8b", with(paper_steps, {{"smooth-k", "true"}, {"qk", "8"}}),
       paper + "SageAttention2-8b: smooth K, per-thread INT8 (sm89's groups), E4M3 P~/V, the H100 wgmma accumulator "
               "per 128-key block"},
      {"paper-4b", with(paper_steps, {{"smooth-k", "true"}, {"smooth-q", "true"}, {"qk", "4"}}),
       paper + "SageAttention2-4b: smooth Q and K, per-thread INT4, E4M3 P~/V, the H100 wgmma accumulator per "
               "128-key block"},
      {"paper-hadmdattn", with(paper_steps, hadmdattn),
       paper + "the HadmdAttn baseline (Sec. 4.1, after QuaRot): a random Hadamard rotation of Q and K before "
               "per-thread INT4, no smoothing, then sage2's E4M3 P~/V (the paper does not say what follows the INT4 "
               "Q K^T)"},
      {"paper-smoothattn", with(paper_steps, smoothattn),
       paper + "the SmoothAttn baseline (Sec. 4.1, 'following QServe', alpha = 0.5): QServe's SmoothAttention scale "
               "max|K_c|^0.5 moved from K to Q before per-thread INT4, no smoothing, then sage2's E4M3 P~/V"},
      // The spellings before the presets were named after the kernels they match: one release as aliases.
      {"8b", {}, "", "sm90"},
      {"4b", {}, "", "sm89-int4"},
      {"hadmdattn", {}, "", "sm89-hadmdattn"},
      {"smoothattn", {}, "", "sm89-smoothattn"},
  };
}

// The parameters as resolved; acc=auto picks wgmma for E4M3 P~ and V (ada-f16 on the sm89 kernel), else the
// per-product FP22 bound.
Sage2Params sage2_params(const ParamMap& m) {
  Sage2Params p;
  p.qk_transform = choice_value(m, "qk-transform", kQkTransforms);
  p.alpha = m.real("alpha");
  p.hadamard_seed = static_cast<std::uint64_t>(m.integer("hadamard-seed"));
  p.smooth_k = m.boolean("smooth-k");
  p.smooth_q = m.boolean("smooth-q");
  p.smooth_v = m.boolean("smooth-v");
  p.granularity = choice_value(m, "gran", kSageGranularities);
  p.qk_bits = static_cast<int>(m.integer("qk"));
  if (p.qk_bits != 4 && p.qk_bits != 8) throw SpecError("method 'sage2': qk must be 4 or 8");
  p.rounding = choice_value(m, "round", kRoundings);
  p.p_format = choice_value(m, "p", kPFormats);
  p.kernel = choice_value(m, "kernel", kKernels);
  if (m.choice("acc") == "auto")
    p.accumulation = p.p_format != SagePFormat::e4m3   ? SageAccumulation::two_level_fp22
                     : p.kernel == Sage2Kernel::sm89 ? SageAccumulation::ada_f16
                                                     : SageAccumulation::wgmma;
  else
    p.accumulation = choice_value(m, "acc", kAccumulations);
  p.output = choice_value(m, "out", kOutputs);
  return p;
}

// SpecError for what the official kernels do not take, and for an FP8 E4M3 accumulation with another P format.
void check_sage2_params(const Sage2Params& p, const ParamMap& m) {
  const bool common = p.p_format == SagePFormat::e4m3 && p.granularity == SageGranularity::thread &&
                      p.rounding == SageRounding::half_away && !p.smooth_q && !p.smooth_v;
  if (p.kernel == Sage2Kernel::sm90 && !(common && p.qk_bits == 8 && p.accumulation == SageAccumulation::wgmma &&
                                         p.qk_transform == SageQkTransform::none))
    throw SpecError("method 'sage2': kernel=sm90 runs the official Hopper kernel, which takes qk=8, p=e4m3, "
                    "acc=wgmma (or auto), gran=thread, round=away, smooth-q=false, smooth-v=false and "
                    "qk-transform=none");
  const bool ada = p.accumulation == SageAccumulation::ada_f16 || p.accumulation == SageAccumulation::ada ||
                   p.accumulation == SageAccumulation::ada_single;
  if (p.kernel == Sage2Kernel::sm89 && !(common && ada))
    throw SpecError("method 'sage2': kernel=sm89 runs the official Ada kernel, which takes acc=ada-f16 (or auto: "
                    "fp32+fp16), ada (fp32+fp32) or ada-single (fp32), p=e4m3, gran=thread, round=away, "
                    "smooth-q=false and smooth-v=false");
  if ((p.accumulation == SageAccumulation::wgmma || p.accumulation == SageAccumulation::wgmma_single ||
       p.accumulation == SageAccumulation::mma || ada) && p.p_format != SagePFormat::e4m3)
    throw SpecError("method 'sage2': acc=" + m.choice("acc") + " is an FP8 E4M3 instruction and needs p=e4m3 (for p=" +
                    m.choice("p") + " choose acc=two-level, fp22 or fp32)");
}

FlashKernel kernel_from_params(const ParamMap& m) {
  const Sage2Params p = sage2_params(m);
  check_sage2_params(p, m);
  return sage2_kernel(p);
}

}  // namespace

// Traits: the description's (K INT8 or INT4 and V in the P~/V format; K's scale groups follow the token order, so
// reordering keys regroups them; smoothing, Q/K codes and scales and V per channel in prepare()'s first pass).
void register_sage2_method(Registry& registry) {
  MethodEntry e = flash_pipeline_entry(kernel_from_params);
  e.name = "sage2";
  e.summary =
      "SageAttention2: smoothing, per-group INT4/INT8 Q/K, FP8 P~ and V, PV on the H100's FP8 wgmma accumulator";
  e.params = sage2_param_infos();
  e.presets = sage2_presets();
  e.overflow_note = "S = s_Q s_K (Q K^T) (+ Delta S) in float32; an entry beyond 3.4e38 is refused";
  e.doc = "docs/pipelines/sage2.md";
  registry.add(std::move(e));
}

}  // namespace qattn::ref
