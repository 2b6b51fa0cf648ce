// The attention wrapper of a softmax model (qattn/reference/method_entries.h) and its prepared calls.
#include <algorithm>
#include <limits>

#include "qattn/reference/fp64_product.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

// scale * q k^T in float64, refused where it overflows (row indices counted from row0), with the mask applied.
RowMatrixXd masked_logits(const MatrixView& q, const MatrixView& k, double scale, const AttentionMask& mask,
                          Eigen::Index row0) {
  RowMatrixXd s = product_abt(q, k);  // fl(fl(q k^T) scale), q k^T in product_abt's order
  s *= scale;
  // Beyond float64 a logit is +-inf; -inf would read as masked, so overflow is refused before the mask applies.
  if (!s.allFinite())
    for (Eigen::Index i = 0; i < s.size(); ++i)
      if (!std::isfinite(s.data()[i]))
        throw_logit_overflow("this softmax model", "float64", row0 + i / s.cols(), i % s.cols());
  mask.apply_to_logits(s);
  return s;
}

// A softmax model's prepared call. With a tensor-wide state (a scope): the passes over the logits in blocks of rows
// in the constructor, then each block's logits again in rows(). Without one, each block is an attention call of its
// own. A block's logits (fp64_product.h) are the whole matrix's rows, and the fp64 reference's (rows_from_logits).
class SoftmaxModelCall final : public PreparedCall {
 public:
  SoftmaxModelCall(const Method& method, std::unique_ptr<LogitScope> scope, const MatrixView& q, const MatrixView& k,
                   const MatrixView& v, double scale, const AttentionMask& mask)
      : PreparedCall(q.rows()), method_(method), scope_(std::move(scope)), q_(q), k_(k), v_(v), scale_(scale),
        mask_(mask) {
    if (!scope_) return;
    const Eigen::Index lq = q.rows(), block = std::max<Eigen::Index>(64, (Eigen::Index{1} << 20) / std::max<Eigen::Index>(k.rows(), 1) / 64 * 64);
    for (int pass = 0; pass < scope_->passes(); ++pass)
      for (Eigen::Index r0 = 0; r0 < lq; r0 += block) {
        const Eigen::Index n = std::min(block, lq - r0);
        scope_->observe(pass, masked_logits(q.middleRows(r0, n), k, scale, mask.rows(r0, n, lq), r0));
      }
  }

 protected:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const override {
    return softmax_then_pv(masked_logits(q_.middleRows(r0, n), k_, scale_, mask_.rows(r0, n, q_.rows()), r0));
  }
  std::optional<AttentionResult> rows_from_logits_impl(Eigen::Index, Eigen::Index,
                                                       const RowMatrixXd& logits) const override {
    // +inf or NaN: masked_logits would refuse the overflow; rows() names it
    if (logits.cols() != k_.rows() || !(logits.array() < std::numeric_limits<double>::infinity()).all())
      return std::nullopt;
    return softmax_then_pv(logits);
  }

 private:
  AttentionResult softmax_then_pv(const RowMatrixXd& logits) const {
    AttentionResult r;
    r.p = scope_ ? scope_->softmax_rows(logits) : method_.softmax_rows(logits);
    r.o = product_ab(r.p, v_);
    return r;
  }

  const Method& method_;
  std::unique_ptr<LogitScope> scope_;
  const MatrixView q_, k_, v_;
  double scale_;
  const AttentionMask& mask_;
};

}  // namespace

AttentionResult SoftmaxModelMethod::attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                   double scale, const AttentionMask& mask) const {
  require_attention_shapes(q, k, v);
  AttentionResult r;
  r.p = softmax_rows(masked_logits(q, k, scale, mask, 0));
  r.o = product_ab(r.p, v);
  return r;
}

std::unique_ptr<PreparedCall> SoftmaxModelMethod::prepare_impl(const MatrixView& q, const MatrixView& k,
                                                               const MatrixView& v, double scale,
                                                               const AttentionMask& mask) const {
  require_attention_shapes(q, k, v);
  return std::make_unique<SoftmaxModelCall>(*this, logit_scope(), q, k, v, scale, mask);
}

RowMatrixXd SoftmaxModelMethod::softmax_with_scope(LogitScope& scope, const MatrixView& logits) {
  const RowMatrixXd x = logits;
  for (int pass = 0; pass < scope.passes(); ++pass) scope.observe(pass, x);
  return scope.softmax_rows(logits);
}

}  // namespace qattn::ref
