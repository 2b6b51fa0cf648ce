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

// One method of a plan, resolved once: the name its results carry, its canonical spec, its traits and the method.
struct PlannedMethod {
  std::string label;      // the spec as given (or the registry's default name), or a user's own label
  std::string canonical;  // the registry's canonical spec (every parameter spelled out); a user's method: its label
  MethodTraits traits;    // the registry's for its spec; a user's method: its own (MethodTraits{}: whole calls)
  std::unique_ptr<Method> method;
};

struct AnalysisPlan {
  bool softmax = false;  // softmax-only analysis of dumped logits
  SoftmaxReference reference = SoftmaxReference::fp64;
  std::vector<PlannedMethod> methods;
  std::unique_ptr<ref::KvQuantizer> kv;
  std::unique_ptr<ref::WeightQuantizer> wq;
  std::string kv_canonical, weights_canonical;  // the quantizers' canonical specs; empty: none

  // Appends a user's own method; SpecError if `label` is empty or another method of the plan carries it.
  void add_own(std::string label, std::unique_ptr<Method> method, MethodTraits traits = {});
  // Whether every method's heads are independent (MethodTraits::heads_independent) and no quantizer looks across
  // heads: then a shard of the dump needs only its own heads (and, under grouped-query attention, their groups' K/V).
  bool heads_independent() const;
};

// Resolves the methods (the registry's defaults when `specs` is empty: every method but the reference, fp64 too with
// the exact reference; for softmax-only analysis the softmax models only), the KV quantizer `kv` and the weight
// quantizer `weights` (empty: none). SpecError for a bad spec or a combination that has no meaning (a pipeline
// without softmax form in a softmax-only analysis, --kv or --weights with it, --weights with explicit_files).
// With defaults false, no spec means no method (a caller that adds its own methods to the plan).
AnalysisPlan plan_analysis(const std::vector<std::string>& specs, const std::string& kv, const std::string& weights,
                           bool softmax, SoftmaxReference reference, bool explicit_files, const MethodBuilder& build,
                           bool defaults = true);

// Every method of the plan over the dump, streamed (docs/streaming.md) with `options` (its kv is the plan's).
// Results in (layer, head) order, each head's methods in plan order; a grouped-query layer's results are per query
// head. A method or quantizer that takes a layer's heads together (attention_heads: turbo's head-wise KV precision,
// flashq's nh) gets one entry per query head, a group's query heads the same K/V views: the K/V repeated per query
// head (Hugging Face's repeat_kv) without a copy, so its results are those of the dump with K/V files repeated.
std::vector<HeadResult> evaluate_plan(const std::vector<DumpLayer>& dump, const AnalysisPlan& plan, EvalOptions options);

}  // namespace qattn::eval
