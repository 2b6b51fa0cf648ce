#include "qattn/reference/float_attention.h"

#include <limits>
#include <stdexcept>

#include "qattn/float_format.h"
#include "qattn/reference/softmax.h"

namespace qattn::ref {
namespace {

const FloatFormat* storage_format(FloatPrecision p) {
  switch (p) {
    case FloatPrecision::fp16: return &kBinary16;
    case FloatPrecision::bf16: return &kBfloat16;
    default: return nullptr;
  }
}

// Rounds float entries to the 16-bit storage format in place (no-op for fp32).
void round_in_place(RowMatrixXf& m, FloatPrecision p) {
  const FloatFormat* f = storage_format(p);
  if (!f) return;
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(round_to_format(m.data()[i], *f));
}

// A float64 or float32 view rounded to the storage format of p.
template <class View>
RowMatrixXf to_storage_float(const View& m, FloatPrecision p) {
  // double -> float rounds once; for fp16/bf16 round from double directly so that no value is rounded twice. A
  // float32 input widens exactly, so it rounds as its float64 value does.
  const FloatFormat* f = storage_format(p);
  RowMatrixXf out(m.rows(), m.cols());
  Eigen::Matrix<typename View::Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> storage;
  const auto* md = packed_rows(m, storage);
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    const double x = md[i];
    out.data()[i] = f ? static_cast<float>(round_to_format(x, *f)) : static_cast<float>(x);
  }
  return out;
}

template <class View>
RowMatrixXd storage_softmax_rows(const View& logits, FloatPrecision p) {
  const RowMatrixXf x = to_storage_float(logits, p);   // R1
  RowMatrixXf prob = softmax_ref_rows(x);              // float arithmetic
  round_in_place(prob, p);                             // R3
  return prob.cast<double>();
}

}  // namespace

std::string_view precision_name(FloatPrecision p) {
  switch (p) {
    case FloatPrecision::fp64: return "fp64";
    case FloatPrecision::fp32: return "fp32";
    case FloatPrecision::fp16: return "fp16";
    case FloatPrecision::bf16: return "bf16";
  }
  return "?";
}

RowMatrixXd round_to_storage(const MatrixView& m, FloatPrecision p) {
  if (p == FloatPrecision::fp64) return m;
  return to_storage_float(m, p).cast<double>();
}

RowMatrixXd float_softmax_rows(const MatrixView& logits, FloatPrecision p) {
  if (p == FloatPrecision::fp64) return softmax_ref_rows(logits);
  return storage_softmax_rows(logits, p);
}

RowMatrixXd float_softmax_rows(const MatrixViewF& logits, FloatPrecision p) {
  if (p == FloatPrecision::fp64) return softmax_ref_rows(RowMatrixXd(logits.cast<double>()));
  return storage_softmax_rows(logits, p);
}

AttentionResult float_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                FloatPrecision p, const AttentionMask& mask) {
  require_attention_shapes(q, k, v);
  if (p == FloatPrecision::fp64) {
    RowMatrixXd s = (q * k.transpose()) * scale;
    mask.apply_to_logits(s);
    AttentionResult r;
    r.p = softmax_ref_rows(s);
    r.o = r.p * v;
    return r;
  }
  const RowMatrixXf qf = to_storage_float(q, p), kf = to_storage_float(k, p), vf = to_storage_float(v, p);  // R1
  RowMatrixXf s = qf * kf.transpose();
  s *= static_cast<float>(scale);
  round_in_place(s, p);  // R2
  if (!mask.empty()) {
    const RowMatrixXb visible = mask.visible(s.rows(), s.cols());
    for (Eigen::Index i = 0; i < s.size(); ++i)
      if (!visible.data()[i]) s.data()[i] = -std::numeric_limits<float>::infinity();
  }
  RowMatrixXf prob = softmax_ref_rows(s);
  round_in_place(prob, p);  // R3
  RowMatrixXf o = prob * vf;
  round_in_place(o, p);  // R4
  return {o.cast<double>(), prob.cast<double>()};
}

}  // namespace qattn::ref
