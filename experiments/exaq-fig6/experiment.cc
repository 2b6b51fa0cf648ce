// Experiment exaq-fig6: does the standard deviation of the softmax input fall in [0.9, 3.4], the range EXAQ fits its
// clip line on (EXAQ Fig. 6, Section 4)? Measured on the dumped logits. See README.md; `qattn reproduce exaq-fig6`.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/error.h"
#include "qattn/reference/exaq.h"

namespace qattn::experiments {
namespace {

constexpr double kLow = 0.9, kHigh = 3.4;  // the range of Table 1's fit

// Population standard deviation of the finite entries (masked logits are -inf); NaN when there are none.
double finite_std(const double* x, Eigen::Index n) {
  double sum = 0, sq = 0;
  Eigen::Index count = 0;
  for (Eigen::Index i = 0; i < n; ++i)
    if (std::isfinite(x[i])) sum += x[i], sq += x[i] * x[i], ++count;
  if (count == 0) return NAN;
  const double mean = sum / count;
  return std::sqrt(std::max(0.0, sq / count - mean * mean));
}

double share_in_range(const std::vector<double>& v) {
  const auto in = std::count_if(v.begin(), v.end(), [](double s) { return s >= kLow && s <= kHigh; });
  return v.empty() ? NAN : static_cast<double>(in) / static_cast<double>(v.size());
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;  // a head whose rows are all masked
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

// The rows of m with each row's maximum subtracted (masked entries stay -inf): the softmax input EXAQ quantises.
RowMatrixXd max_subtracted(const RowMatrixXd& m) {
  RowMatrixXd x = m;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    double mx = -INFINITY;
    for (Eigen::Index j = 0; j < x.cols(); ++j) mx = std::max(mx, x(i, j));
    if (std::isfinite(mx)) x.row(i).array() -= mx;
  }
  return x;
}

}  // namespace

// exaq-fig6: sigma of each head's whole max-subtracted logits tensor (what EXAQ's official code and exaq_stats
// compute, the sigma Table 1's line takes), of its raw logits (for comparison), and of each row.
std::string run_exaq_fig6(const ExperimentContext& ctx) {
  const std::vector<DumpLayer> dump = load_dump(ctx.tensors, DumpTarget::softmax);
  Table t{{"layer", "head", "tensor sigma", "raw tensor sigma", "row sigma p10", "row sigma median", "row sigma p90",
           "rows in range"},
          {}};
  std::vector<double> tensor_sigmas, all_rows;
  for (const DumpLayer& l : dump)
    for (std::size_t h = 0; h < l.logits.size(); ++h) {
      std::vector<double> values, rows;
      ref::ExaqStatsAccumulator acc;  // population sigma of the max-subtracted logits, every batch entry
      std::vector<RowMatrixXd> shifted;
      for (const RowMatrixXd& m : l.logits[h]) shifted.push_back(max_subtracted(m));
      for (const RowMatrixXd& x : shifted) acc.add_first(x);
      acc.begin_second();
      for (const RowMatrixXd& x : shifted) acc.add_second(x);
      for (const RowMatrixXd& m : l.logits[h]) {
        values.insert(values.end(), m.data(), m.data() + m.size());
        for (Eigen::Index i = 0; i < m.rows(); ++i) {
          const Eigen::RowVectorXd row = m.row(i);
          const double s = finite_std(row.data(), row.size());
          if (std::isfinite(s)) rows.push_back(s);
        }
      }
      const double raw = finite_std(values.data(), static_cast<Eigen::Index>(values.size()));
      const double ts = acc.stats().sigma;
      tensor_sigmas.push_back(ts);
      all_rows.insert(all_rows.end(), rows.begin(), rows.end());
      t.rows.push_back({std::to_string(l.layer), std::to_string(l.heads[h]), fixed(ts, 3), fixed(raw, 3),
                        fixed(percentile(rows, 0.1), 3),
                        fixed(percentile(rows, 0.5), 3), fixed(percentile(rows, 0.9), 3),
                        fixed(100 * share_in_range(rows), 1) + " %"});
    }
  if (all_rows.empty()) throw InputError(ctx.tensors, "logits", "every row is fully masked: nothing to measure");
  const double heads_in = share_in_range(tensor_sigmas), rows_in = share_in_range(all_rows);
  std::ostringstream r;
  r << "exaq-fig6: standard deviation of the softmax input (the dumped logits), per head tensor (after each row's "
       "maximum is subtracted, as EXAQ's code and exaq_stats compute it; raw: before) and per row, "
    << tensor_sigmas.size() << " heads, " << all_rows.size() << " rows\n"
    << "paper (Section 4, Fig. 6): most standard deviations occur in [" << fixed(kLow, 1) << ", " << fixed(kHigh, 1)
    << "], the range Table 1's lines are fitted on\n\n"
    << t.markdown() << "\n"
    << "in [" << fixed(kLow, 1) << ", " << fixed(kHigh, 1) << "]: " << fixed(100 * heads_in, 1) << " % of head tensors, "
    << fixed(100 * rows_in, 1) << " % of rows (row sigma p10 / median / p90: " << fixed(percentile(all_rows, 0.1), 3)
    << " / " << fixed(percentile(all_rows, 0.5), 3) << " / " << fixed(percentile(all_rows, 0.9), 3) << ")\n"
    << "verdict: most head tensors in the range: " << (heads_in > 0.5 ? "HOLDS" : "DOES NOT HOLD")
    << "; most rows in the range: " << (rows_in > 0.5 ? "HOLDS" : "DOES NOT HOLD") << "\n";
  return r.str();
}

}  // namespace qattn::experiments
