// The analysis report: the per-head rows and each method's mean and worst rows, as Markdown, CSV, LaTeX or JSON, and
// the sweep table (one row per grid point). `qattn analyze`, `qattn sweep`, `qattn merge` and a user's own program
// (examples/own-method-analysis) all write them through these functions, so a method outside the registry lands in
// the same tables, byte for byte, as the built-in ones, and its sweeps feed the same plots (`qattn plot`).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "qattn/eval/analysis.h"
#include "qattn/eval/evaluate.h"

namespace qattn::eval {

// The methods of a report, in the order its summary rows list them: the label its results carry and its canonical
// spec (the registry's, with every parameter spelled out; a user's own method: its label).
struct ReportMethod {
  std::string label, canonical;
};

// What the report says besides its rows: the source, the target and reference, the quantizers (canonical specs,
// empty if none), the methods and the number of heads evaluated.
struct ReportView {
  std::string tensors;
  std::string reference = "fp64";
  std::string kv, weights;
  bool softmax = false;
  std::vector<ReportMethod> methods;
  std::size_t n_heads = 0;
};

// The view of a plan's analysis of `tensors` (as the report should name it) over n_heads heads.
ReportView report_view(const AnalysisPlan& plan, const std::string& tensors, std::size_t n_heads);

// One method's summary rows: the nine metrics' mean and worst over heads (summarise), with P max abs and bias (mean
// over heads; worst = the largest |value|) and the mean K/V bits.
struct MethodSummary {
  Summary metrics;
  double k_bits = 0, v_bits = 0, max_abs_mean = 0, max_abs_worst = 0, bias_mean = 0, bias_worst = 0;
  const HeadResult* first_nonfinite = nullptr;  // a head whose output is not finite (its metrics NaN), if any
};
MethodSummary summarise_method(const std::vector<HeadResult>& mine);

// What a rendered report shows (docs/metrics.md, "The analysis table"); the default shows everything, as before
// these choices existed.
struct ReportOptions {
  bool summary = false;              // only each method's mean and worst rows, no per-head rows
  std::vector<std::string> columns;  // metric column ids (report_columns), in the order shown; empty: all of them
  // The methods' order, by label: each of the view's labels exactly once. Empty: the view's order, and each head's
  // rows in the order of `results`. Given: the summary rows and each head's rows in this order.
  std::vector<std::string> methods;
  bool operator==(const ReportOptions&) const = default;
};

// The metric column ids of the view's table, in its order: K_bits, V_bits (with a KV quantizer), O_cossim,
// O_one_minus_cossim, O_rel_l1, O_rmse (attention, not softmax-only), P_cossim, P_one_minus_cossim, P_rel_l1, P_rmse,
// P_max_abs, P_bias, P_kl_mean; the names of qattn.analyze's records. Layer, head and method always come first.
std::vector<std::string> report_columns(const ReportView& view);

// A --columns LIST as ids: split at every comma, empty items kept ("a,,b" has three, "" one), so that
// check_report_options refuses them naming the item.
std::vector<std::string> split_columns(const std::string& list);

// Refuses (SpecError naming the id or label and listing the valid ones) a column id that is empty, given twice or
// not one of report_columns(view), a method order that is not a permutation of the view's labels, and --summary or
// columns with format json (the JSON report keeps every row and metric). Also the format check of render_report.
void check_report_options(const ReportView& view, const ReportOptions& options, const std::string& format);

// The report of `results` (in any order: they are put in (layer, head) order, each head's methods in the order of
// `results`, or of options.methods) as format md | csv | latex | json (docs/metrics.md: %.8f similarities, %.3e
// errors; JSON numbers read back to the same doubles, non-finite ones as "nan", "inf", "-inf"), showing what
// `options` chooses (check_report_options refuses the rest). SpecError for another format. A method whose output is
// not finite on some head is named on stderr, and its worst row names the head.
std::string render_report(const ReportView& view, std::vector<HeadResult> results, const std::string& format,
                          const ReportOptions& options = {});

// A sweep's table: the grid's keys, then target, metric, mean, worst, heads and method, one row per grid point in
// grid order. `qattn plot heatmap|lines` draws its CSV.
struct SweepRow {
  std::vector<std::string> values;  // one per key, as the point's spec spells them
  std::string method;               // the point's canonical spec (or a user method's label)
  double mean = 0, worst = 0;       // of `metric` on `target` over the heads (summarise)
};
struct SweepTable {
  std::vector<std::string> keys;
  std::string target = "O";        // O | P
  std::string metric = "cossim";   // cossim | rel_l1 | rmse | kl (P only)
  std::size_t heads = 0;
  std::vector<SweepRow> rows;
};
// format csv | md; SpecError for another format.
std::string render_sweep(const SweepTable& table, const std::string& format);

// `qattn compare --format json`: the error statistics of B against A (stats_json's fields, every double read back
// to the same bits: docs/metrics.md), with "kl_a_b" {"mean", "max"} where the rows were probabilities; indented by
// 2, no final newline.
std::string compare_json(const ErrorStats& stats, const std::optional<KlStats>& kl);

// The summary metric `metric` on `target` ("O", "cossim" -> Metric::o_cossim); SpecError naming both otherwise.
Metric sweep_metric(const std::string& target, const std::string& metric);

}  // namespace qattn::eval
