#include "qattn/eval/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "qattn/error.h"
#include "qattn/eval/table.h"
#include "report_json.h"

namespace qattn::eval {

using nlohmann::json;

namespace {

void check_format(const std::string& f, std::initializer_list<const char*> valid) {
  for (const char* v : valid)
    if (f == v) return;
  std::string list;
  for (const char* v : valid) list += std::string(list.empty() ? "" : "|") + v;
  throw SpecError("format '" + f + "' is not one of " + list);
}

// Each layer's logit scale and mask, as the evaluation used them: "layer 0: scale 0.125, no mask; layer 1: ...".
std::string describe_layers(const std::vector<HeadResult>& results) {
  std::map<int, std::pair<double, bool>> layers;
  for (const HeadResult& r : results) layers.emplace(r.layer, std::make_pair(r.scale, r.causal));
  std::string out;
  for (const auto& [layer, sc] : layers) {
    std::ostringstream s;
    s.precision(6);
    s << sc.first;
    out += (out.empty() ? "" : "; ") + ("layer " + std::to_string(layer) + ": scale " + s.str() +
                                        (sc.second ? ", causal" : ", no mask"));
  }
  return out;
}

// The sentence above the table: what was compared with what, on which tensors.
std::string describe_analysis(const ReportView& v, const std::vector<HeadResult>& results) {
  const std::string heads = std::to_string(v.n_heads) + " heads";
  if (v.softmax)
    return "Softmax error vs the " + std::string(v.reference == "exact" ? "exact (50-digit)" : "fp64") +
           " softmax of the dumped logits on " + v.tensors + " (" + heads +
           "; P flattened over all batch entries of a head; bias = mean signed error; worst = min CosSim, max error, "
           "largest |bias| over heads; qattn " QATTN_VERSION ")";
  std::string what = "Attention error vs the fp64 reference on " + v.tensors;
  if (!v.kv.empty())
    what += ", K and V through the KV quantizer " + v.kv + " (bits per element include scales and zero points)";
  if (!v.weights.empty())
    what += ", Q, K and V projected from layer{L}_attn_input with weights quantized by " + v.weights +
            " (calibrated on the same inputs; reference: fp64 attention of the unquantized projections)";
  return what + " (" + heads +
         "; O = softmax(scale QK^T)V with " + describe_layers(results) +
         " (1/sqrt(d) and no mask unless manifest.json sets them); O and P "
         "flattened over all batch entries of a head; bias = mean signed error; worst = min CosSim, max error, largest "
         "|bias| over heads; qattn " QATTN_VERSION ")";
}

// The metric columns of the analysis table, in its order: the id (the key of qattn.analyze's records, --columns)
// and the header.
struct ReportColumn {
  const char* id;
  const char* header;
};
constexpr ReportColumn kReportColumns[] = {
    {"K_bits", "K bits"},     {"V_bits", "V bits"},     {"O_cossim", "O CosSim"},   {"O_one_minus_cossim", "O 1-CosSim"},
    {"O_rel_l1", "O rel L1"}, {"O_rmse", "O RMSE"},     {"P_cossim", "P CosSim"},   {"P_one_minus_cossim", "P 1-CosSim"},
    {"P_rel_l1", "P rel L1"}, {"P_rmse", "P RMSE"},     {"P_max_abs", "P max abs"}, {"P_bias", "P bias"},
    {"P_kl_mean", "P KL"}};
constexpr std::size_t kFirstO = 2, kFirstP = 6;  // the first O and P columns; before them the K and V bits

// Whether the view's table has column c: the bits with a KV quantizer, the O columns for attention.
bool has_column(const ReportView& v, std::size_t c) {
  if (c < kFirstO) return !v.kv.empty();
  return c >= kFirstP || !v.softmax;
}

// The indices (into kReportColumns) of the columns `options` shows, in the order shown.
std::vector<std::size_t> shown_columns(const ReportView& v, const ReportOptions& options) {
  std::vector<std::size_t> shown;
  if (options.columns.empty()) {
    for (std::size_t c = 0; c < std::size(kReportColumns); ++c)
      if (has_column(v, c)) shown.push_back(c);
    return shown;
  }
  for (const std::string& id : options.columns)
    for (std::size_t c = 0; c < std::size(kReportColumns); ++c)
      if (id == kReportColumns[c].id) shown.push_back(c);
  return shown;
}

// A caption short enough for a paper's table: what is compared with what, on which tensors, by which version, and
// of the choices only what the table shows: the columns, when chosen, and "mean and worst" for a summary. The full
// description (describe_analysis) goes into a comment above the table.
std::string analysis_caption(const ReportView& v, const ReportOptions& options) {
  const std::string source = std::filesystem::path(v.tensors).filename().string();
  const std::string what = v.softmax ? "Softmax error vs the " + std::string(v.reference == "exact" ? "exact" : "fp64") +
                                           " softmax"
                                     : "Attention error vs fp64 attention";
  std::string columns;
  if (!options.columns.empty())
    for (std::size_t c : shown_columns(v, options)) columns += (columns.empty() ? ": " : ", ") + std::string(kReportColumns[c].header);
  return what + (v.kv.empty() ? "" : " (KV " + v.kv + ")") + (v.weights.empty() ? "" : " (weights " + v.weights + ")") +
         (columns.empty() ? ", " : columns + "; ") + (options.summary ? "mean and worst over " : "") +
         std::to_string(v.n_heads) + " heads of " + (source.empty() ? v.tensors : source) + "; qattn " +
         QATTN_VERSION + ".";
}

// A JSON integer in [lo, hi]; std::invalid_argument for anything else. A float is refused, not converted: the
// conversion of one out of the integer's range (1e67 to int64) is undefined, and 1.5 would read as 1.
std::int64_t integer_in(const json& j, std::int64_t lo, std::int64_t hi) {
  if (j.is_number_unsigned() && j.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
      static_cast<std::int64_t>(j.get<std::uint64_t>()) >= lo)
    return static_cast<std::int64_t>(j.get<std::uint64_t>());
  if (j.is_number_integer() && !j.is_number_unsigned() && j.get<std::int64_t>() >= lo && j.get<std::int64_t>() <= hi)
    return j.get<std::int64_t>();
  throw std::invalid_argument(j.dump(-1, ' ', false, json::error_handler_t::replace) + " is not an integer in [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
}
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

ErrorStats stats_from_json(const json& j) {
  ErrorStats s;
  s.count = integer_in(j.at("count"), 0, kInt64Max);
  s.nonfinite = integer_in(j.at("nonfinite"), 0, kInt64Max);
  s.cossim = exact_number(j.at("cossim"));
  s.rel_l1 = exact_number(j.at("rel_l1"));
  s.rmse = exact_number(j.at("rmse"));
  s.max_abs = exact_number(j.at("max_abs"));
  s.bias = exact_number(j.at("bias"));
  s.median_abs = exact_number(j.at("median_abs"));
  s.one_minus_cossim = exact_number(j.at("one_minus_cossim"));
  s.zero_errors = integer_in(j.at("zero_errors"), 0, kInt64Max);
  for (const auto& [k, n] : j.at("log2_histogram").items()) {
    // a bin is a binary exponent as std::to_string writes it: "1x", " 1" or "01" would fold two keys into one bin
    int bin = 0;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), bin);
    if (ec != std::errc() || end != k.data() + k.size() || std::to_string(bin) != k)
      throw std::invalid_argument("log2_histogram key '" + k + "' is not a binary exponent");
    s.log2_histogram[bin] = integer_in(n, 0, kInt64Max);
  }
  return s;
}

}  // namespace

