#include "qattn/reference/weight_quant.h"

#include <Eigen/Cholesky>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "qattn/reference/quant.h"

namespace qattn::ref {

namespace {

QuantGrid weight_grid(const WeightQuantConfig& c) {
  if (c.bits < 2 || c.bits > 8) throw std::invalid_argument("weight quantization bits must be 2..8");
  if (c.group < 0) throw std::invalid_argument("weight quantization group must be >= 0");
  return QuantGrid::unsigned_bits(c.bits, QuantMode::asymmetric);
}

void check_shapes(const MatrixView& w, const MatrixView& x) {
  if (x.cols() != w.rows())
    throw std::invalid_argument("X has " + std::to_string(x.cols()) + " features, W has " + std::to_string(w.rows()) +
                                " input rows");
}

}  // namespace

RowMatrixXd rtn_weights(const MatrixView& w, const WeightQuantConfig& c) {
  return quantize(w, weight_grid(c), Tiling{c.group, 1}).dequantize();
}

RowMatrixXd gptq_weights(const MatrixView& w_in, const MatrixView& x, const WeightQuantConfig& c, GptqOptions o) {
  check_shapes(w_in, x);
  const QuantGrid grid = weight_grid(c);
  const Eigen::Index n = w_in.rows(), out = w_in.cols();
  RowMatrixXd w = w_in;
  Eigen::MatrixXd h = 2.0 * (x.transpose() * x);
  for (Eigen::Index i = 0; i < n; ++i)
    if (h(i, i) == 0) h(i, i) = 1, w.row(i).setZero();
  h.diagonal().array() += o.damp * h.diagonal().mean();
  const Eigen::MatrixXd hinv = h.llt().solve(Eigen::MatrixXd::Identity(n, n));
  Eigen::LLT<Eigen::MatrixXd> llt(hinv);
  if (llt.info() != Eigen::Success) throw std::runtime_error("GPTQ: H^-1 is not positive definite");
  const Eigen::MatrixXd u = llt.matrixL().transpose();  // H^-1 = U^T U
  RowMatrixXd q(n, out);
  Eigen::RowVectorXd scale(out), zero(out);
  const Eigen::Index group = c.group > 0 ? c.group : n;
  for (Eigen::Index b0 = 0; b0 < n; b0 += o.block) {
    const Eigen::Index b1 = std::min(n, b0 + o.block);
    RowMatrixXd err(b1 - b0, out);
    for (Eigen::Index i = b0; i < b1; ++i) {
      if (i % group == 0) {  // the group's grid, from the rows as updated so far
        const QuantizedMatrix g = quantize(w.middleRows(i, std::min(group, n - i)), grid, Tiling{0, 1});
        scale = g.scale.row(0);
        zero = g.zero.row(0);
      }
      for (Eigen::Index j = 0; j < out; ++j) {
        const double code = std::clamp(quant_round(w(i, j) / scale(j), grid.rounding) + zero(j), double(grid.q_min),
                                       double(grid.q_max));
        q(i, j) = scale(j) * (code - zero(j));
      }
      err.row(i - b0) = (w.row(i) - q.row(i)) / u(i, i);
      for (Eigen::Index k = i + 1; k < b1; ++k) w.row(k) -= u(i, k) * err.row(i - b0);
    }
    if (b1 < n) w.bottomRows(n - b1) -= u.block(b0, b1, b1 - b0, n - b1).transpose() * err;
  }
  return q;
}

AwqResult awq_weights(const MatrixView& w, const MatrixView& x, const WeightQuantConfig& c, int grid,
                      AwqGrid spacing) {
  check_shapes(w, x);
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

double relative_output_error(const MatrixView& x, const MatrixView& w, const MatrixView& w_hat) {
  const RowMatrixXd y = x * w;
  return (x * w_hat - y).norm() / y.norm();
}

namespace {

constexpr Choice<AwqGrid> kAwqGrids[] = {{"linspace", AwqGrid::linspace}, {"official", AwqGrid::official}};

class RegisteredWeightQuantizer final : public WeightQuantizer {
 public:
  enum class Kind { rtn, gptq, awq };
  RegisteredWeightQuantizer(Kind kind, const ParamMap& p)
      : kind_(kind), config_{static_cast<int>(p.integer("bits")), p.integer("group")} {
    if (kind == Kind::gptq) gptq_.block = p.integer("block"), gptq_.damp = p.real("damp");
    if (kind == Kind::awq) grid_ = static_cast<int>(p.integer("grid")), spacing_ = choice_value(p, "alphas", kAwqGrids);
  }
  RowMatrixXd apply(const MatrixView& w, const MatrixView& x) const override {
    switch (kind_) {
      case Kind::rtn: return rtn_weights(w, config_);
      case Kind::gptq: return gptq_weights(w, x, config_, gptq_);
      case Kind::awq: return awq_weights(w, x, config_, grid_, spacing_).w;
    }
    throw std::logic_error("weight quantizer kind");
  }

 private:
  Kind kind_;
  WeightQuantConfig config_;
  GptqOptions gptq_;
  int grid_ = 20;
  AwqGrid spacing_ = AwqGrid::linspace;
};

WeightRegistry build_weight_registry() {
  using Kind = RegisteredWeightQuantizer::Kind;
  auto common = [] {
    return std::vector<ParamInfo>{int_param("bits", "4", "code bits", 2, 8),
                                  int_param("group", "128", "input rows per scale and zero point (0 = whole column)", 0, 1 << 20)};
  };
  WeightRegistry r("weight quantizer");
  r.add({{"rtn", "round-to-nearest: asymmetric [0, 2^b - 1], integer zero point, per output column and input group",
          common(), {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<RegisteredWeightQuantizer>(Kind::rtn, p); }});
  auto gptq = common();
  gptq.push_back(int_param("block", "128", "lazy-update block of input rows", 1, 1 << 20));
  gptq.push_back(ParamInfo{"damp", ParamType::real, "0.01", "dampening: fraction of the mean diagonal of H", {}, 0, 1});
  r.add({{"gptq", "GPTQ: column-by-column quantization with second-order error feedback (H = 2 X^T X)", gptq, {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<RegisteredWeightQuantizer>(Kind::gptq, p); }});
  auto awq = common();
  awq.push_back(int_param("grid", "20", "points of the alpha grid", 1, 1000));
  awq.push_back(choice_param("alphas", "linspace",
                             "linspace(0, 1, grid) as the primer writes it, or r / grid, r < grid (the official code)",
                             choice_names(kAwqGrids)));
  r.add({{"awq", "AWQ: per-input-channel scaling s = S_x^alpha searched on a grid, then RTN", awq,
          {{"official", {{"alphas", "official"}}, "the official code's alpha steps r / 20 (alpha = 1 not tried)"}}, nullptr},
         [](const ParamMap& p) { return std::make_unique<RegisteredWeightQuantizer>(Kind::awq, p); }});
  return r;
}

}  // namespace

const WeightRegistry& weight_registry() {
  static const WeightRegistry r = build_weight_registry();
  return r;
}

}  // namespace qattn::ref
