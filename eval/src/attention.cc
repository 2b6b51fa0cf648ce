// qattn::eval::attention (qattn/eval/attention.h): the batch of Q, K and V matrices through one method.
#include "qattn/eval/attention.h"

#include <algorithm>
#include <cmath>

#include "qattn/error.h"
#include "qattn/eval/evaluate.h"

namespace qattn::eval {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  Tensor t;
  t.shape = shape;
  return t.shape_string();
}

std::int64_t axis(const TensorRef& t, std::size_t from_end) { return t.shape[t.shape.size() - from_end]; }

// The inputs' matrices as the method takes them: float32 views of the caller's memory, or float64 views of it (or
// of `widened`, when some input is float32 and the call needs float64).
struct Matrices {
  const TensorRef& t;
  Eigen::Index rows, cols;
  std::vector<double> widened;
  const double* f64 = nullptr;

  Matrices(const TensorRef& ref, bool float64) : t(ref), rows(axis(ref, 2)), cols(axis(ref, 1)), f64(ref.f64) {
    if (!float64 || f64) return;
    const auto count = static_cast<std::size_t>(rows * cols) * static_cast<std::size_t>(batch_entries(ref.shape, ref.name));
    widened.assign(ref.f32, ref.f32 + count);  // exact
    f64 = widened.data();
  }
  MatrixView at(std::int64_t e) const { return Eigen::Map<const RowMatrixXd>(f64 + e * rows * cols, rows, cols); }
  MatrixViewF at_f32(std::int64_t e) const { return Eigen::Map<const RowMatrixXf>(t.f32 + e * rows * cols, rows, cols); }
};

}  // namespace

TensorRef tensor_ref(const Tensor& t, const std::string& name, std::vector<double>& storage) {
  if (!dtype_is_float(t.dtype))
    throw InputError(name, "dtype", std::string(dtype_name(t.dtype)) + " given, attention expects float Q/K/V");
  TensorRef r{name, t.shape};
  if (t.dtype == DType::f32) {
    r.f32 = reinterpret_cast<const float*>(t.bytes.data());
  } else if (t.dtype == DType::f64) {
    r.f64 = reinterpret_cast<const double*>(t.bytes.data());
  } else {
    const Eigen::ArrayXd values = t.to_double();
    storage.assign(values.data(), values.data() + values.size());
    r.f64 = storage.data();
  }
  return r;
}

bool AttentionOutput::has_probs(bool raw) const {
  return std::all_of(entries.begin(), entries.end(), [&](const AttentionResult& r) {
    return r.p.size() != 0 && (!raw || r.p_int.size() != 0);
  });
}

AttentionOutput attention(const AttentionRequest& request) {
  const TensorRef &q = request.q, &k = request.k, &v = request.v;
  for (const TensorRef* t : {&q, &k, &v}) {
    if (t->shape.size() != q.shape.size())
      throw InputError(t->name, "shape", "q " + shape_text(q.shape) + ", k " + shape_text(k.shape) + " and v " +
                                             shape_text(v.shape) + ": q, k and v need the same rank");
  }
  const std::int64_t entries = batch_entries(q.shape, q.name);
  batch_entries(k.shape, k.name), batch_entries(v.shape, v.name);
  // Grouped-query attention: K and V may hold fewer heads than Q; each Q matrix reads its group's K/V matrix.
  const KvGrouping group = group_kv_heads(q.shape, k.shape, v.shape, q.name, k.name, v.name);
  if (axis(q, 1) != axis(k, 1))
    throw InputError(k.name, "shape", "head dimension d of k (" + std::to_string(axis(k, 1)) + ") differs from q (" +
                                          std::to_string(axis(q, 1)) + ")");
  if (axis(k, 2) != axis(v, 2))
    throw InputError(v.name, "shape", "v has " + std::to_string(axis(v, 2)) + " keys, k has " +
                                          std::to_string(axis(k, 2)));
  if (request.scale && !(std::isfinite(*request.scale) && *request.scale > 0))
    throw InputError(request.method_name, "scale", "must be finite and > 0, got " + std::to_string(*request.scale));
  const AttentionMask& mask = request.mask;
  if (mask.valid.size() != 0 && (mask.valid.rows() != axis(q, 2) || mask.valid.cols() != axis(k, 2)))
    throw InputError(request.method_name, "mask",
                     "valid pairs are [" + std::to_string(mask.valid.rows()) + ", " + std::to_string(mask.valid.cols()) +
                         "], the call needs [L_q, L_k] = [" + std::to_string(axis(q, 2)) + ", " +
                         std::to_string(axis(k, 2)) + "]");
  const double scale = request.scale ? *request.scale : 1.0 / std::sqrt(static_cast<double>(axis(q, 1)));

  const bool float32 = q.f32 && k.f32 && v.f32 && !request.kv;
  const Matrices qm(q, !float32), km(k, !float32), vm(v, !float32);
  const std::int64_t heads = q.shape.size() >= 3 ? axis(q, 3) : 1;
  AttentionOutput out;
  out.entries.reserve(static_cast<std::size_t>(entries));
  for (std::int64_t first = 0; first < entries; first += heads) {
    std::vector<MatrixView> qh, kh, vh;
    std::vector<MatrixViewF> qf, kf, vf;
    for (std::int64_t e = first; e < first + heads; ++e) {
      const std::int64_t e_kv = group.kv_entry(e);  // query head h reads K/V head h / (H_q / H_kv)
      if (float32) {
        qf.push_back(qm.at_f32(e)), kf.push_back(km.at_f32(e_kv)), vf.push_back(vm.at_f32(e_kv));
      } else {
        qh.push_back(qm.at(e)), kh.push_back(km.at(e_kv)), vh.push_back(vm.at(e_kv));
      }
    }
    const auto call = [&] {
      const Method& method = *request.method;
      return request.kv  ? ref::attention_with_kv(method, *request.kv, qh, kh, vh, scale, mask)
             : float32 ? method.attention_heads(qf, kf, vf, scale, mask)
                       : method.attention_heads(qh, kh, vh, scale, mask);
    };
    const std::string where =
        q.name + (heads == 1 ? " (batch entry " + std::to_string(first)
                             : " (batch entries " + std::to_string(first) + " to " + std::to_string(first + heads - 1)) +
        ")";
    for (AttentionResult& r : request.name_entries ? with_source(where, request.method_name, call) : call())
      out.entries.push_back(std::move(r));
  }
  out.o_shape.assign(q.shape.begin(), q.shape.end() - 1);
  out.o_shape.push_back(axis(v, 1));
  out.p_shape.assign(q.shape.begin(), q.shape.end() - 1);
  out.p_shape.push_back(axis(k, 2));
  return out;
}

}  // namespace qattn::eval
