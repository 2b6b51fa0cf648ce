// `qattn compare`: the metrics of one tensor against another.
#include "commands.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/eval/panel_metrics.h"
#include "qattn/metrics.h"
#include "qattn/tensor_io.h"

namespace qattn::cli {

namespace {

// The metrics of A against B, in chunks of whole rows of the last axis (about 2^16 values each, fixed by the shape)
// on `threads` workers, each chunk's partial sums folded in chunk order (qattn/eval/panel_metrics.h): the same
// figures for every thread count; the median is exact. KL (D(A || B) per row) where both are probability rows.
void run_compare(const std::string& a, const std::string& b, const std::string& name, const std::string& format,
                 int threads) {
  const Tensor ta = pick_tensor(a, name), tb = pick_tensor(b, name);
  if (ta.shape != tb.shape)
    throw InputError(b, "shape", tb.shape_string() + " differs from " + ta.shape_string() + " of " + a);
  const Eigen::ArrayXd va = ta.to_double(), vb = tb.to_double();
  const Eigen::Index cols = ta.shape.empty() || ta.shape.back() == 0 ? 1 : ta.shape.back();
  const Eigen::Index rows = va.size() / cols;
  bool probabilities = false;
  if (!ta.shape.empty()) {
    const RowMatrixXd ra = ta.as_rows(), rb = tb.as_rows();
    probabilities = looks_like_probability_rows(ra) && looks_like_probability_rows(rb);
  }
  const Eigen::Index chunk_rows = std::max<Eigen::Index>(1, (Eigen::Index{1} << 16) / cols);
  const std::size_t chunks = static_cast<std::size_t>((rows + chunk_rows - 1) / chunk_rows);
  std::vector<eval::PanelStats> panels(chunks);
  std::vector<eval::MetricFold> medians;
  for (std::size_t c = 0; c < chunks; ++c) medians.emplace_back(true);
  parallel_for(chunks, resolve_threads(threads), [&](std::size_t c) {
                 const Eigen::Index r0 = static_cast<Eigen::Index>(c) * chunk_rows, n = std::min(chunk_rows, rows - r0);
                 const double* pa = va.data() + r0 * cols;
                 const double* pb = vb.data() + r0 * cols;
                 panels[c] = eval::panel_stats(pa, pb, static_cast<std::size_t>(n * cols));
                 if (probabilities) eval::add_panel_kl(panels[c], pa, pb, n, cols);
                 medians[c].add_errors(pa, pb, static_cast<std::size_t>(n * cols));
               });
  eval::MetricFold fold(true);
  for (std::size_t c = 0; c < chunks; ++c) {
    fold.add(panels[c]);
    fold.merge_errors(medians[c]);
  }
  const ErrorStats s = fold.stats();
  std::optional<KlStats> kl;
  if (probabilities) kl = fold.kl();
  if (format == "json") {
    std::cout << compare_json(s, kl) << "\n";
    return;
  }
  Table t{{"metric", "value"}, {}};
  t.rows = {{"elements", std::to_string(s.count)},  {"non-finite", std::to_string(s.nonfinite)},
            {"CosSim", fmt_sim(s.cossim)},          {"1 - CosSim", fmt_err(s.one_minus_cossim)},
            {"relative L1", fmt_err(s.rel_l1)},
            {"RMSE", fmt_err(s.rmse)},              {"max |A-B|", fmt_err(s.max_abs)},
            {"bias mean(A-B)", fmt_err(s.bias)},    {"median |A-B|", fmt_err(s.median_abs)},
            {"exact matches", std::to_string(s.zero_errors)}};
  if (kl) {
    t.rows.push_back({"KL D(A||B) mean over rows", fmt_err(kl->mean)});
    t.rows.push_back({"KL D(A||B) max over rows", fmt_err(kl->max)});
  }
  std::cout << "A = " << a << ", B = " << b << " (B is the reference)\n\n" << t.markdown() << "\n";
  Table h{{"|A-B| in", "count"}, {}};
  for (auto it = s.log2_histogram.rbegin(); it != s.log2_histogram.rend(); ++it)
    h.rows.push_back({"[2^" + std::to_string(it->first) + ", 2^" + std::to_string(it->first + 1) + ")",
                      std::to_string(it->second)});
  if (!h.rows.empty()) std::cout << h.markdown();
}

}  // namespace

void add_compare(CLI::App& app) {
  auto* sub = app.add_subcommand("compare", "All error metrics of tensor A against reference tensor B");
  auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("md");
  sub->add_option("A", *a, "Tensor under test")->required();
  sub->add_option("B", *b, "Reference tensor")->required();
  sub->add_option("--name", *name, "Tensor name inside multi-tensor files");
  sub->add_option("--format", *format, "md|json")->capture_default_str();
  auto threads = std::make_shared<int>(0);
  add_threads_option(sub, *threads, "worker threads", ". The figures do not depend on it");
  sub->callback([=] {
    check_format_option(*format, {"md", "json"});
    require_threads(*threads);
    run_compare(*a, *b, *name, *format, *threads);
  });
}

}  // namespace qattn::cli
