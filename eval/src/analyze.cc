// One analysis end to end (qattn/eval/analyze.h).
#include "qattn/eval/analyze.h"

#include <algorithm>
#include <utility>

#include "qattn/parallel.h"

namespace qattn::eval {

PlannedAnalysis plan_request(AnalysisRequest& request) {
  const bool softmax = request.softmax || !request.logits.empty();
  PlannedAnalysis p;
  p.plan = plan_analysis(request.specs, request.kv, request.weights, softmax, request.reference, !request.q.empty(),
                         request.build, request.own.empty());
  for (OwnMethod& m : request.own) p.plan.add_own(std::move(m.label), std::move(m.method), m.traits);
  request.own.clear();
  p.source = !request.q.empty() ? request.q : !request.logits.empty() ? request.logits : request.tensors;
  p.table = request.table;
  if (!request.format.empty()) {
    const ReportView planned = report_view(p.plan, p.source, 0);
    std::vector<std::string> labels, wanted = request.order;
    for (const ReportMethod& m : planned.methods) labels.push_back(m.label);
    std::sort(labels.begin(), labels.end()), std::sort(wanted.begin(), wanted.end());
    if (!request.order.empty() && labels == wanted && std::adjacent_find(labels.begin(), labels.end()) == labels.end())
      p.table.methods = request.order;
    try {
      check_report_options(planned, p.table, request.format);
    } catch (const SpecError& e) {
      throw TableChoiceError(e.what());
    }
  }
  return p;
}

EvalOptions eval_options(const AnalysisRequest& request) {
  EvalOptions options;
  options.threads = resolve_threads(request.threads);
  options.block_rows = request.block_rows;
  options.whole_calls = request.whole_calls;
  options.progress = request.progress;
  return options;
}

AnalysisResult run_analysis(AnalysisRequest& request) {
  const PlannedAnalysis p = plan_request(request);
  const AnalysisPlan& plan = p.plan;
  std::vector<DumpLayer> dump =
      !request.q.empty()      ? load_explicit(request.q, request.k, request.v, /*with_reference=*/false)
      : !request.logits.empty() ? load_explicit_logits(request.logits, plan.reference)
                                : load_dump(request.tensors, plan.softmax ? DumpTarget::softmax : DumpTarget::attention,
                                            plan.reference, nullptr, /*with_reference=*/false);
  if (request.checkpoint) request.checkpoint();
  if (plan.wq) {
    quantize_projections(dump, request.tensors, *plan.wq);
    if (request.checkpoint) request.checkpoint();
  }
  std::size_t n_heads = 0;
  for (const DumpLayer& l : dump) n_heads += l.heads.size();
  AnalysisResult out;
  out.results = evaluate_plan(dump, plan, eval_options(request));
  out.view = report_view(plan, p.source, n_heads);
  if (!request.format.empty()) out.text = render_report(out.view, out.results, request.format, p.table);
  return out;
}

}  // namespace qattn::eval
