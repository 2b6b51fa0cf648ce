// qattn's Python binding (_qattn): the method registry, softmax and attention through the engine (fused kernels
// where a method has them), the error metrics, and tensor files. python/qattn/__init__.py documents each function;
// python/README.md says what is exposed and how inputs are converted.
//
// Inputs are NumPy arrays of float32 or float64 in any layout. A C-contiguous, aligned float64 array is read in
// place: the methods get a view of its buffer (MatrixView, qattn/tensor.h), no copy. So is a C-contiguous, aligned
// float32 array given to softmax, attention (q, k and v all float32) or compare (both float32): MatrixViewF, the
// float32 entries of Method. Anything else is converted once to float64 in C order, exactly. Outputs are new arrays
// (float64; integer P as uint8/int8). The GIL is released around every computation. The array conversions are
// arrays.cc's, a user's callable as a method user_method.cc's, the low-precision formats and MMA models lowp_module.cc's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "arrays.h"
#include "qattn/engine.h"
#include "qattn/eval/analyze.h"
#include "qattn/eval/attention.h"
#include "qattn/eval/report.h"
#include "qattn/error.h"
#include "qattn/metrics.h"
#include "qattn/parallel.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"
#include "qattn/reference/weight_quant.h"
#include "qattn/tensor_io.h"
#include "user_method.h"

namespace py = pybind11;

