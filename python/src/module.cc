// qattn's Python binding (_qattn): the method registry, softmax and attention through the engine (fused kernels
// where a method has them), the error metrics, and tensor files. python/qattn/__init__.py documents each function;
// python/README.md says what is exposed and how inputs are converted.
//
// Inputs are NumPy arrays of float32 or float64 in any layout. A C-contiguous, aligned float64 array is read in
// place: the methods get a view of its buffer (MatrixView, qattn/tensor.h), no copy. So is a C-contiguous, aligned
// float32 array given to softmax, attention (q, k and v all float32) or compare (both float32): MatrixViewF, the
// float32 entries of Method. Anything else is converted once to float64 in C order, exactly. Outputs are new arrays
// (float64; integer P as uint8/int8). The GIL is released around every computation.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "qattn/engine.h"
#include "qattn/eval/analysis.h"
#include "qattn/eval/report.h"
#include "qattn/error.h"
#include "qattn/metrics.h"
#include "qattn/parallel.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/lowp_convert.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"
#include "qattn/reference/weight_quant.h"
#include "qattn/tensor_io.h"

namespace py = pybind11;

namespace qattn::python {
namespace {

using Array = py::array;

// A float32 or float64 array as float64 values in C order, with its shape. TypeError names the argument otherwise.
// With `float32_in_place` (softmax, attention, compare), a C-contiguous, aligned float32 array is kept as it is in
// `f32`, for the float32 entries of Method and compare; widen() makes it float64 when the call cannot take float32.
struct Input {
  std::vector<Eigen::Index> shape;
  py::array array;                // holds the caller's array (and so its buffer) while the values are read
  std::vector<double> converted;  // the values widened or reordered, when the buffer cannot be read in place
  const double* data = nullptr;   // the values in C order: the caller's buffer, or `converted`; null while f32 is set
  const float* f32 = nullptr;     // a float32 buffer read in place
  std::size_t size = 0;
  std::span<const double> values() const { return {data, size}; }

  void widen() {
    if (!f32) return;
    converted.assign(f32, f32 + size);  // exact
    data = converted.data();
    f32 = nullptr;
  }
};

Input read_float_array(const py::handle& object, const char* name, bool float32_in_place = false) {
  if (!py::isinstance<py::array>(object))
    throw py::type_error(std::string(name) + ": expected a NumPy array of float32 or float64, got " +
                         std::string(py::str(py::type::of(object))));
  const Array a = py::reinterpret_borrow<Array>(object);
  const bool f32 = a.dtype().is(py::dtype::of<float>()), f64 = a.dtype().is(py::dtype::of<double>());
  if (!f32 && !f64)
    throw py::type_error(std::string(name) + ": expected dtype float32 or float64, got " +
                         std::string(py::str(a.dtype())));
  Input in;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) in.shape.push_back(a.shape(i));
  in.array = a;
  in.size = static_cast<std::size_t>(a.size());
  constexpr int kInPlace = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
  const bool in_place = (a.flags() & kInPlace) == kInPlace;
  if (f64 && in_place) {
    in.data = static_cast<const double*>(a.data());
    return in;
  }
  if (f32 && in_place && float32_in_place) {
    in.f32 = static_cast<const float*>(a.data());
    return in;
  }
  const auto c = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a);  // exact for float32
  in.converted.assign(c.data(), c.data() + c.size());
  in.data = in.converted.data();
  return in;
}

