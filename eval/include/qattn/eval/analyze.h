// One analysis end to end, as `qattn analyze` and the Python package's qattn.analyze run it: the request (what to
// read, which methods on which engine, the quantizers, the table's choices and the run's settings) planned, checked
// before any tensor is read, the dump loaded, every method evaluated against the reference (qattn/eval/analysis.h,
// evaluate.h), and the report rendered (report.h). The front ends parse their arguments into an AnalysisRequest and
// call run_analysis, or analysis_shard (qattn/eval/shard.h) for one shard's part file.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/eval/analysis.h"
#include "qattn/eval/evaluate.h"
#include "qattn/eval/report.h"

namespace qattn::eval {

// A method of the caller's own (a Python callable, a user's kernel), with the name its results carry.
struct OwnMethod {
  std::string label;
  std::unique_ptr<Method> method;
  MethodTraits traits;  // MethodTraits{}: whole calls, compared block by block
};

struct AnalysisRequest {
  // What is read: a dump (a directory, or one .npz / .safetensors file), or one head's explicit Q, K and V files, or
  // its explicit logits (softmax-only). Exactly one of the three is given.
  std::string tensors, q, k, v, logits;
  std::vector<std::string> specs;  // the registry's methods; empty: its defaults (plan_analysis), unless `own` is given
  std::vector<OwnMethod> own;      // the caller's own methods, after the registry's
  std::string kv, weights;         // the KV and weight quantizers' specs; empty: none
  bool softmax = false;            // softmax-only analysis of logits (implied by `logits`)
  SoftmaxReference reference = SoftmaxReference::fp64;
  MethodBuilder build;             // the engine the registry's methods run on (the engine's make_method)
  // The report: `format` md|csv|latex|json (empty: none rendered, the results only) with the table's choices. Where
  // `order` names each of the plan's methods exactly once, the table shows them in that order.
  std::string format;
  ReportOptions table;
  std::vector<std::string> order;
  // The run: workers over (head, block) items (0: every core, resolve_threads), rows per streamed block (0: chosen
  // from L_k), every method on whole calls; progress as EvalOptions'. `checkpoint` is called between the stages
  // (after the dump is read, after the weights are quantized), the last time just before the methods run: it may
  // throw to stop the run, or set `progress` afresh (a clock that starts with the evaluation).
  int threads = 0;
  Eigen::Index block_rows = 0;
  bool whole_calls = false;
  std::function<void(std::size_t done, std::size_t total)> progress;
  std::function<void()> checkpoint;
};

// What an analysis found: the per-head results (as evaluate_plan orders them), the report's view of the run, and
// the table in the request's format (empty when none was asked for).
struct AnalysisResult {
  std::vector<HeadResult> results;
  ReportView view;
  std::string text;
};

// A table choice (ReportOptions: summary, columns, order) that the request's report cannot show, refused before any
// tensor is read: check_report_options' reason. The CLI names --columns.
struct TableChoiceError : SpecError {
  using SpecError::SpecError;
};

// The request's plan (plan_analysis with its own methods added), the name of its source as the report shows it, and
// the table's choices checked against it (TableChoiceError). Takes the request's own methods. SpecError for a bad
// spec or a combination without meaning, as plan_analysis.
struct PlannedAnalysis {
  AnalysisPlan plan;
  std::string source;
  ReportOptions table;
};
PlannedAnalysis plan_request(AnalysisRequest& request);

// The EvalOptions of the request's run settings.
EvalOptions eval_options(const AnalysisRequest& request);

// The whole analysis (takes the request's own methods). InputError / SpecError / TableChoiceError as plan_request,
// load_dump, quantize_projections and the methods raise them.
AnalysisResult run_analysis(AnalysisRequest& request);

}  // namespace qattn::eval
