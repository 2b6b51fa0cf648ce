// The "rtn" weight quantizer (docs/quantizers.md "Weight quantizers"): round to nearest, per output column and
// input group.
#include "qattn/reference/weight_quant.h"

#include <memory>

#include "qattn/reference/quant.h"
#include "weight_files.h"

namespace qattn::ref {

RowMatrixXd rtn_weights(const MatrixView& w, const WeightQuantConfig& c) {
  return quantize(w, weight_files::weight_grid(c), Tiling{c.group, 1}).dequantize();
}

namespace {

class RtnWeights final : public WeightQuantizer {
 public:
  explicit RtnWeights(const ParamMap& p) : config_(weight_files::config(p)) {}
  RowMatrixXd apply(const MatrixView& w, const MatrixView&) const override { return rtn_weights(w, config_); }

 private:
  WeightQuantConfig config_;
};

}  // namespace

void register_rtn_weights(WeightRegistry& r) {
  r.add({{"rtn", "round-to-nearest: asymmetric [0, 2^b - 1], integer zero point, per output column and input group",
          weight_files::common_params(), {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<RtnWeights>(p); }});
}

}  // namespace qattn::ref