std::string shape_string(const std::vector<Eigen::Index>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

// The policy of docs/non-finite.md on a whole array, so that the error names the entry by its index in the caller's
// array ("Q: [1, 2, 3, 5]: is NaN"), not in the matrix of one head: NaN and +inf are refused, and -inf too unless
// `masks` (softmax logits, where -inf means masked). The methods check again, per matrix; this check comes first.
template <class T>
void require_finite_values(std::span<const T> x, const std::vector<Eigen::Index>& shape, const std::string& tensor,
                           bool masks) {
  const auto bad = [&](T v) { return std::isnan(v) || (std::isinf(v) && !(masks && v < 0)); };
  const auto it = std::find_if(x.begin(), x.end(), bad);
  if (it == x.end()) return;
  std::size_t flat = static_cast<std::size_t>(it - x.begin());
  std::vector<std::size_t> index(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = flat % static_cast<std::size_t>(shape[a]);
    flat /= static_cast<std::size_t>(shape[a]);
  }
  std::string field = "[";
  for (std::size_t a = 0; a < index.size(); ++a) field += (a ? ", " : "") + std::to_string(index[a]);
  const std::string what = std::isnan(*it) ? "NaN" : *it > 0 ? "+inf" : "-inf";
  throw InputError(tensor, field + "]", "is " + what + "; non-finite input is refused (docs/non-finite.md)");
}

void require_finite_array(const Input& in, const std::string& tensor, bool masks = false) {
  if (in.f32) return require_finite_values(std::span<const float>(in.f32, in.size), in.shape, tensor, masks);
  require_finite_values(in.values(), in.shape, tensor, masks);
}

// Matrix `batch` of the [..., rows, cols] values, in place.
MatrixView matrix_at(const Input& in, std::size_t batch, Eigen::Index rows, Eigen::Index cols) {
  return Eigen::Map<const RowMatrixXd>(in.data + batch * rows * cols, rows, cols);
}
MatrixViewF matrix_at_f32(const Input& in, std::size_t batch, Eigen::Index rows, Eigen::Index cols) {
  return Eigen::Map<const RowMatrixXf>(in.f32 + batch * rows * cols, rows, cols);
}

py::array_t<double> to_array(const std::vector<double>& values, const std::vector<Eigen::Index>& shape) {
  std::vector<py::ssize_t> s(shape.begin(), shape.end());
  py::array_t<double> out(s);
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

py::array tensor_to_array(const Tensor& t);

// `threads` as the CLI takes --threads: [0, 1024], 0 meaning one per hardware thread. ValueError otherwise.
int thread_count(std::int64_t threads) {
  if (threads < 0 || threads > kMaxThreads)
    throw py::value_error("threads: " + std::to_string(threads) + " is outside [0, " + std::to_string(kMaxThreads) +
                          "] (0: every core)");
  return resolve_threads(static_cast<int>(threads));
}

EngineOptions engine_options(const std::string& engine, std::int64_t threads, bool probs) {
  EngineOptions o;
  o.engine = parse_engine(engine);
  o.threads = thread_count(threads);
  o.probs = probs;
  return o;
}

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



// An int8, int16 or int32 array of integer logits: read in place when it is C-contiguous and aligned (the model
// widens one row at a time), else converted once to int32 in C order (exact). TypeError names the argument otherwise.
struct IntInput {
  std::vector<Eigen::Index> shape;
  py::array values;                  // the caller's array itself, or its int32 copy in C order
  Eigen::Index rows = 0, cols = 0;   // [prod(leading), last axis]
  IntMatrixView view() const {
    if (values.dtype().is(py::dtype::of<std::int8_t>())) return {static_cast<const std::int8_t*>(values.data()), rows, cols};
    if (values.dtype().is(py::dtype::of<std::int16_t>())) return {static_cast<const std::int16_t*>(values.data()), rows, cols};
    return {static_cast<const std::int32_t*>(values.data()), rows, cols};
  }
};

IntInput read_int_array(const py::handle& object, const char* name) {
  if (!py::isinstance<py::array>(object))
    throw py::type_error(std::string(name) + ": expected a NumPy array of int8, int16 or int32, got " +
                         std::string(py::str(py::type::of(object))));
  const Array a = py::reinterpret_borrow<Array>(object);
  const bool ok = a.dtype().is(py::dtype::of<std::int8_t>()) || a.dtype().is(py::dtype::of<std::int16_t>()) ||
                  a.dtype().is(py::dtype::of<std::int32_t>());
  if (!ok)
    throw py::type_error(std::string(name) + ": expected dtype int8, int16 or int32 (integer logits), got " +
                         std::string(py::str(a.dtype())));
  if (a.ndim() < 1) throw py::value_error(std::string(name) + ": expected at least one axis, got a scalar");
  IntInput in;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) in.shape.push_back(a.shape(i));
  constexpr int kInPlace = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
  if ((a.flags() & kInPlace) == kInPlace)
    in.values = a;
  else
    in.values = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>::ensure(a);
  in.cols = in.shape.back();
  in.rows = in.cols ? static_cast<Eigen::Index>(in.values.size()) / in.cols : 0;
  return in;
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

// Thrown inside an analysis once a signal's handler has raised (Ctrl-C): it stops the workers between blocks and the
// user's callables between calls. Python sees the handler's exception, never this.
struct AnalysisInterrupted : std::exception {
  const char* what() const noexcept override { return "analysis interrupted"; }
};

// What the calls of the user's callables share within one analysis: the lock under which the callables not declared
// thread-safe run, one call at a time across all of them; the flag that stops every call once a signal is seen; and
// what the callables raised, each Python exception beside the reason of the std::invalid_argument it became, so that
// analyze_report can re-raise the exception itself once the evaluation has named the file, layer and method.
struct CallableRaised {
  std::string reason;   // "<method> raised <type>: <message>" and the head of the call: the key
  std::string summary;  // the same without the message, which the exception shows itself
  py::error_already_set error;
};
struct CallableCalls {
  std::mutex serial;
  std::atomic<bool> stop{false};
  std::mutex raised_lock;
  std::vector<CallableRaised> raised;
};

// A user's Python callable as a qattn::Method, for qattn.analyze and qattn.sweep (python/qattn/__init__.py, Method).
// kind "softmax": fn(logits) -> P, logits a float64 array [rows, L] (masked entries -inf), P of the same shape; inside
// attention it sits between float64 logits scale q k^T and float64 P V, as the registry's softmax models do.
// kind "attention": fn(q, k, v, scale, mask) -> O [L_q, d_v] or (O, P); mask None or a bool array [L_q, L_k] (True =
// the query sees the key). The evaluation calls it from its worker threads, each call under the GIL. Unless
// `thread_safe`, a call first takes calls.serial and only then the GIL, never the other way round (a thread holding
// the GIL never waits for the lock, so the two cannot deadlock): the callable runs one call at a time even where it
// releases the GIL (time.sleep, NumPy on large arrays). Whatever it raises, a BaseException included, is kept in
// calls.raised and becomes std::invalid_argument naming the method and the head of the call; a result of the wrong
// shape or with NaN is a std::invalid_argument naming the method (a ValueError naming the file, head and method).
class PythonMethod final : public Method {
 public:
  PythonMethod(std::string name, py::object fn, bool attention, bool thread_safe, CallableCalls& calls)
      : name_(std::move(name)), fn_(std::move(fn)), attention_(attention), thread_safe_(thread_safe), calls_(calls) {}
  ~PythonMethod() override {
    py::gil_scoped_acquire gil;
    fn_ = py::object();
  }

 protected:
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override {
    if (attention_) throw SpecError(name_ + ": an attention callable has no softmax-only form");
    const std::unique_lock<std::mutex> turn = take_turn();
    py::gil_scoped_acquire gil;
    return matrix(invoke([&] { return fn_(to_numpy(logits)); }), logits.rows(), logits.cols(), "P");
  }

  // The heads of a layer's call one after another, each head's index kept for the message of what fn raises.
  std::vector<AttentionResult> attention_heads_impl(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                                    const std::vector<MatrixView>& v, double scale,
                                                    const AttentionMask& mask) const override {
    std::vector<AttentionResult> out;
    for (std::size_t h = 0; h < q.size(); ++h) {
      const HeadOfCall head(h, q.size());
      out.push_back(attention_impl(q[h], k[h], v[h], scale, mask));
    }
    return out;
  }

  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                 const AttentionMask& mask) const override {
    AttentionResult r;
    if (!attention_) {
      RowMatrixXd s = (q * k.transpose()) * scale;
      mask.apply_to_logits(s);
      r.p = softmax_rows(s);
      r.o = r.p * v;
      return r;
    }
    const std::unique_lock<std::mutex> turn = take_turn();
    py::gil_scoped_acquire gil;
    py::object m = py::none();
    if (!mask.empty()) {
      const RowMatrixXb visible = mask.visible(q.rows(), k.rows());
      py::array_t<bool> b({visible.rows(), visible.cols()});
      std::copy(visible.data(), visible.data() + visible.size(), b.mutable_data());
      m = b;
    }
    const py::object out = invoke([&] { return fn_(to_numpy(q), to_numpy(k), to_numpy(v), scale, m); });
    py::object o = out, p = py::none();
    if (py::isinstance<py::tuple>(out) && py::len(out) == 2) o = out[py::int_(0)], p = out[py::int_(1)];
    r.o = matrix(o, q.rows(), v.cols(), "O");
    if (!p.is_none()) r.p = matrix(p, q.rows(), k.rows(), "P");
    return r;
  }

 private:
  // " (head h of the call's n)" while attention_heads_impl runs head h of n > 1 on this thread, else "".
  static inline thread_local std::string head_of_call;
  struct HeadOfCall {
    HeadOfCall(std::size_t h, std::size_t n) {
      if (n > 1) head_of_call = " (head " + std::to_string(h) + " of the call's " + std::to_string(n) + ")";
    }
    ~HeadOfCall() { head_of_call.clear(); }
  };

  // This call's turn: the serial lock unless the callable is thread-safe, taken before the GIL. AnalysisInterrupted
  // once a signal is seen, before and after the wait.
  std::unique_lock<std::mutex> take_turn() const {
    if (calls_.stop) throw AnalysisInterrupted();
    std::unique_lock<std::mutex> turn(calls_.serial, std::defer_lock);
    if (!thread_safe_) turn.lock();
    if (calls_.stop) throw AnalysisInterrupted();
    return turn;
  }

  static py::array_t<double> to_numpy(const MatrixView& x) {
    py::array_t<double> a({x.rows(), x.cols()});
    Eigen::Map<RowMatrixXd>(a.mutable_data(), x.rows(), x.cols()) = x;
    return a;
  }

  // fn() under the GIL. What it raises is kept, with the reason of the std::invalid_argument thrown in its place:
  // "<method> raised <type>: <message>" and the head of the call.
  template <class Fn>
  py::object invoke(Fn&& fn) const {
    try {
      return fn();
    } catch (py::error_already_set& e) {
      const std::string raised = name_ + " raised " + e.type().attr("__name__").cast<std::string>();
      std::string message;
      try {
        message = py::str(e.value());
      } catch (py::error_already_set&) {  // a __str__ that raises: the type alone
      }
      const std::string reason = raised + (message.empty() ? "" : ": " + message) + head_of_call;
      {
        const std::lock_guard<std::mutex> hold(calls_.raised_lock);
        calls_.raised.push_back({reason, raised + head_of_call, e});
      }
      throw std::invalid_argument(reason);
    }
  }

  // What fn returned, as a [rows, cols] float64 matrix (under the GIL).
  RowMatrixXd matrix(const py::object& out, Eigen::Index rows, Eigen::Index cols, const char* what) const {
    py::array_t<double, py::array::c_style | py::array::forcecast> a;
    try {
      a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(out);
    } catch (py::error_already_set& e) {
      throw std::invalid_argument(name_ + ": its " + what + " is not a float array");
    }
    if (!a || a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols)
      throw std::invalid_argument(name_ + ": its " + what + " must be a float array of shape (" + std::to_string(rows) +
                                  ", " + std::to_string(cols) + ")");
    const RowMatrixXd m = Eigen::Map<const RowMatrixXd>(a.data(), rows, cols);
    if (!m.allFinite()) throw std::invalid_argument(name_ + ": its " + what + " holds NaN or inf");
    return m;
  }

  std::string name_;
  py::object fn_;
  bool attention_, thread_safe_;
  CallableCalls& calls_;
};

// Runs body() on a thread of its own while the calling thread, which must not hold the GIL, looks for signals every
// 100 ms: Python runs its signal handlers on the main thread only, under the GIL, so a body run on this thread would
// leave Ctrl-C pending until it ends. Once a handler raises (KeyboardInterrupt), `stop` is set, the body is waited
// for (its workers stop between blocks) and the handler's exception is returned. Otherwise the body's own exception
// is rethrown, or nothing is returned.
std::optional<py::error_already_set> run_checking_signals(const std::function<void()>& body, std::atomic<bool>& stop) {
  std::mutex m;
  std::condition_variable ended;
  bool finished = false;
  std::exception_ptr error;
  std::thread runner([&] {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    const std::lock_guard<std::mutex> hold(m);
    finished = true;
    ended.notify_one();
  });
  std::optional<py::error_already_set> signal;
  std::unique_lock<std::mutex> lock(m);
  while (!ended.wait_for(lock, std::chrono::milliseconds(100), [&] { return finished; })) {
    if (signal) continue;
    lock.unlock();
    {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        signal.emplace();  // fetches the handler's exception
        stop = true;
      }
    }
    lock.lock();
  }
  lock.unlock();
  runner.join();
  if (!signal && error) std::rethrow_exception(error);
  return signal;
}

