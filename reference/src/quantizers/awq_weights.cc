// The "awq" weight quantizer (docs/quantizers.md "Weight quantizers"): AWQ, a per-input-channel scale searched on
// a grid of exponents, then round to nearest.
#include "qattn/reference/weight_quant.h"

#include <cmath>
#include <memory>
#include <stdexcept>

#include "weight_files.h"

namespace qattn::ref {

namespace {
constexpr Choice<AwqGrid> kAwqGrids[] = {{"linspace", AwqGrid::linspace}, {"official", AwqGrid::official}};
}  // namespace

AwqResult awq_weights(const MatrixView& w, const MatrixView& x, const WeightQuantConfig& c, int grid,
                      AwqGrid spacing) {
  weight_files::check_shapes(w, x);
  if (grid < 1) throw std::invalid_argument("AWQ: grid must be >= 1");
  const Eigen::RowVectorXd sx = x.cwiseAbs().colwise().mean();
  const RowMatrixXd y = x * w;
  AwqResult best;
  double best_err = INFINITY;
  for (int r = 0; r < grid; ++r) {
    const double alpha = spacing == AwqGrid::official ? static_cast<double>(r) / grid
                         : grid == 1                  ? 0.0
                                                      : static_cast<double>(r) / (grid - 1);
    Eigen::ArrayXd s = sx.transpose().array().pow(alpha).max(1e-4);
    s /= std::sqrt(s.maxCoeff() * s.minCoeff());
    RowMatrixXd scaled = w;
    for (Eigen::Index i = 0; i < w.rows(); ++i) scaled.row(i) *= s(i);
    RowMatrixXd wq = rtn_weights(scaled, c);
    for (Eigen::Index i = 0; i < w.rows(); ++i) wq.row(i) /= s(i);
    const double e = (x * wq - y).squaredNorm();
    if (e < best_err) best_err = e, best.w = std::move(wq), best.alpha = alpha;
  }
  return best;
}

namespace {

class AwqWeights final : public WeightQuantizer {
 public:
  explicit AwqWeights(const ParamMap& p)
      : config_(weight_files::config(p)), grid_(static_cast<int>(p.integer("grid"))),
        spacing_(choice_value(p, "alphas", kAwqGrids)) {}
  RowMatrixXd apply(const MatrixView& w, const MatrixView& x) const override {
    return awq_weights(w, x, config_, grid_, spacing_).w;
  }

 private:
  WeightQuantConfig config_;
  int grid_;
  AwqGrid spacing_;
};

}  // namespace

void register_awq_weights(WeightRegistry& r) {
  auto params = weight_files::common_params();
  params.push_back(int_param("grid", "20", "points of the alpha grid", 1, 1000));
  params.push_back(choice_param("alphas", "linspace",
                                "linspace(0, 1, grid) as the primer writes it, or r / grid, r < grid (the official code)",
                                choice_names(kAwqGrids)));
  r.add({{"awq", "AWQ: per-input-channel scaling s = S_x^alpha searched on a grid, then RTN", params,
          {{"official", {{"alphas", "official"}}, "the official code's alpha steps r / 20 (alpha = 1 not tried)"}}, nullptr},
         [](const ParamMap& p) { return std::make_unique<AwqWeights>(p); }});
}

}  // namespace qattn::ref