namespace qattn::python {

void add_lowp_and_mma(py::module_& m);  // lowp_module.cc: FP8/FP6/FP4 codes, MX and NVFP4 blocks, the MMA models

namespace {


py::array tensor_to_array(const Tensor& t);

// softmax(logits, method): rows over the last axis.
py::array_t<double> softmax(const py::handle& logits, const std::string& method, const std::string& engine) {
  const Input in = read_float_array(logits, "logits", true);
  if (in.shape.empty()) throw py::value_error("logits: expected at least one axis, got a scalar");
  const Eigen::Index cols = in.shape.back(), rows = cols ? static_cast<Eigen::Index>(in.size) / cols : 0;
  py::array_t<double> out(std::vector<py::ssize_t>(in.shape.begin(), in.shape.end()));
  double* const out_data = out.mutable_data();
  {
    py::gil_scoped_release release;
    require_finite_array(in, "logits", true);
    const BuiltMethod built = build_method(method, engine_options(engine, 1, true));
    const RowMatrixXd p = in.f32 ? built.method->softmax_rows(matrix_at_f32(in, 0, rows, cols))
                                 : built.method->softmax_rows(matrix_at(in, 0, rows, cols));
    std::copy_n(p.data(), p.size(), out_data);
  }
  return out;
}

// softmax_integer(logits, method, cint=None, alpha=None): (probabilities, raw P or None, raw scale).
py::tuple softmax_integer(const py::handle& logits, const std::string& method, std::optional<std::int64_t> cint,
                          std::optional<double> alpha) {
  IntInput in = read_int_array(logits, "logits");
  if (cint.has_value() == alpha.has_value())
    throw py::value_error("cint, alpha: give exactly one: the clip of the integer logits (cint) or their scale (alpha)");
  if (cint && (*cint < 1 || *cint > std::numeric_limits<std::int32_t>::max()))
    throw py::value_error("cint: must be in [1, 2^31 - 1], got " + std::to_string(*cint));
  if (alpha && !(std::isfinite(*alpha) && *alpha > 0))
    throw py::value_error("alpha: must be finite and > 0, got " + std::to_string(*alpha));
  IntegerSoftmaxResult r;
  {
    py::gil_scoped_release release;
    const BuiltMethod built = build_method(method, engine_options("reference", 1, true));
    r = built.method->softmax_integer(IntegerLogits{in.view(), cint, alpha});
  }
  std::vector<double> p(r.probabilities.data(), r.probabilities.data() + r.probabilities.size());
  py::object raw = py::none();
  if (r.raw) {
    r.raw->shape.assign(in.shape.begin(), in.shape.end());
    raw = tensor_to_array(*r.raw);
  }
  return py::make_tuple(to_array(p, in.shape), raw, r.raw_scale);
}

// exact_softmax(logits, decimal): the 50-digit softmax of every row, rounded once to float64, or as decimal strings.
py::object exact_softmax(const py::handle& logits, bool decimal) {
  const Input in = read_float_array(logits, "logits");
  if (in.shape.empty()) throw py::value_error("logits: expected at least one axis, got a scalar");
  const Eigen::Index cols = in.shape.back(), rows = cols ? static_cast<Eigen::Index>(in.size) / cols : 0;
  const MatrixView x = matrix_at(in, 0, rows, cols);
  std::vector<double> out(in.size);
  std::vector<std::string> digits(decimal ? in.size : 0);
  {
    py::gil_scoped_release release;
    require_finite_array(in, "logits", true);
    for (Eigen::Index r = 0; r < rows; ++r) {
      const std::vector<ref::Exact50> e =
          ref::softmax_exact(std::span<const double>(x.row(r).data(), static_cast<std::size_t>(cols)));
      for (Eigen::Index j = 0; j < cols; ++j) {
        const std::size_t i = static_cast<std::size_t>(r * cols + j);
        out[i] = static_cast<double>(e[j]);
        if (decimal) digits[i] = e[j].str(50, std::ios_base::scientific);
      }
    }
  }
  if (!decimal) return to_array(out, in.shape);
  py::object Decimal = py::module_::import("decimal").attr("Decimal");
  std::vector<py::ssize_t> s(in.shape.begin(), in.shape.end());
  py::array result(py::dtype("O"), s);
  py::object flat = result.attr("reshape")(-1);
  for (std::size_t i = 0; i < digits.size(); ++i) flat[py::int_(i)] = Decimal(digits[i]);
  return result;
}

// Heads [H, L, d] (or one head [L, d]) as matrices.
std::vector<MatrixView> heads_of(const Input& in, const char* name) {
  if (in.shape.size() != 2 && in.shape.size() != 3)
    throw py::value_error(std::string(name) + ": expected [L, d] or [heads, L, d], got " + shape_string(in.shape));
  const std::size_t h = in.shape.size() == 3 ? static_cast<std::size_t>(in.shape[0]) : 1;
  const Eigen::Index l = in.shape[in.shape.size() - 2], d = in.shape.back();
  std::vector<MatrixView> out;
  for (std::size_t i = 0; i < h; ++i) out.push_back(matrix_at(in, i, l, d));
  return out;
}

py::array_t<double> stack_heads(const std::vector<RowMatrixXd>& m, const std::vector<Eigen::Index>& like) {
  std::vector<double> values;
  for (const RowMatrixXd& x : m) values.insert(values.end(), x.data(), x.data() + x.size());
  std::vector<Eigen::Index> shape = like;
  shape[shape.size() - 2] = m.empty() ? 0 : m[0].rows();
  shape.back() = m.empty() ? 0 : m[0].cols();
  return to_array(values, shape);
}

// quantize_kv(k, v, spec): what attention reads after the KV quantizer, as a dict.
py::dict quantize_kv(const py::handle& k_obj, const py::handle& v_obj, const std::string& spec) {
  const Input k = read_float_array(k_obj, "k"), v = read_float_array(v_obj, "v");
  const std::vector<MatrixView> kh = heads_of(k, "k"), vh = heads_of(v, "v");
  if (k.shape.size() != v.shape.size() || kh.size() != vh.size() || kh[0].rows() != vh[0].rows())
    throw py::value_error("k, v: shapes " + shape_string(k.shape) + ", " + shape_string(v.shape) +
                          " do not fit [heads, L, d], [heads, L, d_v]");
  ref::KvQuantized r;
  {
    py::gil_scoped_release release;
    const std::unique_ptr<ref::KvQuantizer> q = ref::kv_registry().create(spec);
    require_finite_array(k, "K"), require_finite_array(v, "V");
    r = q->apply(kh, vh);
  }
  py::dict out;
  out["k"] = stack_heads(r.k, k.shape);
  out["v"] = stack_heads(r.v, v.shape);
  out["rotation"] = r.rotation.size() ? py::object(stack_heads({r.rotation}, {r.rotation.rows(), r.rotation.cols()}))
                                      : py::object(py::none());
  out["v_rotated"] = r.v_rotated;
  out["k_bits"] = r.k_bits;
  out["v_bits"] = r.v_bits;
  return out;
}

// quantize_weights(w, x, spec): W^ [in, out] from W [in, out] and the calibration inputs X [n, in].
py::array_t<double> quantize_weights(const py::handle& w_obj, const py::handle& x_obj, const std::string& spec) {
  const Input w = read_float_array(w_obj, "w"), x = read_float_array(x_obj, "x");
  if (w.shape.size() != 2 || x.shape.size() != 2 || x.shape[1] != w.shape[0])
    throw py::value_error("w, x: expected W [in, out] and X [n, in], got " + shape_string(w.shape) + ", " +
                          shape_string(x.shape));
  RowMatrixXd result;
  {
    py::gil_scoped_release release;
    const MatrixView wm = matrix_at(w, 0, w.shape[0], w.shape[1]), xm = matrix_at(x, 0, x.shape[0], x.shape[1]);
    require_finite_array(w, "W"), require_finite_array(x, "X");
    result = ref::weight_registry().create(spec)->apply(wm, xm);
  }
  return stack_heads({result}, w.shape);
}

// The KV and weight quantizers with their parameters and presets, as methods() lists methods.
py::dict quantizers() {
  auto list = [](const auto& registry, const char* kind) {
    py::list out;
    for (const MethodEntry& e : registry.params().entries()) {
      py::list params, presets;
      for (const ParamInfo& p : e.params) {
        py::dict d;
        d["key"] = p.key, d["default"] = p.default_value, d["doc"] = p.doc, d["choices"] = p.choices;
        params.append(d);
      }
      for (const PresetInfo& p : e.presets) {
        py::dict d;
        d["name"] = p.name, d["values"] = p.values, d["doc"] = p.doc;
        if (!p.alias_of.empty()) d["alias_of"] = p.alias_of;
        presets.append(d);
      }
      py::dict m;
      m["name"] = e.name, m["summary"] = e.summary, m["kind"] = kind, m["doc"] = e.doc;
      m["params"] = params, m["presets"] = presets;
      out.append(m);
    }
    return out;
  };
  py::dict d;
  d["kv"] = list(ref::kv_registry(), "kv quantizer");
  d["weights"] = list(ref::weight_registry(), "weight quantizer");
  return d;
}

// One ErrorStats as the dict `qattn analyze --format json` writes (non-finite values as Python floats).
py::dict stats_dict(const ErrorStats& e) {
  py::dict hist;
  for (const auto& [k, n] : e.log2_histogram) hist[py::str(std::to_string(k))] = n;
  py::dict d;
  d["count"] = e.count, d["nonfinite"] = e.nonfinite, d["cossim"] = e.cossim, d["rel_l1"] = e.rel_l1;
  d["one_minus_cossim"] = e.one_minus_cossim;
  d["rmse"] = e.rmse, d["max_abs"] = e.max_abs, d["bias"] = e.bias, d["median_abs"] = e.median_abs;
  d["zero_errors"] = e.zero_errors, d["log2_histogram"] = hist;
  return d;
}

// attention(q, k, v, method, ...): [..., L, d]; the axis before L (when there is one) is the heads of one call.
// `method_obj`: a spec (str), or a user's method as (label, callable, kind, thread_safe) (qattn.Method._entry), run
// as a PythonMethod on this thread; what its callable raises is re-raised as itself.
// Grouped-query attention: with three or more axes, k and v may have H_kv heads on the axis before L where q has H_q,
// H_kv dividing H_q; query head h reads K/V head h / (H_q / H_kv) (contiguous groups, as Hugging Face's repeat_kv),
// a view of the caller's array, not a copy. The other leading axes must be equal.
py::object attention(const py::handle& q_obj, const py::handle& k_obj, const py::handle& v_obj,
                     const py::object& method_obj, std::optional<double> scale, bool causal,
                     const std::optional<py::array>& mask, bool return_probs, const std::string& engine,
                     std::int64_t threads, const std::string& kv, bool raw) {
  if (raw && !return_probs) throw py::value_error("raw: applies to P; give return_probs=True with it");
  thread_count(threads);  // refused before any array is read
  CallableCalls own_calls;  // outlives the method that refers to it
  std::unique_ptr<Method> own;
  std::string method;  // the spec, or the user's method's label
  if (py::isinstance<py::str>(method_obj)) {
    method = method_obj.cast<std::string>();
  } else {
    const auto t = py::reinterpret_borrow<py::tuple>(method_obj);
    if (!py::isinstance<py::tuple>(method_obj) || t.size() != 4)
      throw py::type_error("method: a spec (str) or a qattn.Method");
    UserMethod user = user_method(t, own_calls);
    method = std::move(user.label);
    own = std::move(user.method);
  }
  // float32 q, k and v are read in place (eval::attention widens them when the call needs float64).
  const Input q = read_float_array(q_obj, "q", true), k = read_float_array(k_obj, "k", true),
              v = read_float_array(v_obj, "v", true);
  const auto ref = [](const Input& in, const char* name) {
    return eval::TensorRef{name, {in.shape.begin(), in.shape.end()}, in.f32, in.f32 ? nullptr : in.data};
  };
  AttentionMask m;
  m.causal = causal;
  if (mask) {
    const Eigen::Index lq = q.shape.size() >= 2 ? q.shape[q.shape.size() - 2] : 0,
                       lk = k.shape.size() >= 2 ? k.shape[k.shape.size() - 2] : 0;
    if (!mask->dtype().is(py::dtype::of<bool>()) || mask->ndim() != 2 || mask->shape(0) != lq || mask->shape(1) != lk)
      throw py::value_error("mask: expected a bool array of shape (" + std::to_string(lq) + ", " + std::to_string(lk) +
                            ") (True = visible)");
    const auto c = py::array_t<bool, py::array::c_style | py::array::forcecast>::ensure(*mask);
    m.valid = Eigen::Map<const RowMatrixXb>(c.data(), lq, lk);
  }
  eval::AttentionOutput result;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      require_finite_array(q, "Q"), require_finite_array(k, "K"), require_finite_array(v, "V");
      const BuiltMethod built = own ? BuiltMethod{} : build_method(method, engine_options(engine, threads, return_probs));
      const std::unique_ptr<ref::KvQuantizer> kvq = kv.empty() ? nullptr : ref::kv_registry().create(kv);
      eval::AttentionRequest request{ref(q, "q"), ref(k, "k"), ref(v, "v"), own ? own.get() : built.method.get(),
                                     method, scale, std::move(m), kvq.get()};
      request.name_entries = false;  // what a method raises reaches Python as it was raised
      result = eval::attention(request);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) rethrow_raised(failure, own_calls, "qattn.attention");
  if (return_probs && !result.has_probs(raw))
    throw py::value_error(method + (raw ? ": this method has no integer P; call with raw=False"
                                        : ": this method does not materialise P; call with return_probs=False"));
  // O (and P) of every entry, one after another: the caller's leading axes.
  const auto joined = [&](auto matrix_of) {
    std::vector<double> all;
    for (const AttentionResult& r : result.entries) {
      const auto& x = matrix_of(r);
      all.insert(all.end(), x.data(), x.data() + x.size());
    }
    return all;
  };
  const auto shape = [](const std::vector<std::int64_t>& s) { return std::vector<Eigen::Index>(s.begin(), s.end()); };
  py::array_t<double> o_array = to_array(joined([](const AttentionResult& r) -> const RowMatrixXd& { return r.o; }),
                                         shape(result.o_shape));
  if (!return_probs) return o_array;
  if (!raw)
    return py::make_tuple(o_array, to_array(joined([](const AttentionResult& r) -> const RowMatrixXd& { return r.p; }),
                                            shape(result.p_shape)));
  const std::vector<double> p_int =
      joined([](const AttentionResult& r) -> const RowMatrixXi32& { return r.p_int; });
  return py::make_tuple(o_array,
                        tensor_to_array(Tensor::from_double(result.entries.front().p_dtype, result.p_shape, p_int)));
}

// analyze(...): the evaluation layer's analysis (qattn/eval/analysis.h) over a dump, on the engine named here, as
// {"heads": [...], "summary": [...]} shaped as `qattn analyze --format json` writes them.
// `own`: the user's methods, (label, callable, kind, thread_safe) with kind "softmax" or "attention" (PythonMethod);
// with own methods and no spec, only they run. `threads`: the workers, as `qattn analyze --threads` (0: every core).
// The analysis runs on a thread of its own while this one answers Ctrl-C (run_checking_signals); what a callable
// raised is re-raised as itself (rethrow_raised).
py::dict analyze_report(const std::string& tensors, const std::vector<std::string>& specs, const std::string& kv,
                        const std::string& weights, bool softmax_only, const std::string& reference_name,
                        const std::string& engine, const std::vector<py::tuple>& own, const std::string& format,
                        std::int64_t threads, bool summary_only, const std::vector<std::string>& columns,
                        const std::vector<std::string>& order) {
  const eval::SoftmaxReference reference = eval::parse_softmax_reference(reference_name);
  if (reference == eval::SoftmaxReference::exact && !softmax_only)
    throw std::invalid_argument("--reference: exact applies to softmax-only analysis (softmax_only=True); attention "
                                "is compared with fp64");
  CallableCalls calls;  // outlives the methods that refer to it (the request's, then the plan's)
  eval::AnalysisRequest request;
  request.tensors = tensors;
  request.specs = specs;
  request.kv = kv;
  request.weights = weights;
  request.softmax = softmax_only;
  request.reference = reference;
  request.threads = thread_count(threads);
  const EngineOptions engine_options = qattn::python::engine_options(engine, 1, true);
  request.build = [engine_options](const MethodSpec& spec) { return build_method(spec, engine_options).method; };
  request.format = format;
  request.table.summary = summary_only, request.table.columns = columns;
  request.order = order;
  for (const py::tuple& t : own) {
    // Nothing declared: whole calls, compared block by block. (A PythonMethod's destructor takes the GIL itself, so
    // the request may go out of scope here on an error.)
    UserMethod user = user_method(t, calls, softmax_only);
    request.own.push_back({std::move(user.label), std::move(user.method), {}});
  }
  // A worker that finishes an item after Ctrl-C throws: parallel_for starts no further item and joins the others.
  request.progress = [&calls](std::size_t, std::size_t) {
    if (calls.stop) throw AnalysisInterrupted();
  };
  request.checkpoint = [&calls] {
    if (calls.stop) throw AnalysisInterrupted();
  };
  eval::AnalysisResult analysis;
  const auto run = [&] { analysis = eval::run_analysis(request); };
  std::optional<py::error_already_set> signal;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      signal = run_checking_signals(run, calls.stop);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (signal) throw *signal;
  if (failure) rethrow_raised(failure, calls);
  py::list heads, summary;
  for (const eval::HeadResult& r : analysis.results) {
    py::dict h;
    h["layer"] = r.layer, h["head"] = r.head, h["method"] = r.method;
    h["O"] = stats_dict(r.o), h["P"] = stats_dict(r.p);
    h["P_kl_mean"] = r.kl.mean, h["P_kl_max"] = r.kl.max, h["K_bits"] = r.k_bits, h["V_bits"] = r.v_bits;
    heads.append(h);
  }
  for (const eval::ReportMethod& method : analysis.view.methods) {
    std::vector<eval::HeadResult> mine;
    for (const eval::HeadResult& r : analysis.results)
      if (r.method == method.label) mine.push_back(r);
    const eval::MethodSummary s = eval::summarise_method(mine);
    py::dict mean, worst, entry;
    for (const eval::MetricInfo& m : eval::kMetrics)
      mean[m.name] = s.metrics.mean[m.metric], worst[m.name] = s.metrics.worst[m.metric];
    py::object nonfinite = py::none();
    if (const eval::HeadResult* r = s.first_nonfinite) {
      py::dict where;
      where["layer"] = r->layer, where["head"] = r->head;
      nonfinite = where;
    }
    entry["method"] = method.label, entry["canonical"] = method.canonical;
    entry["mean"] = mean, entry["worst"] = worst, entry["first_nonfinite_head"] = nonfinite;
    summary.append(entry);
  }
  py::dict report;
  report["heads"] = heads, report["summary"] = summary;
  if (!format.empty()) report["text"] = analysis.text;
  return report;
}

py::dict compare(const py::handle& out, const py::handle& ref) {
  Input a = read_float_array(out, "a", true), b = read_float_array(ref, "b", true);
  if (a.shape != b.shape) throw py::value_error("a, b: shapes differ: " + shape_string(a.shape) + " vs " + shape_string(b.shape));
  if (!(a.f32 && b.f32)) a.widen(), b.widen();  // float32 next to float64: both as float64
  ErrorStats e;
  {
    py::gil_scoped_release release;
    e = a.f32 ? qattn::compare(std::span<const float>(a.f32, a.size), std::span<const float>(b.f32, b.size))
              : qattn::compare(a.values(), b.values());
  }
  py::dict r;
  r["count"] = e.count;
  r["nonfinite"] = e.nonfinite;
  r["cossim"] = e.cossim;
  r["one_minus_cossim"] = e.one_minus_cossim;
  r["rel_l1"] = e.rel_l1;
  r["rmse"] = e.rmse;
  r["max_abs"] = e.max_abs;
  r["bias"] = e.bias;
  r["median_abs"] = e.median_abs;
  return r;
}

py::list methods() {
  py::list out;
  for (const MethodEntry& e : ref::reference_registry().entries()) {
    py::list params, presets;
    for (const ParamInfo& p : e.params) {
      py::dict d;
      d["key"] = p.key;
      d["default"] = p.default_value;
      d["doc"] = p.doc;
      d["choices"] = p.choices;
      params.append(d);
    }
    for (const PresetInfo& p : e.presets) {
      py::dict d;
      d["name"] = p.name;
      d["values"] = p.values;
      d["doc"] = p.doc;
      if (!p.alias_of.empty()) d["alias_of"] = p.alias_of;
      presets.append(d);
    }
    py::dict m;
    m["name"] = e.name;
    m["summary"] = e.summary;
    m["kind"] = std::string(method_kind_name(e.kind));
    m["doc"] = e.doc;
    m["params"] = params;
    m["presets"] = presets;
    m["in_default_lists"] = e.in_default_lists;  // false: its defaults alone do not build it (file:PATH)
    m["positional_key"] = e.positional_key;
    out.append(m);
  }
  return out;
}

std::string canonical(const std::string& spec) {
  const Registry& r = ref::reference_registry();
  return r.canonical(parse_method_spec(spec));
}

py::array tensor_to_array(const Tensor& t) {
  std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
  auto raw = [&](auto tag) {
    using T = decltype(tag);
    py::array_t<T> a(shape);
    std::memcpy(a.mutable_data(), t.bytes.data(), t.bytes.size());
    return py::array(a);
  };
  switch (t.dtype) {
    case DType::f64: return raw(double{});
    case DType::f32: return raw(float{});
    case DType::i8: return raw(std::int8_t{});
    case DType::u8: return raw(std::uint8_t{});
    case DType::i16: return raw(std::int16_t{});
    case DType::i32: return raw(std::int32_t{});
    case DType::i64: return raw(std::int64_t{});
    case DType::u16: return raw(std::uint16_t{});
    case DType::u32: return raw(std::uint32_t{});
    default: {  // f16, bf16: widened exactly to float32
      const Eigen::ArrayXd v = t.to_double();
      py::array_t<float> a(shape);
      for (Eigen::Index i = 0; i < v.size(); ++i) a.mutable_data()[i] = static_cast<float>(v[i]);
      return py::array(a);
    }
  }
}

py::dict load(const std::string& path) {
  std::vector<NamedTensor> tensors;
  {
    py::gil_scoped_release release;
    tensors = read_tensor_file(path);
  }
  py::dict out;
  for (const NamedTensor& t : tensors) out[py::str(t.name)] = tensor_to_array(t.tensor);
  return out;
}

// _input_address(a): the address of the values that softmax, attention and compare (float arrays) or softmax_integer
// (integer arrays) read for the array `a`, for the tests that show which arrays are read in place (the address is
// a.ctypes.data) and which are converted.
std::uintptr_t input_address(const py::handle& a) {
  if (py::isinstance<py::array>(a) && py::reinterpret_borrow<py::array>(a).dtype().kind() == 'i')
    return reinterpret_cast<std::uintptr_t>(read_int_array(a, "a").view().data());
  const Input in = read_float_array(a, "a", true);
  return in.f32 ? reinterpret_cast<std::uintptr_t>(in.f32) : reinterpret_cast<std::uintptr_t>(in.data);
}

void save(const std::string& path, const py::dict& arrays) {
  std::vector<NamedTensor> tensors;
  for (const auto& [key, value] : arrays) {
    const std::string name = py::str(key);
    const Input in = read_float_array(value, ("arrays['" + name + "']").c_str());
    std::vector<std::int64_t> shape(in.shape.begin(), in.shape.end());
    const bool f32 = py::reinterpret_borrow<py::array>(value).dtype().is(py::dtype::of<float>());
    tensors.push_back({name, Tensor::from_double(f32 ? DType::f32 : DType::f64, shape, in.values())});
  }
  py::gil_scoped_release release;
  write_tensor_file(path, tensors);
}

}  // namespace
}  // namespace qattn::python