// Rethrows `failure`. Where it is what a user's callable raised (the evaluation's InputError or the
// std::invalid_argument around it), the callable's own exception is raised instead, with its type and traceback
// (pdb.pm() reaches the callable's frame), and a note with the evaluation's context: the file, layer and batch entry
// or head, the method, and the head of the call. Called with the GIL.
[[noreturn]] void rethrow_raised(const std::exception_ptr& failure, CallableCalls& calls,
                                 const char* caller = "qattn.analyze") {
  const auto raise_own = [&](const std::string& reason, const std::string& where) {
    for (CallableRaised& r : calls.raised) {
      if (r.reason != reason) continue;
      if (py::hasattr(r.error.value(), "add_note"))  // Python 3.11 and newer
        r.error.value().attr("add_note")(std::string(caller) + ": " + where + r.summary);
      throw r.error;
    }
  };
  try {
    std::rethrow_exception(failure);
  } catch (const InputError& e) {
    raise_own(e.reason(), printable(e.source(), 1024) + ": " + printable(e.field(), 200) + ": ");
    throw;
  } catch (const SpecError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    raise_own(e.what(), "");
    throw;
  }
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
    method = t[0].cast<std::string>();
    const std::string kind = t[2].cast<std::string>();
    if (kind != "softmax" && kind != "attention")
      throw py::value_error(method + ": kind must be 'softmax' or 'attention', got '" + kind + "'");
    own = std::make_unique<PythonMethod>(method, t[1].cast<py::object>(), kind == "attention", t[3].cast<bool>(),
                                         own_calls);
  }
  // float32 q, k and v read in place go to the float32 entry; a float32 array next to a float64 one, or with a KV
  // quantizer (which takes float64), is widened.
  Input q = read_float_array(q_obj, "q", true), k = read_float_array(k_obj, "k", true),
        v = read_float_array(v_obj, "v", true);
  const bool f32 = q.f32 && k.f32 && v.f32 && kv.empty();
  if (!f32) q.widen(), k.widen(), v.widen();
  if (q.shape.size() < 2 || q.shape.size() != k.shape.size() || q.shape.size() != v.shape.size())
    throw py::value_error("q, k, v: expected arrays [..., L, d] of the same rank, got " + shape_string(q.shape) + ", " +
                          shape_string(k.shape) + ", " + shape_string(v.shape));
  const std::size_t n = q.shape.size();
  // The axes before the heads' must be equal; the heads' (n >= 3) equal, or H_kv (k and v alike) dividing H_q
  // (eval::group_kv_heads, as `qattn attention`).
  eval::KvGrouping grouping;
  try {
    grouping = eval::group_kv_heads({q.shape.begin(), q.shape.end()}, {k.shape.begin(), k.shape.end()},
                                    {v.shape.begin(), v.shape.end()}, "q", "k", "v");
  } catch (const InputError& e) {
    throw py::value_error(e.what());
  }
  const Eigen::Index lq = q.shape[n - 2], d = q.shape[n - 1], lk = k.shape[n - 2], dv = v.shape[n - 1];
  if (k.shape[n - 1] != d || v.shape[n - 2] != lk)
    throw py::value_error("q, k, v: shapes " + shape_string(q.shape) + ", " + shape_string(k.shape) + ", " +
                          shape_string(v.shape) + " do not fit [..., L_q, d], [..., L_k, d], [..., L_k, d_v]");
  const std::size_t heads = n >= 3 ? static_cast<std::size_t>(q.shape[n - 3]) : 1;
  AttentionMask m;
  m.causal = causal;
  if (mask) {
    if (!mask->dtype().is(py::dtype::of<bool>()) || mask->ndim() != 2 || mask->shape(0) != lq || mask->shape(1) != lk)
      throw py::value_error("mask: expected a bool array of shape (" + std::to_string(lq) + ", " + std::to_string(lk) +
                            ") (True = visible)");
    const auto c = py::array_t<bool, py::array::c_style | py::array::forcecast>::ensure(*mask);
    m.valid = Eigen::Map<const RowMatrixXb>(c.data(), lq, lk);
  }
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::size_t calls = 1;
  for (std::size_t i = 0; i + 3 < n; ++i) calls *= static_cast<std::size_t>(q.shape[i]);  // the axes before heads
  std::vector<double> o(calls * heads * lq * dv), p(return_probs ? calls * heads * lq * lk : 0);
  std::vector<std::int32_t> p_int(raw ? calls * heads * lq * lk : 0);
  DType p_dtype = DType::u8;
  bool have_p = true;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      require_finite_array(q, "Q"), require_finite_array(k, "K"), require_finite_array(v, "V");
      const BuiltMethod built = own ? BuiltMethod{} : build_method(method, engine_options(engine, threads, return_probs));
      const Method& run = own ? *own : *built.method;
      const std::unique_ptr<ref::KvQuantizer> kvq = kv.empty() ? nullptr : ref::kv_registry().create(kv);
      for (std::size_t c = 0; c < calls; ++c) {
        std::vector<MatrixView> qh, kh, vh;
        std::vector<MatrixViewF> qf, kf, vf;
        for (std::size_t h = 0; h < heads; ++h) {
          const std::size_t b = c * heads + h;  // query head h reads K/V head h / (H_q / H_kv)
        const auto bkv = static_cast<std::size_t>(grouping.kv_entry(static_cast<std::int64_t>(b)));
          if (f32) {
            qf.push_back(matrix_at_f32(q, b, lq, d)), kf.push_back(matrix_at_f32(k, bkv, lk, d));
            vf.push_back(matrix_at_f32(v, bkv, lk, dv));
          } else {
            qh.push_back(matrix_at(q, b, lq, d)), kh.push_back(matrix_at(k, bkv, lk, d));
            vh.push_back(matrix_at(v, bkv, lk, dv));
          }
        }
        const std::vector<AttentionResult> r = kvq   ? ref::attention_with_kv(run, *kvq, qh, kh, vh, s, m)
                                               : f32 ? run.attention_heads(qf, kf, vf, s, m)
                                                     : run.attention_heads(qh, kh, vh, s, m);
        for (std::size_t h = 0; h < heads; ++h) {
          std::copy_n(r[h].o.data(), r[h].o.size(), o.data() + (c * heads + h) * lq * dv);
          if (!return_probs) continue;
          if (r[h].p.size() != lq * lk || (raw && r[h].p_int.size() != lq * lk)) {
            have_p = false;
            continue;
          }
          std::copy_n(r[h].p.data(), r[h].p.size(), p.data() + (c * heads + h) * lq * lk);
          if (!raw) continue;
          std::copy_n(r[h].p_int.data(), r[h].p_int.size(), p_int.data() + (c * heads + h) * lq * lk);
          p_dtype = r[h].p_dtype;
        }
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) rethrow_raised(failure, own_calls, "qattn.attention");
  std::vector<Eigen::Index> o_shape(q.shape.begin(), q.shape.end() - 1);
  o_shape.push_back(dv);
  py::array_t<double> o_array = to_array(o, o_shape);
  if (!return_probs) return o_array;
  if (!have_p)
    throw py::value_error(method + (raw ? ": this method has no integer P; call with raw=False"
                                        : ": this method does not materialise P; call with return_probs=False"));
  std::vector<Eigen::Index> p_shape(q.shape.begin(), q.shape.end() - 1);
  p_shape.push_back(lk);
  if (!raw) return py::make_tuple(o_array, to_array(p, p_shape));
  std::vector<std::int64_t> t_shape(p_shape.begin(), p_shape.end());
  std::vector<double> widened(p_int.begin(), p_int.end());
  return py::make_tuple(o_array, tensor_to_array(Tensor::from_double(p_dtype, t_shape, widened)));
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
  const int workers = thread_count(threads);
  EngineOptions engine_options;
  engine_options.engine = parse_engine(engine);
  std::vector<eval::HeadResult> results;
  std::vector<eval::ReportMethod> plan_methods;
  std::string text;  // the report in `format`, when one is asked for
  CallableCalls calls;  // outlives the methods that refer to it
  std::vector<std::unique_ptr<Method>> users;
  std::vector<std::string> user_labels;
  for (const py::tuple& t : own) {
    if (t.size() != 4) throw std::invalid_argument("own methods: (label, callable, kind, thread_safe) tuples");
    const std::string label = t[0].cast<std::string>(), kind = t[2].cast<std::string>();
    if (kind != "softmax" && kind != "attention")
      throw std::invalid_argument(label + ": kind must be 'softmax' or 'attention', got '" + kind + "'");
    if (softmax_only && kind == "attention")
      throw std::invalid_argument(label + ": an attention callable has no softmax-only form");
    users.push_back(std::make_unique<PythonMethod>(label, t[1].cast<py::object>(), kind == "attention",
                                                   t[3].cast<bool>(), calls));
    user_labels.push_back(label);
  }
  const auto analysis = [&] {
    eval::AnalysisPlan plan = eval::plan_analysis(
        specs, kv, weights, softmax_only, reference, false,
        [&](const MethodSpec& spec) { return build_method(spec, engine_options).method; }, own.empty());
    // Nothing declared: whole calls, compared block by block. (A PythonMethod's destructor takes the GIL itself, so
    // the plan may go out of scope here on an error.)
    for (std::size_t u = 0; u < users.size(); ++u) plan.add_own(user_labels[u], std::move(users[u]));
    // The table's choices, refused before the dump is read; the methods in the order the caller gave them (the plan
    // has the registry's specs first), where that order names each of the plan's methods once.
    eval::ReportOptions choices;
    choices.summary = summary_only, choices.columns = columns;
    if (!format.empty()) {
      const eval::ReportView planned = eval::report_view(plan, tensors, 0);
      std::vector<std::string> labels, wanted = order;
      for (const eval::ReportMethod& m : planned.methods) labels.push_back(m.label);
      std::sort(labels.begin(), labels.end()), std::sort(wanted.begin(), wanted.end());
      if (labels == wanted && std::adjacent_find(labels.begin(), labels.end()) == labels.end()) choices.methods = order;
      eval::check_report_options(planned, choices, format);
    }
    std::vector<eval::DumpLayer> dump =
        eval::load_dump(tensors, softmax_only ? eval::DumpTarget::softmax : eval::DumpTarget::attention, reference,
                        nullptr, /*with_reference=*/false);
    if (plan.wq && !calls.stop) eval::quantize_projections(dump, tensors, *plan.wq);
    if (calls.stop) throw AnalysisInterrupted();
    eval::EvalOptions options;
    options.threads = workers;
    // A worker that finishes an item after Ctrl-C throws: parallel_for starts no further item and joins the others.
    options.progress = [&calls](std::size_t, std::size_t) {
      if (calls.stop) throw AnalysisInterrupted();
    };
    results = eval::evaluate_plan(dump, plan, options);
    std::size_t n_heads = 0;
    for (const eval::DumpLayer& l : dump) n_heads += l.heads.size();
    const eval::ReportView view = eval::report_view(plan, tensors, n_heads);
    plan_methods = view.methods;
    if (!format.empty()) text = eval::render_report(view, results, format, choices);
  };
  std::optional<py::error_already_set> signal;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      signal = run_checking_signals(analysis, calls.stop);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (signal) throw *signal;
  if (failure) rethrow_raised(failure, calls);
  py::list heads, summary;
  for (const eval::HeadResult& r : results) {
    py::dict h;
    h["layer"] = r.layer, h["head"] = r.head, h["method"] = r.method;
    h["O"] = stats_dict(r.o), h["P"] = stats_dict(r.p);
    h["P_kl_mean"] = r.kl.mean, h["P_kl_max"] = r.kl.max, h["K_bits"] = r.k_bits, h["V_bits"] = r.v_bits;
    heads.append(h);
  }
  for (const eval::ReportMethod& method : plan_methods) {
    std::vector<eval::HeadResult> mine;
    for (const eval::HeadResult& r : results)
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
  if (!format.empty()) report["text"] = text;
  return report;
}

