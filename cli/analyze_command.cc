// `qattn analyze`: the error of each method against the reference, per head and aggregated (docs/metrics.md).
#include "commands.h"

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/eval/analyze.h"
#include "shard.h"

namespace qattn::cli {

namespace {

// The option checks of `qattn analyze` that CLI11 cannot express: CLI::ValidationError naming the option.
void check_analyze_options(const AnalyzeOptions& o) {
  check_format_option(o.format, {"md", "csv", "latex", "json"});
  require_threads(o.threads);
  if (o.block_rows < 0 || o.block_rows % 64 != 0 || o.block_rows > (1 << 20))
    throw CLI::ValidationError("--block-rows", "must be a multiple of 64 in [64, 1048576], or 0 (chosen from L_k); got " +
                                                   std::to_string(o.block_rows));
  SoftmaxReference reference;
  try {
    reference = parse_softmax_reference(o.reference);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--reference", e.what());
  }
  const int given = !o.q.empty() + !o.k.empty() + !o.v.empty();
  if (given != 0 && given != 3) throw CLI::ValidationError("--q/--k/--v", "give all three or none");
  if (given && o.softmax_only)
    throw CLI::ValidationError("--softmax-only", "analyses logits; give --logits or --tensors, not --q/--k/--v");
  if (reference == SoftmaxReference::exact && !o.softmax_only && o.logits.empty())
    throw CLI::ValidationError("--reference", "exact applies to softmax-only analysis (--softmax-only or --logits); "
                                              "attention is compared with fp64");
}

// --summary and --columns LIST as the evaluation layer's report options (LIST as eval::split_columns splits it).
eval::ReportOptions table_options(bool summary, const std::optional<std::string>& columns) {
  eval::ReportOptions options;
  options.summary = summary;
  if (columns) options.columns = eval::split_columns(*columns);
  return options;
}

// The report of `qattn analyze` showing what `table` chooses (docs/metrics.md, "The analysis table"), or the part of
// --shard (eval::analysis_shard, docs/scale-out.md). The choices are checked against the plan before any tensor is
// read.
std::string analyze_table(const AnalyzeOptions& o, const eval::ReportOptions& table) {
  check_analyze_options(o);
  const bool chosen = table.summary || !table.columns.empty();
  const std::string option = table.summary ? "--summary" : "--columns";
  if (chosen && o.format == "json")
    throw CLI::ValidationError(option, "chooses what a table shows (md, csv, latex); the JSON report keeps every row "
                                       "and metric");
  if (chosen && !o.shard.empty())
    throw CLI::ValidationError(option, "chooses what a rendered table shows; a --shard part holds every row and "
                                       "metric");
  if (!o.shard.empty() && (!o.q.empty() || !o.logits.empty()))
    throw CLI::ValidationError("--shard", "splits a dump's (layer, head) pairs: give --tensors, not --q/--k/--v or --logits");
  const bool explicit_files = !o.q.empty() || !o.logits.empty();
  require_distinct_files({{"--tensors", explicit_files ? "" : o.tensors}, {"--q", o.q}, {"--k", o.k}, {"--v", o.v},
                          {"--logits", o.logits}},
                         {{"--out", o.out}});
  eval::AnalysisRequest request;
  if (explicit_files) {
    request.q = o.q, request.k = o.k, request.v = o.v, request.logits = o.logits;
  } else {
    request.tensors = o.tensors;
  }
  request.specs = o.specs;
  request.kv = o.kv;
  request.weights = o.weights;
  request.softmax = o.softmax_only;
  request.reference = parse_softmax_reference(o.reference);
  request.build = [&o](const MethodSpec& spec) { return make_method(spec, o.engine); };
  request.format = o.format;
  request.table = table;
  request.threads = o.threads;
  request.block_rows = static_cast<Eigen::Index>(o.block_rows);
  request.whole_calls = o.whole_calls;
  request.progress = stderr_progress("qattn analyze", "blocks and calls");
  // The progress clock starts with the evaluation, not with the reading of the dump (its checkpoint comes last).
  request.checkpoint = [&request] { request.progress = stderr_progress("qattn analyze", "blocks and calls"); };
  try {
    if (!o.shard.empty()) return eval::analysis_shard(request, shard_option(o.shard));
    return eval::run_analysis(request).text;
  } catch (const eval::TableChoiceError& e) {
    throw CLI::ValidationError("--columns", e.what());
  }
}

}  // namespace

std::string analyze_report(const AnalyzeOptions& o) { return analyze_table(o, {}); }

void add_analyze(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "analyze", "Error of each method vs a reference, per layer/head and aggregated: attention (O and P) from Q/K/V, "
                 "or the softmax alone from dumped logits (--softmax-only)");
  auto o = std::make_shared<AnalyzeOptions>();
  auto* opt_tensors = sub->add_option("--tensors", o->tensors,
                                      "Dump: a directory of layer{L}_head{H}_{q,k,v}.npy (and/or _logits.npy), or one "
                                      ".npz/.safetensors file holding tensors of those names")
                          ->capture_default_str();
  auto* opt_q = sub->add_option("--q", o->q, "Queries [..., L_q, d] of one head (with --k and --v, instead of --tensors)");
  auto* opt_k = sub->add_option("--k", o->k, "Keys [..., L_k, d]");
  auto* opt_v = sub->add_option("--v", o->v, "Values [..., L_k, d_v]");
  auto* opt_logits = sub->add_option("--logits", o->logits, "Logits [..., L_q, L_k] of one head: softmax-only analysis");
  for (auto* opt : {opt_q, opt_k, opt_v, opt_logits}) opt->excludes(opt_tensors);
  for (auto* opt : {opt_q, opt_k, opt_v}) opt->excludes(opt_logits);
  sub->add_option("--kv", o->kv,
                  "KV-cache quantizer spec applied to K and V before every method (see `qattn methods`), e.g. "
                  "turboquant:bits=3, kivi, flashq@mixed");
  sub->add_option("--weights", o->weights,
                  "Weight quantizer spec (rtn, gptq, awq; see `qattn methods`): Q, K, V recomputed from each layer's "
                  "attention input and quantized projection weights in the dump, e.g. gptq:bits=3");
  sub->add_flag("--softmax-only", o->softmax_only,
                "Evaluate the softmax models on the dump's layer{L}_head{H}_logits files instead of attention");
  sub->add_option("--reference", o->reference,
                  "fp64 (default) or exact: the 50-digit softmax rounded once to double (softmax-only analysis)")
      ->capture_default_str();
  sub->add_option("--method", o->specs,
                  "Method spec, repeatable (default: every registered method but fp64; the softmax models only with "
                  "--softmax-only, fp64 included with --reference exact)");
  sub->add_option("--format", o->format, "md|csv|latex|json (latex: a booktabs table)")->capture_default_str();
  auto summary = std::make_shared<bool>(false);
  auto columns = std::make_shared<std::optional<std::string>>();
  sub->add_flag("--summary", *summary,
                "Only each method's mean and worst rows, no per-head rows (md, csv, latex; the JSON report keeps "
                "every row)");
  sub->add_option("--columns", *columns,
                  "Comma-separated metric columns, shown in this order after layer, head and method: K_bits, V_bits "
                  "(with --kv), O_cossim, O_one_minus_cossim, O_rel_l1, O_rmse (attention), P_cossim, "
                  "P_one_minus_cossim, P_rel_l1, P_rmse, P_max_abs, P_bias, P_kl_mean (md, csv, latex; default: all)");
  sub->add_option("--out", o->out, "Write the table here instead of stdout");
  sub->add_option("--shard", o->shard,
                  "K/N: evaluate only block K (0-based) of N of the dump's (layer, head) pairs and write a partial "
                  "result (JSON) for `qattn merge` (docs/scale-out.md)");
  add_threads_option(sub, o->threads, "worker threads over (head, block of query rows) items",
                     ". The tables do not depend on it (docs/streaming.md)");
  sub->add_option("--block-rows", o->block_rows,
                  "query rows per streamed block, a multiple of 64; 0 (default): about 2^20 / L_k. The tables do not "
                  "depend on it (docs/streaming.md)")
      ->capture_default_str();
  sub->add_flag("--whole-calls", o->whole_calls,
                "run every method on whole attention calls, none in blocks (memory O(L_q L_k) per call): a check that "
                "streaming changes no figure (docs/streaming.md)");
  add_engine_options(sub, o->engine);
  sub->callback([=] { emit(analyze_table(*o, table_options(*summary, *columns)), o->out); });
}

}  // namespace qattn::cli
