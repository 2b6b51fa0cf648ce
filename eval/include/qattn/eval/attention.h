// qattn::eval::attention: softmax(scale Q K^T) V by one method over every [L, d] matrix of three tensors held in
// memory, with grouped-query K/V, a mask and an optional KV quantizer. The one composition that `qattn attention`
// and Python's qattn.attention call: they read their inputs and write the result, nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qattn/method.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/tensor.h"

namespace qattn::eval {

// One of Q, K, V: [..., L, d] values in C order, float32 or float64, in the caller's memory (not copied unless the
// call needs float64 and they are float32). `name` is what errors call it: the file, or the argument.
struct TensorRef {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* f32 = nullptr;   // exactly one of f32 and f64 is set
  const double* f64 = nullptr;
};

// A tensor read from a file as a TensorRef: float32 and float64 in place (t must outlive the reference), float16 and
// bfloat16 widened into `storage` (exact). InputError naming `name` for an integer dtype.
TensorRef tensor_ref(const Tensor& t, const std::string& name, std::vector<double>& storage);

struct AttentionRequest {
  TensorRef q, k, v;
  const Method* method = nullptr;
  std::string method_name;               // the spec or label, as errors quote it
  std::optional<double> scale;           // default 1/sqrt(d); otherwise finite and > 0
  AttentionMask mask;                    // causal and/or valid pairs [L_q, L_k], the same for every matrix
  const ref::KvQuantizer* kv = nullptr;  // K and V pass through it first (ref::attention_with_kv, float64)
  // A method's InputError, invalid_argument or domain_error rethrown as an InputError naming q's batch entries and
  // the method (eval::with_source); false: thrown as the method threw it.
  bool name_entries = true;
};

struct AttentionOutput {
  std::vector<std::int64_t> o_shape, p_shape;  // [..., L_q, d_v] and [..., L_q, L_k]
  std::vector<AttentionResult> entries;        // one per Q matrix, leading axes flattened in C order
  // Whether every entry holds P (raw: the integer P as well); methods that never materialise P leave it empty.
  bool has_probs(bool raw) const;
};

// Every Q matrix through request.method. With 3 or more axes the axis before L is the heads of one layer: they are
// handed over together (Method::attention_heads: turbo's head-wise KV precision ranks them), and K and V may hold
// H_kv heads dividing Q's H_q (group_kv_heads: query head h reads K/V head h / (H_q / H_kv), a view, not a copy).
// Float32 Q, K and V go through the float32 entry in place (the same bits as the float64 one, qattn/method.h); any
// float64 input, or a KV quantizer, takes every input to float64.
//
// InputError (field "shape") naming the tensor: a rank below 2, ranks that differ, an empty L, d or leading axis,
// leading axes that do not fit (group_kv_heads), d of k not d of q, L of v not L of k; field "scale" for a bad scale;
// field "mask" for a valid-pairs matrix not [L_q, L_k]. The inputs are not checked for NaN or infinities here (the
// front ends check whole tensors, so the error can name the entry; each method checks its matrices again).
AttentionOutput attention(const AttentionRequest& request);

}  // namespace qattn::eval
