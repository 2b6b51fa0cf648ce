// The "sage2" method: SageAttention2 in the registry.
#include "qattn/error.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/sage2.h"

namespace qattn::ref {
namespace {

class Sage2Method final : public Method {
 public:
  explicit Sage2Method(Sage2Params p) : p_(p) {}
  RowMatrixXd softmax_rows_impl(const MatrixView&) const override {
    throw SpecError("sage2 is an attention pipeline; it has no softmax-only form");
  }
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                            const AttentionMask& mask) const override {
    return sage2_attention(q, k, v, scale, mask, p_);
  }

 private:
  Sage2Params p_;
};

constexpr Choice<SageGranularity> kGranularities[] = {{"tensor", SageGranularity::tensor}, {"block", SageGranularity::block},
                                                     {"warp", SageGranularity::warp}, {"thread", SageGranularity::thread},
                                                     {"token", SageGranularity::token}};
constexpr Choice<SageRounding> kRoundings[] = {{"away", SageRounding::half_away}, {"even", SageRounding::half_even}};
constexpr Choice<SagePFormat> kPFormats[] = {{"e4m3", SagePFormat::e4m3}, {"e5m2", SagePFormat::e5m2},
                                            {"int8", SagePFormat::int8}, {"fp16", SagePFormat::fp16}};
constexpr Choice<SageAccumulation> kAccumulations[] = {{"two-level", SageAccumulation::two_level_fp22},
                                                      {"fp22", SageAccumulation::fp22}, {"fp32", SageAccumulation::fp32}};

}  // namespace

void register_sage2_method(Registry& registry) {
  MethodEntry e;
  e.name = "sage2";
  e.summary = "SageAttention2: smoothing, per-group INT4/INT8 Q/K, FP8 P~ and V, FP22 two-level PV accumulation";
  e.params = {
      {"smooth-k", ParamType::boolean, "true", "subtract the token mean of K (softmax-invariant)"},
      {"smooth-q", ParamType::boolean, "false", "subtract each Q block's mean, add Delta S = mean(Q) K^T back"},
      {"smooth-v", ParamType::boolean, "false", "subtract the token mean of V, add it to O"},
      {"gran", ParamType::choice, "thread", "Q/K scale groups", choice_names(kGranularities)},
      {"qk", ParamType::integer, "8", "Q/K bits: 4 or 8", {}, 4, 8},
      {"round", ParamType::choice, "away", "Q/K rounding: away (upstream Triton) or even (upstream CUDA)",
       choice_names(kRoundings)},
      {"p", ParamType::choice, "e4m3", "P~ and V format", choice_names(kPFormats)},
      {"acc", ParamType::choice, "two-level", "PV accumulation: two-level FP22, single FP22, or fp32",
       choice_names(kAccumulations)},
  };
  e.presets = {
      {"8b", {{"smooth-k", "true"}, {"smooth-q", "false"}, {"gran", "thread"}, {"qk", "8"}, {"p", "e4m3"}, {"acc", "two-level"}},
       "SageAttention2-8b: smooth K, per-thread INT8, E4M3 P~/V, two-level FP22"},
      {"4b", {{"smooth-k", "true"}, {"smooth-q", "true"}, {"gran", "thread"}, {"qk", "4"}, {"p", "e4m3"}, {"acc", "two-level"}},
       "SageAttention2-4b: smooth Q and K, per-thread INT4, E4M3 P~/V, two-level FP22"},
  };
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    Sage2Params p;
    p.smooth_k = m.boolean("smooth-k");
    p.smooth_q = m.boolean("smooth-q");
    p.smooth_v = m.boolean("smooth-v");
    p.granularity = choice_value(m, "gran", kGranularities);
    p.qk_bits = static_cast<int>(m.integer("qk"));
    if (p.qk_bits != 4 && p.qk_bits != 8) throw SpecError("method 'sage2': qk must be 4 or 8");
    p.rounding = choice_value(m, "round", kRoundings);
    p.p_format = choice_value(m, "p", kPFormats);
    p.accumulation = choice_value(m, "acc", kAccumulations);
    return std::make_unique<Sage2Method>(p);
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "S = s_Q s_K (Q K^T) (+ Delta S) in float32; an entry beyond 3.4e38 is refused";
  e.kind = MethodKind::attention_pipeline;
  e.doc = "docs/pipelines/sage2.md";
  // K's scale groups follow the token order (per block, warp, thread): reordering keys regroups them.
  e.traits = [](const ParamMap& m) {
    const double v = choice_value(m, "p", kPFormats) == SagePFormat::fp16 ? 16 : 8;  // K INT8/INT4, V in the P~/V format
    return MethodTraits{false, false, std::nullopt, false, (static_cast<double>(m.integer("qk")) + v) / 2};
  };
  registry.add(std::move(e));
}

}  // namespace qattn::ref
