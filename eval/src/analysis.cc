#include "qattn/eval/analysis.h"

#include <algorithm>

#include "qattn/error.h"
#include "qattn/reference/registry.h"

namespace qattn::eval {
namespace {

// The registry's methods with a softmax form, for messages: "fp64, fp32, ..., sas".
std::string softmax_form_names() {
  std::string s;
  for (const auto& e : ref::reference_registry().entries())
    if (e.has_softmax_form()) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

}  // namespace

AnalysisPlan plan_analysis(const std::vector<std::string>& given, const std::string& kv, const std::string& weights,
                           bool softmax, SoftmaxReference reference, bool explicit_files, const MethodBuilder& build,
                           bool use_defaults) {
  const Registry& registry = ref::reference_registry();
  AnalysisPlan plan;
  plan.softmax = softmax;
  plan.reference = reference;
  std::vector<std::string> specs = given;
  const bool defaults = specs.empty() && use_defaults;
  if (defaults)
    for (const auto& e : registry.entries())
      if (!e.reference || reference == SoftmaxReference::exact) specs.push_back(e.name);
  for (const auto& s : specs) {
    const MethodSpec spec = parse_method_spec(s);
    auto m = build(spec);
    if (softmax && !registry.find(spec.name)->has_softmax_form()) {
      if (defaults) continue;  // the default list holds the softmax models only
      throw SpecError("--method " + s + ": an attention pipeline has no softmax-only form; use a softmax model (" +
                      softmax_form_names() + ")");
    }
    plan.methods.push_back(std::move(m));
    plan.specs.push_back(s);
    plan.traits.push_back(registry.traits(spec));
  }
  if (!kv.empty()) {
    if (softmax) throw SpecError("--kv quantizes K and V: it needs attention, not softmax-only analysis");
    try {
      plan.kv = ref::kv_registry().create(kv);
    } catch (const SpecError& e) {
      throw SpecError(std::string("--kv: ") + e.what());
    }
  }
  if (!weights.empty()) {
    if (softmax || explicit_files)
      throw SpecError("--weights re-projects Q, K and V from a dump's attention input: it needs --tensors DIR and "
                      "attention, not --q/--k/--v or softmax-only analysis");
    try {
      plan.wq = ref::weight_registry().create(weights);
    } catch (const SpecError& e) {
      throw SpecError(std::string("--weights: ") + e.what());
    }
  }
  return plan;
}

std::vector<HeadResult> evaluate_plan(const std::vector<DumpLayer>& dump, const AnalysisPlan& plan, EvalOptions options,
                                      bool whole_calls) {
  std::vector<EvalMethod> methods;
  for (std::size_t m = 0; m < plan.methods.size(); ++m) {
    methods.push_back({plan.methods[m].get(), plan.specs[m], plan.traits.at(m)});
    if (whole_calls) methods.back().traits.query_block_rows = 0;
  }
  options.kv = plan.kv.get();
  std::vector<HeadResult> results = evaluate_methods(dump, methods, options);
  std::stable_sort(results.begin(), results.end(), [](const HeadResult& a, const HeadResult& b) {
    return std::make_pair(a.layer, a.head) < std::make_pair(b.layer, b.head);
  });
  return results;
}

}  // namespace qattn::eval
