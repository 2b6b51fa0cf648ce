// The weight quantizers' registry and what their files (reference/src/quantizers/*_weights.cc) share.
#include "qattn/reference/weight_quant.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/reference/quant.h"
#include "weight_files.h"

namespace qattn::ref {

// ---- what the quantizer files share (weight_files.h) ----------------------------------------------------------

namespace weight_files {

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

WeightQuantConfig config(const ParamMap& p) { return {static_cast<int>(p.integer("bits")), p.integer("group")}; }

std::vector<ParamInfo> common_params() {
  return {int_param("bits", "4", "code bits", 2, 8),
          int_param("group", "128", "input rows per scale and zero point (0 = whole column)", 0, 1 << 20)};
}

}  // namespace weight_files

double relative_output_error(const MatrixView& x, const MatrixView& w, const MatrixView& w_hat) {
  const RowMatrixXd y = x * w;
  return (x * w_hat - y).norm() / y.norm();
}

// ---- the registry: one file per quantizer, reference/src/quantizers/<name>_weights.cc, registered here in this order
// (the order `qattn methods` lists them; the CTest `extending` checks that the files and the registry hold the same
// names) ------------------------------------------------------------------------------------------------------------

void register_rtn_weights(WeightRegistry& registry);
void register_gptq_weights(WeightRegistry& registry);
void register_awq_weights(WeightRegistry& registry);

const WeightRegistry& weight_registry() {
  static const WeightRegistry r = [] {
    WeightRegistry registry("weight quantizer");
    register_rtn_weights(registry), register_gptq_weights(registry), register_awq_weights(registry);
    return registry;
  }();
  return r;
}

}  // namespace qattn::ref