// ---- JSON forms (report_json.h) -----------------------------------------------------------------------------------

json exact_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;  // printed with the shortest digits that read back to the same double
}

double exact_number(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j == "nan") return NAN;
  if (j == "inf") return INFINITY;
  if (j == "-inf") return -INFINITY;
  throw std::invalid_argument("not a number: " + j.dump());
}

json stats_json(const ErrorStats& s) {
  json hist = json::object();
  for (const auto& [k, n] : s.log2_histogram) hist[std::to_string(k)] = n;
  // Non-finite values as "nan", "inf", "-inf" (exact_number), as everywhere in qattn's JSON (docs/metrics.md)
  return {{"count", s.count}, {"nonfinite", s.nonfinite}, {"cossim", exact_number(s.cossim)},
          {"rel_l1", exact_number(s.rel_l1)}, {"rmse", exact_number(s.rmse)}, {"max_abs", exact_number(s.max_abs)},
          {"bias", exact_number(s.bias)}, {"median_abs", exact_number(s.median_abs)},
          {"one_minus_cossim", exact_number(s.one_minus_cossim)}, {"zero_errors", s.zero_errors},
          {"log2_histogram", hist}};
}

json head_result_json(const HeadResult& r) {
  return {{"layer", r.layer},  {"head", r.head},
          {"method", r.method}, {"O", stats_json(r.o)},
          {"P", stats_json(r.p)}, {"kl", {exact_number(r.kl.mean), exact_number(r.kl.max)}},
          {"bits", {exact_number(r.k_bits), exact_number(r.v_bits)}}, {"scale", exact_number(r.scale)},
          {"causal", r.causal}};
}