// x as a C-ordered float32 array: a float array of any shape (0-d included), a NumPy float scalar or a Python float;
// float64 is rounded to float32 (the conversions take float32), float16 widens exactly. Other dtypes (integers, bool,
// complex) are a TypeError, not a cast.
py::array_t<float, py::array::c_style | py::array::forcecast> float32_input(const py::handle& x_obj) {
  const bool scalar = py::isinstance<py::float_>(x_obj) ||
                      py::isinstance(x_obj, py::module_::import("numpy").attr("floating"));
  if (!py::isinstance<py::array>(x_obj) && !scalar)
    throw py::type_error("x: expected a NumPy float array, a NumPy float scalar or a Python float, got " +
                         std::string(py::str(py::type::of(x_obj))));
  const py::array given = py::array::ensure(x_obj);
  if (!given || given.dtype().kind() != 'f' || given.itemsize() > 8)  // float16, float32, float64; not longdouble
    throw py::type_error("x: dtype " + (given ? std::string(py::str(given.dtype())) : std::string("unknown")) +
                         ": expected floats (float16, float32 or float64)");
  const auto x = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(given);
  if (!x) throw py::type_error("x: expected a float array");
  return x;
}

// fp8_encode(x, format, saturate): float32 values -> FP8 codes as an H100 converts them (ref::fp8_from_float):
// saturate=True is PTX cvt.rn.satfinite, False is torch's .to(float8_*); x as float32_input takes it.
py::array_t<std::uint8_t> fp8_encode(const py::handle& x_obj, const std::string& format, bool saturate) {
  const ref::LowpFormat* f = format == "e4m3fn" ? &ref::fp8_e4m3fn() : format == "e5m2" ? &ref::fp8_e5m2() : nullptr;
  if (!f) throw std::invalid_argument("fp8_encode: format must be 'e4m3fn' or 'e5m2', got '" + format + "'");
  const auto x = float32_input(x_obj);
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  py::array_t<std::uint8_t> out(shape);
  const ref::Fp8Cast cast = saturate ? ref::Fp8Cast::ptx_satfinite : ref::Fp8Cast::torch;
  const float* in = x.data();
  std::uint8_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (py::ssize_t i = 0; i < x.size(); ++i) o[i] = ref::fp8_from_float(in[i], *f, cast);
  }
  return out;
}

