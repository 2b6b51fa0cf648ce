#include "qattn/reference/float_attention.h"

#include <limits>
#include <stdexcept>

#include "qattn/float_format.h"
#include "qattn/reference/fp64_product.h"
#include "qattn/reference/softmax.h"

namespace qattn::ref {
namespace {

// x rounded to the storage format of p: binary16 or bfloat16 (round_to_format's bits, in its bit-level form), or
// float for fp32. From float64 directly, so that no value is rounded twice; a float32 input widens exactly.
template <FloatPrecision p>
float to_storage(double x) {
  if constexpr (p == FloatPrecision::fp16) return static_cast<float>(round_to_binary16(x));
  if constexpr (p == FloatPrecision::bf16) return static_cast<float>(round_to_bfloat16(x));
  return static_cast<float>(x);
}

template <FloatPrecision p, class Scalar>
void round_all(const Scalar* in, float* out, Eigen::Index n) {
  for (Eigen::Index i = 0; i < n; ++i) out[i] = to_storage<p>(in[i]);
}

template <class Scalar>
void round_all(const Scalar* in, float* out, Eigen::Index n, FloatPrecision p) {
  switch (p) {
    case FloatPrecision::fp16: return round_all<FloatPrecision::fp16>(in, out, n);
    case FloatPrecision::bf16: return round_all<FloatPrecision::bf16>(in, out, n);
    default: return round_all<FloatPrecision::fp32>(in, out, n);
  }
}

// Rounds float entries to the 16-bit storage format in place (no-op for fp32).
void round_in_place(RowMatrixXf& m, FloatPrecision p) {
  if (p == FloatPrecision::fp16 || p == FloatPrecision::bf16) round_all(m.data(), m.data(), m.size(), p);
}

// A float64 or float32 view rounded to the storage format of p.
template <class View>
RowMatrixXf to_storage_float(const View& m, FloatPrecision p) {
  RowMatrixXf out(m.rows(), m.cols());
  Eigen::Matrix<typename View::Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> storage;
  round_all(packed_rows(m, storage), out.data(), m.size(), p);
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
                                FloatPrecision p, const AttentionMask& mask, RowMatrixXd* logits) {
  require_attention_shapes(q, k, v);
  if (p == FloatPrecision::fp64) {
    RowMatrixXd s = product_abt(q, k);  // fl(fl(q k^T) scale), q k^T in product_abt's order
    s *= scale;
    mask.apply_to_logits(s);
    AttentionResult r;
    r.p = softmax_ref_rows(s);
    r.o = product_ab(r.p, v);
    if (logits) *logits = std::move(s);
    return r;
  }
  if (logits) throw std::invalid_argument("float_attention: logits are returned for fp64 only");
  // Each operand in its storage format only while its product runs: a streamed block holds one [L_k, d] copy at a
  // time (docs/streaming.md).
  RowMatrixXf s = [&] {
    const RowMatrixXf qf = to_storage_float(q, p), kf = to_storage_float(k, p);  // R1
    // Constructed from the product, not assigned: under NEON the assignment's path gives other bits for other
    // row counts (tests/property/registry_property_test.cc, blocks of 64 rows against the whole call).
    RowMatrixXf product = qf * kf.transpose();
    return product;
  }();
  s *= static_cast<float>(scale);
  round_in_place(s, p);  // R2
  if (!mask.empty()) {
    const RowMatrixXb visible = mask.visible(s.rows(), s.cols());
    for (Eigen::Index i = 0; i < s.size(); ++i)
      if (!visible.data()[i]) s.data()[i] = -std::numeric_limits<float>::infinity();
  }
  RowMatrixXf prob = softmax_ref_rows(s);
  s = RowMatrixXf();
  round_in_place(prob, p);  // R3
  RowMatrixXf o = [&] {  // V's storage copy released before P widens to double
    const RowMatrixXf vf = to_storage_float(v, p);  // R1
    RowMatrixXf product = prob * vf;
    return product;
  }();
  round_in_place(o, p);  // R4
  return {o.cast<double>(), prob.cast<double>()};
}

}  // namespace qattn::ref
