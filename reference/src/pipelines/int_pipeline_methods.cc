// The "quant-only" and "intattention" methods: the integer attention pipelines in the registry.
#include "qattn/error.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

// Attention pipelines have no softmax-only form: the softmax is the "index" method.
class PipelineMethod : public Method {
 public:
  RowMatrixXd softmax_rows_impl(const MatrixView&) const override {
    throw SpecError("an attention pipeline has no softmax-only form; use the softmax model (e.g. 'index', 'fp32')");
  }
};

class QuantOnlyMethod final : public PipelineMethod {
 public:
  explicit QuantOnlyMethod(QuantOnlySoftmax s) : softmax_(s) {}
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                            const AttentionMask& mask) const override {
    return quant_only_attention(q, k, v, scale, mask, softmax_);
  }
  std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                             double scale, const AttentionMask& mask) const override {
    return prepare_quant_only(q, k, v, scale, mask, softmax_);
  }

 private:
  QuantOnlySoftmax softmax_;
};

class IntAttentionMethod final : public PipelineMethod {
 public:
  explicit IntAttentionMethod(IntAttentionSettings s) : p_(s.softmax), eval_(s.cint_eval), groups_(s.groups), qround_(s.qround) {}
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                            const AttentionMask& mask) const override {
    return int_attention(q, k, v, scale, mask, p_, eval_, groups_, qround_);
  }
  std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                             double scale, const AttentionMask& mask) const override {
    return prepare_int_attention(q, k, v, scale, mask, p_, eval_, groups_, qround_);
  }

 private:
  IndexSoftmaxParams p_;
  CintEvaluation eval_;
  IntAttentionGroups groups_;
  Int8Rounding qround_;
};

constexpr Choice<QuantOnlySoftmax> kQuantOnlySoftmax[] = {{"ref", QuantOnlySoftmax::reference},
                                                          {"lanes16", QuantOnlySoftmax::lanes16}};
constexpr Choice<CintEvaluation> kCintEvaluations[] = {{"f64", CintEvaluation::f64}, {"f32", CintEvaluation::f32_upstream}};
constexpr Choice<VGroup> kVGroups[] = {
    {"tensor", VGroup::tensor}, {"channel", VGroup::channel}, {"key-block", VGroup::key_block}};
constexpr Choice<GroupMax> kGroupMax[] = {{"global", GroupMax::global}, {"offset", GroupMax::offset}};
constexpr Choice<Int8Rounding> kQRoundings[] = {{"rne", Int8Rounding::rne}, {"floor", Int8Rounding::floor}};

MethodEntry quant_only_entry() {
  MethodEntry e{"quant-only",
          "Quant-Only INT8 baseline: INT8 Q/K/V, INT32 QK^T, dequantise, fp32 softmax, INT8 P = round(127 p), INT32 PV",
          {{"softmax", ParamType::choice, "ref",
            "fp32 softmax: ref (std::exp, pairwise sum) or lanes16 (the fast path's exp_f32_poly and 16-lane sum)",
            choice_names(kQuantOnlySoftmax)}},
          {},
          [](const ParamMap& m) -> std::unique_ptr<Method> {
            return std::make_unique<QuantOnlyMethod>(quant_only_softmax(m));
          }};
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "INT32 Q K^T dequantised to float32 logits; an entry beyond 3.4e38 is refused";
  e.kind = MethodKind::attention_pipeline;
  e.doc = "docs/pipelines/quant-only.md";
  // Per-tensor INT8 scales over every key, masked ones included. An FP softmax sum reordered can move one P code by
  // 1 (1/127 of a value). The per-tensor Q scale is prepare()'s first pass; the rest is row by row.
  e.traits = fixed_traits({.rows_independent = false,
                           .key_order_tolerance = 2.0 / 127,
                           .masked_keys_dropped = false,
                           .kv_bits = 8,
                           .query_block_rows = 64});
  return e;
}