ref::LowpCode code_format(const std::string& format) {
  const std::optional<ref::LowpCode> f = ref::lowp_code_format(format);
  if (!f) throw py::value_error("format: '" + format + "' is not one of " + ref::lowp_code_names());
  return *f;
}

// lowp_encode(x, format, rounding, saturate): float32 -> codes (ref::lowp_encode_f32, docs/lowp-float.md).
py::array_t<std::uint8_t> lowp_encode(const py::handle& x_obj, const std::string& format, const std::string& rounding,
                                      bool saturate) {
  const ref::LowpCode f = code_format(format);
  if (rounding != "rn" && rounding != "rz" && rounding != "rp")
    throw py::value_error("rounding: '" + rounding + "' is not rn, rz or rp");
  const ref::LowpCodeRounding r = rounding == "rn"   ? ref::LowpCodeRounding::rn
                                  : rounding == "rz" ? ref::LowpCodeRounding::rz
                                                     : ref::LowpCodeRounding::rp;
  try {
    ref::lowp_check_conversion(f, r, saturate);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  const auto x = float32_input(x_obj);
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  py::array_t<std::uint8_t> out(shape);
  const float* in = x.data();
  std::uint8_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (py::ssize_t i = 0; i < x.size(); ++i) o[i] = ref::lowp_encode_f32(in[i], f, r, saturate);
  }
  return out;
}

