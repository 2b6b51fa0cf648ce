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

void AnalysisPlan::add_own(std::string label, std::unique_ptr<Method> method, MethodTraits traits) {
  if (label.empty()) throw SpecError("a method of your own needs a label (the name its results carry)");
  for (const PlannedMethod& m : methods)
    if (m.label == label) throw SpecError("'" + label + "': the name of a method given twice");
  std::string canonical = label;
  methods.push_back({std::move(label), std::move(canonical), traits, std::move(method)});
}

bool AnalysisPlan::heads_independent() const {
  if (kv || wq) return false;
  for (const PlannedMethod& m : methods)
    if (!m.traits.heads_independent) return false;
  return true;
}

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
      if (e.in_default_lists && (!e.reference || reference == SoftmaxReference::exact)) specs.push_back(e.name);
  for (const auto& s : specs) {
    const MethodSpec spec = parse_method_spec(s);
    auto m = build(spec);
    if (softmax && !registry.find(spec.name)->has_softmax_form()) {
      if (defaults) continue;  // the default list holds the softmax models only
      throw SpecError("--method " + s + ": an attention pipeline has no softmax-only form; use a softmax model (" +
                      softmax_form_names() + ")");
    }
    plan.methods.push_back({s, registry.canonical(spec), registry.traits(spec), std::move(m)});
  }
  if (!kv.empty()) {
    if (softmax) throw SpecError("--kv quantizes K and V: it needs attention, not softmax-only analysis");
    try {
      plan.kv = ref::kv_registry().create(kv);
      plan.kv_canonical = ref::kv_registry().canonical(kv);
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
      plan.weights_canonical = ref::weight_registry().canonical(weights);
    } catch (const SpecError& e) {
      throw SpecError(std::string("--weights: ") + e.what());
    }
  }
  return plan;
}

std::vector<HeadResult> evaluate_plan(const std::vector<DumpLayer>& dump, const AnalysisPlan& plan, EvalOptions options) {
  std::vector<EvalMethod> methods;
  for (const PlannedMethod& m : plan.methods) {
    methods.push_back({m.method.get(), m.label, m.traits});
  }
  options.kv = plan.kv.get();
  std::vector<HeadResult> results = evaluate_methods(dump, methods, options);
  std::stable_sort(results.begin(), results.end(), [](const HeadResult& a, const HeadResult& b) {
    return std::make_pair(a.layer, a.head) < std::make_pair(b.layer, b.head);
  });
  return results;
}

}  // namespace qattn::eval
