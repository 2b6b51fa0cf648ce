// What the weight quantizer files (reference/src/quantizers/*_weights.cc) share; not installed. Each file defines one
// quantizer and `void register_<file stem>(WeightRegistry&)`, which the registry calls in its order
// (weight_quant.cc). The definitions live in weight_quant.cc.
#pragma once

#include <vector>

#include "qattn/reference/quant.h"
#include "qattn/reference/weight_quant.h"

namespace qattn::ref::weight_files {

// The grid [0, 2^b - 1] with an integer zero point; std::invalid_argument for bits outside 2..8 or a negative group.
QuantGrid weight_grid(const WeightQuantConfig& c);
// std::invalid_argument unless X's features are W's input rows.
void check_shapes(const MatrixView& w, const MatrixView& x);
// The parameters every weight quantizer takes (bits, group) and their values.
std::vector<ParamInfo> common_params();
WeightQuantConfig config(const ParamMap& p);

}  // namespace qattn::ref::weight_files