// lowp_decode(codes, format): uint8 codes -> their float32 values (every value of these formats is a float32).
py::array_t<float> lowp_decode(const py::handle& codes_obj, const std::string& format) {
  const ref::LowpCode f = code_format(format);
  const py::array given = py::array::ensure(codes_obj);
  if (!given || given.dtype().kind() != 'u' || given.itemsize() != 1)
    throw py::type_error("codes: expected a uint8 array, got " +
                         (given ? std::string(py::str(given.dtype())) : std::string(py::str(py::type::of(codes_obj)))));
  const auto c = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(given);
  std::vector<py::ssize_t> shape(c.shape(), c.shape() + c.ndim());
  py::array_t<float> out(shape);
  for (py::ssize_t i = 0; i < c.size(); ++i) {
    try {
      out.mutable_data()[i] = static_cast<float>(ref::lowp_decode_code(c.data()[i], f));
    } catch (const std::invalid_argument& e) {
      throw py::value_error("codes: element " + std::to_string(i) + ": " + e.what());
    }
  }
  return out;
}

// The rows and columns of a block quantiser's input: the last axis and the product of the others.
std::pair<std::size_t, std::size_t> rows_cols(const py::array& x) {
  if (x.ndim() < 1) throw py::value_error("x: a 0-d array has no last axis to cut into blocks");
  const auto cols = static_cast<std::size_t>(x.shape(x.ndim() - 1));
  return {cols == 0 ? 0 : static_cast<std::size_t>(x.size()) / cols, cols};
}

