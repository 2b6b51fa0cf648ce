// Weight quantizers for projection weights W [in, out] (the layout `y = x W + b` of the model's own tensors), with
// calibration inputs X [n, in] (docs/quantizers.md):
//
//   rtn   round-to-nearest: asymmetric grid [0, 2^b - 1] with an integer zero point and a range holding 0, one
//         scale and zero point per output column and group of `group` input rows (0: the whole column)
//   gptq  GPTQ: H = 2 X^T X, dampened by 1% of its mean diagonal (dead inputs, H_ii = 0, get H_ii = 1 and a zero
//         weight row), U = the upper Cholesky factor of H^-1; input rows quantized one at a time on the grid of
//         their group (computed from the already-updated rows when the group starts), the error
//         e = (w - q) / U_ii fed back into the later rows of the block, w_j -= e U_ij, and lazily into the rows
//         after the block (blocks of 128), W[after] -= U[block, after]^T E
//   awq   AWQ: S_x = mean |x| per input channel; for alpha = r / 20, r = 0..19 (the official grid), s = S_x^alpha
//         clamped to >= 1e-4 and divided by sqrt(max s min s); W^ = diag(1/s) rtn(diag(s) W); keeps the alpha with
//         the smallest |X W - X W^|_F (the official code's weight-clipping search is not modelled)
#pragma once

#include "qattn/reference/param_registry.h"
#include "qattn/tensor.h"

namespace qattn::ref {

struct WeightQuantConfig {
  int bits = 4;
  Eigen::Index group = 128;  // input rows sharing a scale and zero point (0 = the whole column)
};

RowMatrixXd rtn_weights(const MatrixView& w, const WeightQuantConfig& c);

struct GptqOptions {
  double damp = 0.01;
  Eigen::Index block = 128;
};
RowMatrixXd gptq_weights(const MatrixView& w, const MatrixView& x, const WeightQuantConfig& c, GptqOptions o = {});

struct AwqResult {
  RowMatrixXd w;
  double alpha = 0;
};
// The alphas searched: linspace(0, 1, grid) = r / (grid - 1) as the primer writes it (alpha = 1 included; a grid of
// 1 is alpha = 0 alone), or r / grid for r = 0 .. grid - 1 as the official AWQ code steps (alpha = 1 never tried).
enum class AwqGrid { linspace, official };
AwqResult awq_weights(const MatrixView& w, const MatrixView& x, const WeightQuantConfig& c, int grid = 20,
                      AwqGrid spacing = AwqGrid::linspace);

// |X W^ - X W|_F / |X W|_F.
double relative_output_error(const MatrixView& x, const MatrixView& w, const MatrixView& w_hat);

// A weight quantizer from the registry: W^ from W [in, out] and the calibration inputs X [n, in].
class WeightQuantizer {
 public:
  virtual ~WeightQuantizer() = default;
  virtual RowMatrixXd apply(const MatrixView& w, const MatrixView& x) const = 0;
};

// rtn, gptq and awq with their parameters (`qattn methods` lists them; `qattn analyze --weights SPEC`).
using WeightRegistry = ParamRegistry<WeightQuantizer>;
const WeightRegistry& weight_registry();

}  // namespace qattn::ref