HeadResult head_result_from_json(const json& j) {
  HeadResult r;
  r.layer = static_cast<int>(integer_in(j.at("layer"), 0, std::numeric_limits<int>::max()));
  r.head = static_cast<int>(integer_in(j.at("head"), 0, std::numeric_limits<int>::max()));
  r.method = j.at("method").get<std::string>();
  r.o = stats_from_json(j.at("O"));
  r.p = stats_from_json(j.at("P"));
  r.kl.mean = exact_number(j.at("kl").at(0));
  r.kl.max = exact_number(j.at("kl").at(1));
  r.k_bits = exact_number(j.at("bits").at(0));
  r.v_bits = exact_number(j.at("bits").at(1));
  r.scale = exact_number(j.at("scale"));
  r.causal = j.at("causal").get<bool>();
  return r;
}

json report_view_json(const ReportView& v) {
  json methods = json::array();
  for (const ReportMethod& m : v.methods) methods.push_back({{"label", m.label}, {"canonical", m.canonical}});
  return {{"tensors", v.tensors}, {"softmax", v.softmax}, {"reference", v.reference}, {"kv", v.kv},
          {"weights", v.weights}, {"methods", methods},   {"n_heads", v.n_heads}};
}

ReportView report_view_from_json(const json& j) {
  ReportView v;
  v.tensors = j.at("tensors").get<std::string>();
  v.softmax = j.at("softmax").get<bool>();
  v.reference = j.at("reference").get<std::string>();
  v.kv = j.at("kv").get<std::string>();
  v.weights = j.at("weights").get<std::string>();
  for (const json& m : j.at("methods"))
    v.methods.push_back({m.at("label").get<std::string>(), m.at("canonical").get<std::string>()});
  v.n_heads = static_cast<std::size_t>(integer_in(j.at("n_heads"), 0, kInt64Max));
  return v;
}

json sweep_header_json(const SweepTable& t) {
  return {{"keys", t.keys}, {"target", t.target}, {"metric", t.metric}, {"heads", t.heads}};
}

SweepTable sweep_header_from_json(const json& j) {
  SweepTable t;
  t.keys = j.at("keys").get<std::vector<std::string>>();
  t.target = j.at("target").get<std::string>();
  t.metric = j.at("metric").get<std::string>();
  t.heads = static_cast<std::size_t>(integer_in(j.at("heads"), 0, kInt64Max));
  return t;
}

// ---- the report ---------------------------------------------------------------------------------------------------

ReportView report_view(const AnalysisPlan& plan, const std::string& tensors, std::size_t n_heads) {
  ReportView v;
  v.tensors = tensors;
  v.softmax = plan.softmax;
  v.reference = softmax_reference_name(plan.softmax ? plan.reference : SoftmaxReference::fp64);
  v.kv = plan.kv_canonical;
  v.weights = plan.weights_canonical;
  for (const PlannedMethod& m : plan.methods) v.methods.push_back({m.label, m.canonical});
  v.n_heads = n_heads;
  return v;
}