py::array_t<std::uint8_t> codes_array(const std::vector<std::uint8_t>& v, std::vector<py::ssize_t> shape) {
  py::array_t<std::uint8_t> out(shape);
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

// mx_quantize(x, format, block) -> (codes, scales): OCP MX v1.0 over the last axis (ref::mx_quantize).
py::tuple mx_quantize(const py::handle& x_obj, const std::string& format, std::size_t block) {
  const ref::LowpCode f = code_format(format);
  const auto x = float32_input(x_obj);
  const auto [rows, cols] = rows_cols(x);
  ref::MxQuantized q;
  try {
    q = ref::mx_quantize(std::span(x.data(), static_cast<std::size_t>(x.size())), rows, cols, f, block);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(std::string("x: ") + e.what());
  }
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim()), scale_shape = shape;
  scale_shape.back() = static_cast<py::ssize_t>(block == 0 ? 0 : cols / block);
  return py::make_tuple(codes_array(q.codes, shape), codes_array(q.scales, scale_shape));
}

// nvfp4_quantize(x) -> (codes, scales, global_scale): Transformer Engine's NVFP4 recipe (ref::nvfp4_quantize).
py::tuple nvfp4_quantize(const py::handle& x_obj) {
  const auto x = float32_input(x_obj);
  const auto [rows, cols] = rows_cols(x);
  ref::Nvfp4Quantized q;
  try {
    q = ref::nvfp4_quantize(std::span(x.data(), static_cast<std::size_t>(x.size())), rows, cols);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(std::string("x: ") + e.what());
  }
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim()), scale_shape = shape;
  scale_shape.back() = static_cast<py::ssize_t>(cols / 16);
  return py::make_tuple(codes_array(q.codes, shape), codes_array(q.scales, scale_shape), q.global_scale);
}

