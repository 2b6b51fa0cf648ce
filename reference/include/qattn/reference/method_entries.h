// What the method files (reference/src/*_method.cc) share: the attention wrapper of a softmax model and
// IndexSoftmax's parameters. Each method file registers its entries with `void register_<file stem>(Registry&)`,
// which the build collects (reference/src/registry.cc).
#pragma once

#include <cmath>

#include "qattn/method.h"
#include "qattn/reference/index_softmax.h"

namespace qattn::ref {

// A softmax model inside attention: exact fp64 logits scale * q k^T, the model's softmax_rows, exact fp64 P V. The
// attention table of such a method isolates its softmax approximation.
// Whether Eigen's float64 GEMM gives each element the same bits wherever a block of 64 rows of the left operand
// starts (MethodTraits::query_block_rows): measured true on x86-64, false under NEON (aarch64).
#if defined(__x86_64__)
inline constexpr bool kFp64GemmBlockInvariant = true;
#else
inline constexpr bool kFp64GemmBlockInvariant = false;
#endif

class SoftmaxModelMethod : public Method {
 public:
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                            const AttentionMask& mask) const override {
    AttentionResult r;
    RowMatrixXd s = (q * k.transpose()) * scale;
    // Beyond float64 a logit is +-inf; -inf would read as masked, so overflow is refused before the mask applies.
    if (!s.allFinite())
      for (Eigen::Index i = 0; i < s.size(); ++i)
        if (!std::isfinite(s.data()[i])) throw_logit_overflow("this softmax model", "float64", i / s.cols(), i % s.cols());
    mask.apply_to_logits(s);
    r.p = softmax_rows(s);
    r.o = r.p * v;
    return r;
  }
};

// IndexSoftmax's parameters, presets and their parsing, shared by "index" and "intattention".
std::vector<ParamInfo> index_softmax_param_infos();
std::vector<PresetInfo> index_softmax_presets();
IndexSoftmaxParams index_softmax_params(const ParamMap& m);

}  // namespace qattn::ref
