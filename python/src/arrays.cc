// NumPy arrays in and out of the binding (arrays.h).
#include "arrays.h"

#include <algorithm>
#include <cmath>

#include "qattn/error.h"
#include "qattn/parallel.h"

namespace qattn::python {
namespace {

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

}  // namespace

Input read_float_array(const py::handle& object, const char* name, bool float32_in_place) {
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

void require_finite_array(const Input& in, const std::string& tensor, bool masks) {
  if (in.f32) return require_finite_values(std::span<const float>(in.f32, in.size), in.shape, tensor, masks);
  require_finite_values(in.values(), in.shape, tensor, masks);
}

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

}  // namespace qattn::python