MethodEntry intattention_entry() {
  MethodEntry e;
  e.name = "intattention";
  e.summary = "IntAttention: INT8 Q/K/V (per tensor), INT32 QK^T, IndexSoftmax to UINT8/INT8 P, INT32 PV, dequantise";
  e.params = index_softmax_param_infos();
  e.params.push_back({"cint-eval", ParamType::choice, "f64",
                      "c_int evaluated as c/(sQ sK scale) in double, or ((c/sQ)/sK)/scale in float32 (upstream sim)",
                      choice_names(kCintEvaluations)});
  e.params.push_back({"q-group", ParamType::integer, "0",
                      "Q scale per group of this many query rows, each with its own c_int (1 = per token, 0 = per tensor)",
                      {}, 0, 1e15});
  e.params.push_back({"k-group", ParamType::integer, "0",
                      "K scale per block of this many keys, clipped per block (Eq. 16-18; 0 = per tensor)", {}, 0, 1e15});
  e.params.push_back({"group-max", ParamType::choice, "global",
                      "row maximum across key blocks: global (mu carried into each block's grid) or offset (block "
                      "maximum plus a table offset)",
                      choice_names(kGroupMax)});
  e.params.push_back({"v-group", ParamType::choice, "tensor",
                      "V scale per tensor, per channel, or per key block (key-block needs k-group)",
                      choice_names(kVGroups)});
  e.params.push_back({"qround", ParamType::choice, "rne",
                      "INT8 codes of Q, K, V: rne (official simulation) or floor (Eq. 3 as printed; @paper)",
                      choice_names(kQRoundings)});
  e.presets = index_softmax_presets();
  for (PresetInfo& p : e.presets)
    if (p.name == "upstream-sim") p.values["cint-eval"] = "f32";
  for (PresetInfo& p : e.presets) p.values["qround"] = p.name == "paper" ? "floor" : "rne";
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    return std::make_unique<IntAttentionMethod>(intattention_settings(m));
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "INT8 Q/K/V and INT32 Q K^T (exact); only the logit scale alpha = s_Q s_K scale (float64, or c / alpha in float32 with cint-eval=f32, as in @upstream-sim) can leave its format, and is then refused";
  e.kind = MethodKind::attention_pipeline;
  e.doc = "docs/pipelines/intattention.md";
  // Integer sums throughout: reordering keys changes nothing, unless K (or V) has a scale per block of keys. Per-tensor
  // and per-block K and V scales count masked keys too. Q's scales (per tensor or group) and every c_int in
  // prepare()'s first pass.
  e.traits = [](const ParamMap& m) {
    return MethodTraits{.rows_independent = false,
                        .key_order_tolerance = m.integer("k-group") > 0 ? std::nullopt : std::optional<double>(0.0),
                        .masked_keys_dropped = false,
                        .kv_bits = 8,
                        .query_block_rows = 64};
  };
  return e;
}

}  // namespace

IntAttentionSettings intattention_settings(const ParamMap& m) {
  IntAttentionSettings s;
  s.softmax = index_softmax_params(m);
  s.cint_eval = choice_value(m, "cint-eval", kCintEvaluations);
  s.groups.q_rows = m.integer("q-group");
  s.groups.k_rows = m.integer("k-group");
  s.groups.group_max = choice_value(m, "group-max", kGroupMax);
  s.groups.v = choice_value(m, "v-group", kVGroups);
  if (s.groups.v == VGroup::key_block && s.groups.k_rows == 0)
    throw SpecError("intattention: v-group=key-block needs K in key blocks (set k-group=N, N >= 1)");
  s.qround = choice_value(m, "qround", kQRoundings);
  return s;
}

QuantOnlySoftmax quant_only_softmax(const ParamMap& m) { return choice_value(m, "softmax", kQuantOnlySoftmax); }

void register_int_pipeline_methods(Registry& registry) {
  registry.add(quant_only_entry());
  registry.add(intattention_entry());
}

}  // namespace qattn::ref