PYBIND11_MODULE(_qattn, m) {
  using namespace qattn::python;
  m.doc() = "qattn: quantized softmax and attention, verified with exact arithmetic (native part)";
  // An old preset spelling (sage2@8b) warns once (FutureWarning) which preset it now means.
  qattn::set_preset_alias_notice([](const std::string& text) {
    py::gil_scoped_acquire gil;
    static std::set<std::string> said;  // guarded by the GIL
    if (said.count(text)) return;
    // a filter that turns the warning into an error raises it from the call that named the old spelling
    if (PyErr_WarnEx(PyExc_FutureWarning, ("qattn: " + text).c_str(), 1) < 0) throw py::error_already_set();
    said.insert(text);
  });
  // The library's input errors carry file, field and reason: Python sees them as ValueError with that message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qattn::InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("methods", &methods);
  m.def("canonical", &canonical, py::arg("spec"));
  m.def("softmax", &softmax, py::arg("logits"), py::arg("method"), py::arg("engine") = "auto");
  m.def("attention", &attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("method"),
        py::arg("scale") = py::none(), py::arg("causal") = false, py::arg("mask") = py::none(),
        py::arg("return_probs") = false, py::arg("engine") = "auto", py::arg("threads") = 1, py::arg("kv") = "",
        py::arg("raw") = false);
  m.def("compare", &compare, py::arg("a"), py::arg("b"));
  m.def("_input_address", &input_address, py::arg("a"));
  m.def("softmax_integer", &softmax_integer, py::arg("logits"), py::arg("method"), py::arg("cint") = py::none(),
        py::arg("alpha") = py::none());
  m.def("exact_softmax", &exact_softmax, py::arg("logits"), py::arg("decimal") = false);
  m.def("quantize_kv", &quantize_kv, py::arg("k"), py::arg("v"), py::arg("spec"));
  m.def("quantize_weights", &quantize_weights, py::arg("w"), py::arg("x"), py::arg("spec"));
  m.def("quantizers", &quantizers);
  m.def("analyze_report", &analyze_report, py::arg("tensors"), py::arg("methods"), py::arg("kv"), py::arg("weights"),
        py::arg("softmax_only"), py::arg("reference"), py::arg("engine"), py::arg("own") = std::vector<py::tuple>{},
        py::arg("format") = std::string(), py::arg("threads") = 0, py::arg("summary") = false,
        py::arg("columns") = std::vector<std::string>{}, py::arg("order") = std::vector<std::string>{});
  m.attr("__version__") = QATTN_VERSION;  // the project's version, as `qattn --version` prints it
  add_lowp_and_mma(m);  // lowp_module.cc
  m.def("load", &load, py::arg("path"));
  m.def("save", &save, py::arg("path"), py::arg("arrays"));
}
