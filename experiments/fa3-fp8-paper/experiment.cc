// Experiment fa3-fp8-paper: FlashAttention-3's FP8 accuracy features (block quantisation, incoherent processing)
// against the official kernel's per-tensor FP8, on the paper's outlier inputs. See README.md; `qattn reproduce
// fa3-fp8-paper` runs it.
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/parallel.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/registry.h"

namespace qattn::experiments {

std::string run_fa3_fp8_paper(const ExperimentContext& ctx) {
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"fa3-fp8:out=fp32", "per tensor (the official kernel's call)"},
      {"fa3-fp8:out=fp32,block-quant=true", "block quantisation"},
      {"fa3-fp8:out=fp32,incoherent=true", "incoherent processing"},
      {"fa3-fp8@paper:out=fp32", "both (fa3-fp8@paper)"},
  };
  const std::vector<std::string> inputs = {"N(0, 1)", "N(0, 1) + N(0, 100) Bernoulli(0.001)"};
  const Eigen::Index l = ctx.fast ? 512 : 2048, d = 128;
  constexpr int kSeeds = 4;
  // rmse[(input * seeds + seed) * variants + variant]
  std::vector<double> rmse(inputs.size() * kSeeds * variants.size());
  parallel_for(inputs.size() * kSeeds, ctx.threads, [&](std::size_t item) {
    const std::size_t input = item / kSeeds, seed = item % kSeeds;
    std::mt19937_64 g(240708 + 97 * item);
    std::normal_distribution<double> n(0, 1);
    std::bernoulli_distribution outlier(0.001);
    const auto draw = [&] {
      RowMatrixXd x(l, d);
      for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = n(g) + (input == 1 && outlier(g) ? 10 * n(g) : 0.0);
      return x;
    };
    const RowMatrixXd q = draw(), k = draw(), v = draw();
    const double scale = 1 / std::sqrt(static_cast<double>(d));
    const RowMatrixXd exact = ref::float_attention(q, k, v, scale, ref::FloatPrecision::fp64).o;
    for (std::size_t a = 0; a < variants.size(); ++a) {
      const RowMatrixXd o = ref::reference_registry().create(variants[a].first)->attention(q, k, v, scale, {}).o;
      rmse[(input * kSeeds + seed) * variants.size() + a] = std::sqrt((o - exact).squaredNorm() / static_cast<double>(o.size()));
    }
  });
  const auto mean = [&](std::size_t input, std::size_t a) {
    double s = 0;
    for (int seed = 0; seed < kSeeds; ++seed) s += rmse[(input * kSeeds + seed) * variants.size() + a];
    return s / kSeeds;
  };
  std::ostringstream r;
  r << "fa3-fp8-paper: FlashAttention-3's FP8 block quantisation and incoherent processing (Sec. 3.3, the error table "
       "of Sec. 4.3)\n\n";
  Table t{{"FP8 variant", "spec"}, {}};
  for (const std::string& in : inputs) t.header.push_back("O RMSE, " + in);
  t.header.push_back("x per tensor (outliers)");
  for (std::size_t a = 0; a < variants.size(); ++a)
    t.rows.push_back({variants[a].second, "`" + variants[a].first + "`", fmt_err(mean(0, a)), fmt_err(mean(1, a)),
                      fixed(mean(1, a) / mean(1, 0), 3)});
  r << "O RMSE against the fp64 reference, mean of " << kSeeds << " seeds, L = " << l
    << ", d = 128, scale 1/sqrt(d), Q, K and V drawn alike; the H100 FP8 wgmma for S and P V, blocks of 128 queries "
       "and 128 keys for the block scales, V per tensor:\n\n"
    << t.markdown() << "\n";
  const double ratio = mean(1, 0) / mean(1, 3);
  r << "Verdicts:\n"
    << "- The paper's table: per-tensor FP8 2.4e-2, both features 9.1e-3 (2.6 x lower). Here, on outlier inputs: "
    << fmt_err(mean(1, 0)) << " against " << fmt_err(mean(1, 3)) << ", " << fixed(ratio, 2) << " x lower: "
    << (ratio > 1.5 ? "fa3-fp8@paper beats fa3-fp8, as the paper claims (by less than its 2.6 x)" : "fa3-fp8@paper does NOT beat fa3-fp8 here")
    << " (the absolute values differ: the paper's sequence length and head dimension are not stated).\n"
    << "- Incoherent processing carries the gain (" << fixed(mean(1, 2) / mean(1, 0), 3)
    << " x per tensor); block quantisation alone changes little (" << fixed(mean(1, 1) / mean(1, 0), 3)
    << " x): outliers at a rate of 0.001 sit in nearly every 128-row block.\n";
  return r.str();
}

}  // namespace qattn::experiments
