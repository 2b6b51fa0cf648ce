// What the KV quantizer files (reference/src/quantizers/*_kv.cc) share; not installed. Each file defines one
// quantizer and `void register_<file stem>(KvRegistry&)`, which the registry calls in its order (kv_quant.cc). The
// definitions live in kv_quant.cc.
#pragma once

#include <vector>

#include "qattn/reference/kv_quant.h"

namespace qattn::ref::kv_files {

// x rounded to binary16 (round to nearest even, saturating): what a cache keeps in fp16.
RowMatrixXd round_fp16(const MatrixView& x);
// std::invalid_argument unless k and v hold the same nonzero number of heads, each with as many tokens in k as in v.
void check_heads(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v);

}  // namespace qattn::ref::kv_files