// The codes of an MMA operand (an array whose shape ref::mma_shape passed): uint8 FP8 codes, uint16 16-bit
// patterns, or floats exact in the model's input format.
std::vector<std::uint16_t> mma_operand(const py::array& arr, const ref::MmaModel& m, const char* name) {
  const py::handle obj = arr;
  const int bits = ref::mma_input_bits(m.input);
  const ref::LowpFormat& f = ref::mma_input_format(m.input);
  std::vector<std::uint16_t> codes(static_cast<std::size_t>(arr.size()));
  const char kind = arr.dtype().kind();
  if (kind == 'u') {
    if (arr.itemsize() * 8 != bits)
      throw py::value_error(std::string(name) + ": " + std::string(py::str(arr.dtype())) + " codes, but model " + m.name +
                            " takes " + f.name + (bits == 8 ? " codes (uint8)" : " bit patterns (uint16)"));
    if (bits == 8) {
      const auto c = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(obj);
      std::copy(c.data(), c.data() + c.size(), codes.begin());
      if (m.input == ref::MmaInput::e2m1)
        for (std::size_t i = 0; i < codes.size(); ++i)
          if (codes[i] > 0x0f)
            throw py::value_error(std::string(name) + ": element " + std::to_string(i) + " (code " +
                                  std::to_string(codes[i]) + ") is not an E2M1 code: one code per byte, 0 to 15 "
                                  "(the low nibble; packed pairs are not read)");
    } else {
      const auto c = py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast>::ensure(obj);
      std::copy(c.data(), c.data() + c.size(), codes.begin());
    }
    return codes;
  }
  if (kind != 'f')
    throw py::type_error(std::string(name) + ": expected uint8 codes, uint16 patterns or floats exact in " + f.name +
                         ", got " + std::string(py::str(arr.dtype())));
  const auto v = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(obj);
  for (py::ssize_t i = 0; i < v.size(); ++i) {
    try {
      codes[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(ref::lowp_encode(v.data()[i], f));
    } catch (const std::invalid_argument&) {
      throw py::value_error(std::string(name) + ": element " + std::to_string(i) + " (" + std::to_string(v.data()[i]) +
                            ") is not a value of " + f.name + "; round it first (qattn.fp8_encode for FP8)");
    }
  }
  return codes;
}

// mma(a, bt, c, model, scale_a, scale_bt): D = A·B + C through an MMA model, batched over the leading dimensions.
// The shapes, C and the scales pass the checks of qattn mma (ref::mma_shape, ref::mma_accumulator, ref::mma_scales)
// before anything is allocated: a refusal is a ValueError (a TypeError for a dtype) with the CLI's message, "a",
// "bt", "c", "scale_a" or "scale_bt" in place of the file.
py::array mma(const py::handle& a_obj, const py::handle& bt_obj, const py::handle& c_obj, const std::string& model,
              const py::handle& sa_obj, const py::handle& sbt_obj) {
  const ref::MmaModel* m = nullptr;
  try {
    m = &ref::mma_preset(model);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  for (const auto& [obj, name] : {std::pair{a_obj, "a"}, std::pair{bt_obj, "bt"}})
    if (!py::isinstance<py::array>(obj))
      throw py::type_error(std::string(name) + ": expected a NumPy array, got " + std::string(py::str(py::type::of(obj))));
  const auto a_arr = py::reinterpret_borrow<py::array>(a_obj), bt_arr = py::reinterpret_borrow<py::array>(bt_obj);
  const std::vector<std::int64_t> sa(a_arr.shape(), a_arr.shape() + a_arr.ndim()),
      sb(bt_arr.shape(), bt_arr.shape() + bt_arr.ndim());
  const ref::MmaShape shape = ref::mma_shape(sa, sb, "a", "bt");
  ref::mma_check_depth(*m, shape, "a");
  std::vector<float> c;
  if (!c_obj.is_none()) {
    const py::array ca = py::array::ensure(c_obj, py::array::c_style);
    if (!ca) throw py::type_error("c: expected a float32 or float16 array, got " + std::string(py::str(py::type::of(c_obj))));
    const std::vector<std::int64_t> sc(ca.shape(), ca.shape() + ca.ndim());
    try {
      c = ref::mma_accumulator(*m, shape, std::string(py::str(ca.dtype())), sc, ca.data(), "c");
    } catch (const InputError& e) {
      if (e.field() == "dtype") throw py::type_error(e.what());
      throw;
    }
  }
  std::vector<std::uint8_t> scales[2];
  for (int i = 0; i < 2; ++i) {
    const py::handle obj = i == 0 ? sa_obj : sbt_obj;
    const char* name = i == 0 ? "scale_a" : "scale_bt";
    const char* operand = i == 0 ? "a" : "bt";
    try {
      if (obj.is_none()) {
        scales[i] = ref::mma_scales(*m, shape, i == 1, false, "", {}, nullptr, operand);
        continue;
      }
      const py::array arr = py::array::ensure(obj, py::array::c_style);
      if (!arr) throw py::type_error(std::string(name) + ": expected a uint8 array, got " + std::string(py::str(py::type::of(obj))));
      const std::vector<std::int64_t> shp(arr.shape(), arr.shape() + arr.ndim());
      scales[i] = ref::mma_scales(*m, shape, i == 1, true, std::string(py::str(arr.dtype())), shp, arr.data(), name);
    } catch (const InputError& e) {
      if (e.field() == "dtype") throw py::type_error(e.what());
      throw;
    }
  }
  const std::vector<std::uint16_t> a = mma_operand(a_arr, *m, "a"), bt = mma_operand(bt_arr, *m, "bt");
  const bool f16 = m->accumulator == ref::MmaAccumulator::f16;
  py::array out(py::dtype(f16 ? "float16" : "float32"), shape.d);
  std::vector<float> d16(f16 ? shape.outputs : 0);  // f16: the float32 results before they are stored as binary16
  {
    py::gil_scoped_release release;
    const std::span<float> d = f16 ? std::span<float>(d16) : std::span(static_cast<float*>(out.mutable_data()), shape.outputs);
    ref::mma_batched(*m, shape, a, bt, c, d, scales[0], scales[1]);
    auto* bits = static_cast<std::uint16_t*>(out.mutable_data());
    for (std::size_t i = 0; i < d16.size(); ++i) bits[i] = f32_to_f16_bits(d16[i]);  // exact: binary16 values
  }
  return out;
}

py::list mma_models() {
  py::list out;
  for (const ref::MmaModel& m : ref::mma_presets()) {
    py::dict d;
    d["name"] = m.name, d["parameters"] = m.describe(), d["provenance"] = m.provenance, d["validated"] = m.validated;
    d["measured"] = m.measured;
    d["accumulator"] = m.accumulator == ref::MmaAccumulator::f16 ? "f16" : "f32";
    d["scale"] = m.scale == ref::MmaScale::none ? py::object(py::none()) : py::object(py::str(ref::mma_scale_name(m.scale)));
    d["scale_block"] = m.scale_block;
    out.append(d);
  }
  return out;
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
  m.def("fp8_encode", &fp8_encode, py::arg("x"), py::arg("format"), py::arg("saturate") = true);
  m.def("lowp_encode", &lowp_encode, py::arg("x"), py::arg("format"), py::arg("rounding"), py::arg("saturate"));
  m.def("lowp_decode", &lowp_decode, py::arg("codes"), py::arg("format"));
  m.def("mx_quantize", &mx_quantize, py::arg("x"), py::arg("format"), py::arg("block"));
  m.def("nvfp4_quantize", &nvfp4_quantize, py::arg("x"));
  m.def("mma", &mma, py::arg("a"), py::arg("bt"), py::arg("c"), py::arg("model"), py::arg("scale_a"),
        py::arg("scale_bt"));
  m.def("mma_models", &mma_models);
  m.def("load", &load, py::arg("path"));
  m.def("save", &save, py::arg("path"), py::arg("arrays"));
}
