// An analysis as `qattn analyze` and the Python package's qattn.analyze run it: the methods resolved and built
// (on the engine the caller passes, through `build`), the KV and weight quantizers, and every method over a dump
// through evaluate_methods (qattn/eval/evaluate.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qattn/eval/evaluate.h"
#include "qattn/method.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/weight_quant.h"

namespace qattn::eval {

// Builds the method a spec names (for example qattn::build_method(spec, engine_options).method).
using MethodBuilder = std::function<std::unique_ptr<Method>(const MethodSpec&)>;

struct AnalysisPlan {
  bool softmax = false;  // softmax-only analysis of dumped logits
  SoftmaxReference reference = SoftmaxReference::fp64;
  std::vector<std::string> specs;  // as given (or the registry's defaults), one per method: its label in the results
  std::vector<std::unique_ptr<Method>> methods;
  std::vector<MethodTraits> traits;  // the registry's for its specs; a user's own method appended with its own
  std::unique_ptr<ref::KvQuantizer> kv;
  std::unique_ptr<ref::WeightQuantizer> wq;
};

// Resolves the methods (the registry's defaults when `specs` is empty: every method but the reference, fp64 too with
// the exact reference; for softmax-only analysis the softmax models only), the KV quantizer `kv` and the weight
// quantizer `weights` (empty: none). SpecError for a bad spec or a combination that has no meaning (a pipeline
// without softmax form in a softmax-only analysis, --kv or --weights with it, --weights with explicit_files).
// With defaults false, no spec means no method (a caller that adds its own methods to the plan).
AnalysisPlan plan_analysis(const std::vector<std::string>& specs, const std::string& kv, const std::string& weights,
                           bool softmax, SoftmaxReference reference, bool explicit_files, const MethodBuilder& build,
                           bool defaults = true);

// Every method of the plan over the dump, streamed (docs/streaming.md) with `options` (its kv is the plan's); with
// whole_calls every method runs on whole calls. Results in (layer, head) order, each head's methods in plan order.
std::vector<HeadResult> evaluate_plan(const std::vector<DumpLayer>& dump, const AnalysisPlan& plan, EvalOptions options,
                                      bool whole_calls = false);

}  // namespace qattn::eval
