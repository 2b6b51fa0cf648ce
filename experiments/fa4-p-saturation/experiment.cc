// Experiment fa4-p-saturation: FlashAttention-4's FP8 forward, whose running max is kept while it grows by at most
// rescale_threshold, with max_offset 8: P~ reaches 2^(8 + threshold) against E4M3's 448. The registered fa4-fp8 runs
// on the loop of docs/kernels-as-data.md; `qattn kernel check` is asked about each configuration. See README.md;
// `qattn reproduce fa4-p-saturation` runs it.
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/metrics.h"
#include "qattn/parallel.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/registry.h"

namespace qattn::experiments {
namespace {

// FA4's FP8 forward (the registered fa4-fp8: S and P V on B200's tcgen05.mma, MMA-Sim's model, its software exp2)
// with rescale_threshold t, O in float32.
ref::FlashKernel fa4_fp8(double threshold) {
  const auto m = ref::reference_registry().create("fa4-fp8:out=fp32,rescale-threshold=" + fixed(threshold, 2));
  return *ref::kernel_of(*m);
}

}  // namespace

std::string run_fa4_p_saturation(const ExperimentContext& ctx) {
  const std::vector<int> lengths = {64, 127, 128, 129, 136, 192, 255, 256, 257, 384, 512};
  const std::vector<double> thresholds = {0, 0.5, 0.75, 1, 2, 4, 8};
  const Eigen::Index rows = 64, d = 128;
  // 64 decode queries over one cache of 512 keys (prefixes of it), N(0, 1) each, seed 2577
  std::mt19937_64 g(2577);
  std::normal_distribution<double> n(0, 1);
  RowMatrixXd q(rows, d), k(512, d), v(512, d);
  for (RowMatrixXd* x : {&q, &k, &v})
    for (Eigen::Index i = 0; i < x->size(); ++i) x->data()[i] = n(g);
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<double> cossim(lengths.size() * thresholds.size());
  parallel_for(cossim.size(), ctx.threads, [&](std::size_t i) {
    const int l = lengths[i / thresholds.size()];
    const double t = thresholds[i % thresholds.size()];
    const RowMatrixXd kk = k.topRows(l), vv = v.topRows(l);
    const RowMatrixXd ref = ref::float_attention(q, kk, vv, scale, ref::FloatPrecision::fp64).o;
    const RowMatrixXd o = ref::flash_attention(q, kk, vv, scale, {}, fa4_fp8(t)).o;
    cossim[i] = compare(std::span(o.data(), o.size()), std::span(ref.data(), ref.size())).cossim;
  });
  std::ostringstream r;
  r << "fa4-p-saturation: FlashAttention-4's FP8 P path, max_offset 8, rescale_threshold t (Dao-AILab/flash-attention"
       "#2577)\n\n";
  Table verdicts{{"rescale_threshold", "largest P~", "kernel check"}, {}};
  std::vector<bool> violated;
  for (double t : thresholds) {
    const auto contracts = ref::kernel_contracts(fa4_fp8(t));
    violated.push_back(contracts[0].violated);
    verdicts.rows.push_back({fixed(t, 2), fixed(std::exp2(8 + t), 1), contracts[0].violated ? "violated" : "holds"});
  }
  r << "What `qattn kernel check` derives from each description (E4M3's largest value is 448; the contract "
       "max_offset + rescale_threshold <= log2 448 = 8.807):\n\n"
    << verdicts.markdown() << "\n";
  Table t{{"kv length"}, {}};
  for (double th : thresholds) t.header.push_back("t = " + fixed(th, 2));
  for (std::size_t a = 0; a < lengths.size(); ++a) {
    std::vector<std::string> row{std::to_string(lengths[a])};
    for (std::size_t b = 0; b < thresholds.size(); ++b) row.push_back(fixed(cossim[a * thresholds.size() + b], 6));
    t.rows.push_back(row);
  }
  r << "O CosSim against the fp64 reference, 64 decode queries (d = 128, N(0, 1) Q, K, V, seed 2577, scale "
       "1/sqrt(d)), keys the first L of one cache, key blocks of 128 visited last first:\n\n"
    << t.markdown() << "\n";
  // Verdicts
  const auto at = [&](int l, std::size_t b) {
    for (std::size_t a = 0; a < lengths.size(); ++a)
      if (lengths[a] == l) return cossim[a * thresholds.size() + b];
    return 0.0;
  };
  double worst_fixed = 1, worst_single = 1;
  for (std::size_t a = 0; a < lengths.size(); ++a)
    for (std::size_t b = 0; b < thresholds.size(); ++b) {
      const double c = cossim[a * thresholds.size() + b];
      if (!violated[b]) worst_fixed = std::min(worst_fixed, c);
      if (lengths[a] <= 128) worst_single = std::min(worst_single, c);
    }
  const std::size_t t4 = 5;  // t = 4
  r << "Verdicts:\n"
    << "- One key block (L <= 128): the max is set by the block itself and P~ <= 2^8 whatever t; worst CosSim "
    << fixed(worst_single, 6) << ". The cliff between 127 and 128 keys that #2577 reports (0.9987 -> 0.863) is "
    << "NOT reproduced: in this model it needs a second block.\n"
    << "- t = 4 (the reported configuration): CosSim " << fixed(at(128, t4), 6) << " at 128 keys, " << fixed(at(129, t4), 6)
    << " at 129, " << fixed(at(256, t4), 6) << " at 256, " << fixed(at(257, t4), 6) << " at 257: a cliff at the first "
    << "block boundary, where a later block's max exceeds the first block's by at most t and P~ saturates at 448.\n"
    << "- Configurations kernel check passes (t <= 0.807): worst CosSim " << fixed(worst_fixed, 6)
    << " over every length: the fixed rule removes the cliff.\n"
    << "- Worst CosSim over every length per threshold, with kernel check's verdict:";
  for (std::size_t b = 0; b < thresholds.size(); ++b) {
    double worst = 1;
    for (std::size_t a = 0; a < lengths.size(); ++a) worst = std::min(worst, cossim[a * thresholds.size() + b]);
    r << (b ? "," : "") << " t = " << fixed(thresholds[b], 2) << ": " << fixed(worst, 6) << " ("
      << (violated[b] ? "violated" : "holds") << ")";
  }
  r << ". The check is a bound: t = 1 lets P~ reach 512, which clips only the top weights and costs little here.\n";
  return r.str();
}

}  // namespace qattn::experiments