MethodSummary summarise_method(const std::vector<HeadResult>& mine) {
  MethodSummary s;
  s.metrics = summarise(mine);
  const double n = static_cast<double>(mine.size());
  for (const auto& r : mine) {
    s.k_bits += r.k_bits / n;
    s.v_bits += r.v_bits / n;
    s.max_abs_mean += r.p.max_abs / n;
    s.bias_mean += r.p.bias / n;
    s.max_abs_worst = std::isnan(s.max_abs_worst) || std::isnan(r.p.max_abs) ? NAN : std::max(s.max_abs_worst, r.p.max_abs);
    if (!(std::fabs(r.p.bias) <= std::fabs(s.bias_worst))) s.bias_worst = r.p.bias;
    if (!s.first_nonfinite && (r.o.nonfinite > 0 || r.p.nonfinite > 0)) s.first_nonfinite = &r;
  }
  return s;
}

std::vector<std::string> report_columns(const ReportView& view) {
  std::vector<std::string> ids;
  for (std::size_t c : shown_columns(view, {})) ids.push_back(kReportColumns[c].id);
  return ids;
}

std::vector<std::string> split_columns(const std::string& list) {
  std::vector<std::string> ids;
  std::size_t start = 0;
  for (std::size_t comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
    ids.push_back(list.substr(start, comma - start));
  ids.push_back(list.substr(start));
  return ids;
}

void check_report_options(const ReportView& view, const ReportOptions& options, const std::string& format) {
  check_format(format, {"md", "csv", "latex", "json"});
  if (format == "json" && (options.summary || !options.columns.empty()))
    throw SpecError(std::string(options.summary ? "summary" : "columns") +
                    " chooses what a table shows (md, csv, latex); the JSON report keeps every row and metric");
  const std::vector<std::string> valid = report_columns(view);
  std::string list;
  for (const std::string& id : valid) list += (list.empty() ? "" : ", ") + id;
  const std::string valid_ones = "; the columns of this analysis are " + list;
  for (std::size_t i = 0; i < options.columns.size(); ++i) {
    const std::string& id = options.columns[i];
    if (id.empty())
      throw SpecError("column item " + std::to_string(i + 1) + " of " + std::to_string(options.columns.size()) +
                      " is empty" + valid_ones);
    if (std::find(valid.begin(), valid.end(), id) == valid.end()) {
      std::size_t c = 0;
      while (c < std::size(kReportColumns) && id != kReportColumns[c].id) ++c;
      const std::string why = c == std::size(kReportColumns) ? " is not a column"
                              : c < kFirstO ? " needs a KV quantizer (the bits per element of its cache)"
                                            : " is an O column and softmax-only analysis has no O";
      throw SpecError("column '" + id + "'" + why + valid_ones);
    }
    if (std::find(options.columns.begin(), options.columns.begin() + static_cast<std::ptrdiff_t>(i), id) !=
        options.columns.begin() + static_cast<std::ptrdiff_t>(i))
      throw SpecError("column '" + id + "' is given twice" + valid_ones);
  }
  if (options.methods.empty()) return;
  std::vector<std::string> labels;  // the view's labels, each once
  for (const ReportMethod& m : view.methods)
    if (std::find(labels.begin(), labels.end(), m.label) == labels.end()) labels.push_back(m.label);
  std::string label_list;
  for (const std::string& l : labels) label_list += (label_list.empty() ? "" : ", ") + l;
  for (std::size_t i = 0; i < options.methods.size(); ++i) {
    const std::string& label = options.methods[i];
    if (std::find(labels.begin(), labels.end(), label) == labels.end())
      throw SpecError("method order: '" + label + "' is not a method of this report (" + label_list + ")");
    if (std::find(options.methods.begin(), options.methods.begin() + static_cast<std::ptrdiff_t>(i), label) !=
        options.methods.begin() + static_cast<std::ptrdiff_t>(i))
      throw SpecError("method order: '" + label + "' is given twice (give each of " + label_list + " once)");
  }
  for (const std::string& label : labels)
    if (std::find(options.methods.begin(), options.methods.end(), label) == options.methods.end())
      throw SpecError("method order: '" + label + "' is missing (give each of " + label_list + " once)");
}

namespace {

// Every column's cell of one row, in kReportColumns' order.
std::vector<std::string> report_cells(const Metrics& v, double k_bits, double v_bits, double p_max_abs, double p_bias) {
  std::vector<std::string> all = {fmt_bits(k_bits),
                                  fmt_bits(v_bits),
                                  fmt_sim(v.o_cossim),
                                  fmt_err(v.o_one_minus_cossim),
                                  fmt_err(v.o_rel_l1),
                                  fmt_err(v.o_rmse),
                                  fmt_sim(v.p_cossim),
                                  fmt_err(v.p_one_minus_cossim),
                                  fmt_err(v.p_rel_l1),
                                  fmt_err(v.p_rmse),
                                  fmt_err(p_max_abs),
                                  fmt_err(p_bias),
                                  fmt_err(v.p_kl)};
  if (all.size() != std::size(kReportColumns)) throw std::logic_error("report_cells: a column without its cell");
  return all;
}

// The JSON report before its heads, summaries and layers are added.
json report_json_header(const ReportView& view) {
  const bool softmax = view.softmax;
  return {{"tensors", view.tensors},
          {"qattn_version", QATTN_VERSION},
          {"scale_rule", softmax ? json(nullptr) : json("1/sqrt(d) unless manifest.json sets it")},
          {"mask_rule", softmax ? json("as dumped (-inf entries)") : json("none unless manifest.json sets causal")},
          {"target", softmax ? "softmax" : "attention"},
          {"reference", view.reference},
          {"kv", !view.kv.empty() ? json(view.kv) : json(nullptr)},
          {"weights", view.weights.empty() ? json(nullptr) : json(view.weights)},
          {"layers", json::array()},  // each layer's logit scale and causal mask, as used
          {"heads", json::array()},
          {"summary", json::array()}};
}

}  // namespace

std::string render_report(const ReportView& view, std::vector<HeadResult> results, const std::string& format,
                          const ReportOptions& options) {
  check_report_options(view, options, format);
  // A method's place in options.methods (the view's labels, each once); a result of another label goes last.
  const auto rank = [&](const std::string& label) {
    return static_cast<std::size_t>(std::find(options.methods.begin(), options.methods.end(), label) -
                                    options.methods.begin());
  };
  std::vector<ReportMethod> methods = view.methods;
  std::stable_sort(results.begin(), results.end(), [&](const HeadResult& a, const HeadResult& b) {
    if (options.methods.empty()) return std::make_pair(a.layer, a.head) < std::make_pair(b.layer, b.head);
    return std::make_tuple(a.layer, a.head, rank(a.method)) < std::make_tuple(b.layer, b.head, rank(b.method));
  });
  if (!options.methods.empty())
    std::stable_sort(methods.begin(), methods.end(),
                     [&](const ReportMethod& a, const ReportMethod& b) { return rank(a.label) < rank(b.label); });
  const bool softmax = view.softmax;
  const std::vector<std::size_t> shown = shown_columns(view, options);
  Table t{{"layer", "head", "method"}, {}};
  for (std::size_t c : shown) t.header.push_back(kReportColumns[c].header);
  auto row = [&](const std::string& l, const std::string& h, const std::string& m, double k_bits, double v_bits,
                 const Metrics& v, double p_max_abs, double p_bias) {
    const std::vector<std::string> all = report_cells(v, k_bits, v_bits, p_max_abs, p_bias);
    std::vector<std::string> cells = {l, h, m};
    for (std::size_t c : shown) cells.push_back(all[c]);
    t.rows.push_back(std::move(cells));
  };
  json j = report_json_header(view);
  for (const auto& r : results) {
    if (!options.summary)
      row(std::to_string(r.layer), std::to_string(r.head), r.method, r.k_bits, r.v_bits, metric_values(r), r.p.max_abs,
          r.p.bias);
    j["heads"].push_back({{"layer", r.layer}, {"head", r.head}, {"method", r.method}, {"O", stats_json(r.o)},
                          {"P", stats_json(r.p)}, {"P_kl_mean", exact_number(r.kl.mean)},
                          {"P_kl_max", exact_number(r.kl.max)}, {"K_bits", exact_number(r.k_bits)},
                          {"V_bits", exact_number(r.v_bits)}});
  }
  const std::size_t summary_start = t.rows.size();
  for (const ReportMethod& method : methods) {
    const std::string& spec = method.label;
    std::vector<HeadResult> mine;
    for (const auto& r : results)
      if (r.method == spec) mine.push_back(r);
    const MethodSummary s = summarise_method(mine);
    std::string worst_label = "worst";
    json nonfinite_head = nullptr;
    if (const HeadResult* r = s.first_nonfinite) {  // its NaN makes the mean and worst NaN; the worst row names it
      worst_label = "worst (NaN: layer " + std::to_string(r->layer) + " head " + std::to_string(r->head) + ")";
      nonfinite_head = {{"layer", r->layer}, {"head", r->head}};
      std::cerr << "qattn analyze: " << spec << " gives a non-finite output on layer " << r->layer << " head "
                << r->head << " (its metrics are NaN; see docs/non-finite.md)\n";
    }
    row("all", "mean", spec, s.k_bits, s.v_bits, s.metrics.mean, s.max_abs_mean, s.bias_mean);
    row("all", worst_label, spec, s.k_bits, s.v_bits, s.metrics.worst, s.max_abs_worst, s.bias_worst);
    json mean, worst;
    for (const MetricInfo& m : kMetrics)
      mean[m.name] = exact_number(s.metrics.mean[m.metric]), worst[m.name] = exact_number(s.metrics.worst[m.metric]);
    j["summary"].push_back({{"method", spec}, {"canonical", method.canonical}, {"mean", mean}, {"worst", worst},
                            {"first_nonfinite_head", nonfinite_head}});
  }
  const std::string what = describe_analysis(view, results);
  if (!softmax) {
    std::map<int, std::pair<double, bool>> layers;
    for (const HeadResult& r : results) layers.emplace(r.layer, std::make_pair(r.scale, r.causal));
    for (const auto& [layer, sc] : layers)
      j["layers"].push_back({{"layer", layer}, {"scale", exact_number(sc.first)}, {"causal", sc.second}});
  }
  if (format == "json") return j.dump(2) + "\n";
  if (format == "csv") return t.csv();
  if (format == "latex")  // a summary has no per-head rows for a rule to set apart
    return t.latex(analysis_caption(view, options), options.summary ? std::vector<std::size_t>{} : std::vector{summary_start},
                   what);
  return what + "\n\n" + t.markdown();
}

// ---- the sweep table ----------------------------------------------------------------------------------------------

Metric sweep_metric(const std::string& target, const std::string& metric) {
  const std::string name = target + "_" + metric;
  for (const MetricInfo& m : kMetrics)
    if (name == m.name) return m.metric;
  throw SpecError("metric '" + metric + "' on target '" + target +
                  "' is not one of cossim, one_minus_cossim, rel_l1, rmse (O or P) or kl (P only)");
}

std::string render_sweep(const SweepTable& table, const std::string& format) {
  check_format(format, {"csv", "md"});
  sweep_metric(table.target, table.metric);
  const bool sim = table.metric == "cossim";  // the CosSims are printed as similarities, the errors in %.3e
  Table t{table.keys, {}};
  for (const char* h : {"target", "metric", "mean", "worst", "heads", "method"}) t.header.push_back(h);
  const std::string heads = std::to_string(table.heads);
  for (const SweepRow& r : table.rows) {
    if (r.values.size() != table.keys.size())
      throw std::invalid_argument("render_sweep: a row of " + std::to_string(r.values.size()) + " values for " +
                                  std::to_string(table.keys.size()) + " keys");
    std::vector<std::string> row = r.values;
    row.insert(row.end(), {table.target, table.metric, sim ? fmt_sim(r.mean) : fmt_err(r.mean),
                           sim ? fmt_sim(r.worst) : fmt_err(r.worst), heads, r.method});
    t.rows.push_back(std::move(row));
  }
  return format == "md" ? t.markdown() : t.csv();
}

std::string compare_json(const ErrorStats& stats, const std::optional<KlStats>& kl) {
  nlohmann::json j = stats_json(stats);
  if (kl) j["kl_a_b"] = {{"mean", exact_number(kl->mean)}, {"max", exact_number(kl->max)}};
  return j.dump(2);
}

}  // namespace qattn::eval
