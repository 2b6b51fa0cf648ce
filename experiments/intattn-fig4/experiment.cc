// Experiment intattn-fig4: is the softmax normaliser dominated by a few high logits (IntAttention Fig. 4)? Measured
// on the dumped logits' fp64 probabilities. See README.md; `qattn reproduce intattn-fig4` runs it.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/error.h"

namespace qattn::experiments {
namespace {

// The claim made measurable, in two parts: in the median row (a) the top 10 % of the visible keys (at least one) hold
// at least 90 % of the softmax mass, and (b) more than half of the keys contribute negligibly: e^(x - max) below the
// UINT8 table's step 1/255.
constexpr double kTopShare = 0.10, kMassShare = 0.90, kNegligibleShare = 0.5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

// intattn-fig4: per row, the mass of the top-k probabilities, the share of keys below UINT8 resolution, the share of
// keys IndexSoftmax's clip (c = 6.6) keeps.
std::string run_intattn_fig4(const ExperimentContext& ctx) {
  const std::vector<DumpLayer> dump = load_dump(ctx.tensors, DumpTarget::softmax);
  const std::vector<int> ks = {1, 2, 4, 8, 16, 32};
  std::vector<std::vector<double>> top_mass(ks.size());
  std::vector<double> top_share_mass, below_u8, inside_clip;
  std::size_t rows = 0, keys = 0;
  for (const DumpLayer& l : dump)
    for (std::size_t h = 0; h < l.p_reference.size(); ++h)
      for (std::size_t b = 0; b < l.p_reference[h].size(); ++b) {
        const RowMatrixXd& p = l.p_reference[h][b];
        const RowMatrixXd& x = l.logits[h][b];
        for (Eigen::Index i = 0; i < p.rows(); ++i) {
          std::vector<double> row;
          double m = -INFINITY;
          for (Eigen::Index j = 0; j < p.cols(); ++j)
            if (std::isfinite(x(i, j))) row.push_back(p(i, j)), m = std::max(m, x(i, j));
          if (row.empty()) continue;
          std::sort(row.begin(), row.end(), std::greater<>());
          ++rows;
          keys = std::max(keys, row.size());
          std::vector<double> cum(row.size());
          std::partial_sum(row.begin(), row.end(), cum.begin());
          for (std::size_t k = 0; k < ks.size(); ++k) top_mass[k].push_back(cum[std::min<std::size_t>(ks[k], row.size()) - 1]);
          const std::size_t top = std::max<std::size_t>(1, static_cast<std::size_t>(std::floor(kTopShare * row.size())));
          top_share_mass.push_back(cum[top - 1]);
          std::size_t low = 0, kept = 0;
          for (Eigen::Index j = 0; j < p.cols(); ++j) {
            if (!std::isfinite(x(i, j))) continue;
            low += std::exp(x(i, j) - m) < 1.0 / 255;  // e^{x - m} below the UINT8 table's step
            kept += x(i, j) - m >= -6.6;
          }
          below_u8.push_back(static_cast<double>(low) / row.size());
          inside_clip.push_back(static_cast<double>(kept) / row.size());
        }
      }
  if (rows == 0) throw InputError(ctx.tensors, "logits", "every row is fully masked: nothing to measure");
  std::ostringstream r;
  r << "intattn-fig4: softmax mass held by the largest probabilities of each row, fp64 softmax of the dumped logits, "
    << rows << " rows of up to " << keys << " keys\n"
    << "paper (Fig. 4): a small subset of high logits dominates the normaliser; most logits contribute negligibly\n"
    << "measurable claim (ours), median row: (a) the top " << fixed(100 * kTopShare, 0) << " % of keys hold >= "
    << fixed(100 * kMassShare, 0) << " % of the mass; (b) more than " << fixed(100 * kNegligibleShare, 0)
    << " % of keys have e^(x - max) < 1/255\n\n";
  Table t{{"top k", "mass, median row", "mass, 10th percentile row", "mass, worst row"}, {}};
  for (std::size_t k = 0; k < ks.size(); ++k) {
    std::vector<double> v = top_mass[k];
    std::sort(v.begin(), v.end());
    t.rows.push_back({std::to_string(ks[k]), fixed(median(v), 4), fixed(v[v.size() / 10], 4), fixed(v.front(), 4)});
  }
  r << t.markdown() << "\n";
  const double share = median(top_share_mass);
  r << "median row: top " << fixed(100 * kTopShare, 0) << " % of keys hold " << fixed(100 * share, 1)
    << " % of the mass; " << fixed(100 * median(below_u8), 1) << " % of keys have e^(x - max) < 1/255 (below the UINT8 "
    << "table's step); " << fixed(100 * median(inside_clip), 1) << " % lie within c = 6.6 of the row maximum\n";
  const bool a = share >= kMassShare, b = median(below_u8) > kNegligibleShare;
  r << "verdict: (a) a few logits dominate: " << (a ? "HOLDS" : "DOES NOT HOLD") << "; (b) most contribute negligibly: "
    << (b ? "HOLDS" : "DOES NOT HOLD") << "; " << (a && b ? "REPRODUCED" : a || b ? "PARTLY REPRODUCED" : "NOT REPRODUCED")
    << " on these rows\n";
  return r.str();
}

}  // namespace qattn::experiments
