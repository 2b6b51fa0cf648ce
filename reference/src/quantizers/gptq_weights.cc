// The "gptq" weight quantizer (docs/quantizers.md "Weight quantizers"): GPTQ, column by column with second-order
// error feedback from the calibration inputs.
#include "qattn/reference/weight_quant.h"

#include <Eigen/Cholesky>
#include <algorithm>
#include <memory>
#include <stdexcept>

#include "qattn/reference/quant.h"
#include "weight_files.h"

namespace qattn::ref {

RowMatrixXd gptq_weights(const MatrixView& w_in, const MatrixView& x, const WeightQuantConfig& c, GptqOptions o) {
  weight_files::check_shapes(w_in, x);
  const QuantGrid grid = weight_files::weight_grid(c);
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

namespace {

class GptqWeights final : public WeightQuantizer {
 public:
  explicit GptqWeights(const ParamMap& p) : config_(weight_files::config(p)) {
    options_.block = p.integer("block"), options_.damp = p.real("damp");
  }
  RowMatrixXd apply(const MatrixView& w, const MatrixView& x) const override {
    return gptq_weights(w, x, config_, options_);
  }

 private:
  WeightQuantConfig config_;
  GptqOptions options_;
};

}  // namespace

void register_gptq_weights(WeightRegistry& r) {
  auto params = weight_files::common_params();
  params.push_back(int_param("block", "128", "lazy-update block of input rows", 1, 1 << 20));
  params.push_back(ParamInfo{"damp", ParamType::real, "0.01", "dampening: fraction of the mean diagonal of H", {}, 0, 1});
  r.add({{"gptq", "GPTQ: column-by-column quantization with second-order error feedback (H = 2 X^T X)", params, {},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<GptqWeights>(p); }});
}

}  // namespace qattn::ref
