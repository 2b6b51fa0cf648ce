// NumPy arrays in and out of qattn's Python binding (_qattn): how an argument is read (in place or converted once,
// python/src/module.cc's header says when), checked, and viewed as the library's matrices; the threads and engine
// arguments as the library takes them. Part of the binding; not installed.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qattn/engine.h"
#include "qattn/tensor.h"

namespace qattn::python {
namespace py = pybind11;
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
Input read_float_array(const py::handle& object, const char* name, bool float32_in_place = false);

// "(2, 3)", "(4,)": a shape as NumPy prints it.
std::string shape_string(const std::vector<Eigen::Index>& s);

// The policy of docs/non-finite.md on a whole array, so that the error names the entry by its index in the caller's
// array ("Q: [1, 2, 3, 5]: is NaN"), not in the matrix of one head: NaN and +inf are refused, and -inf too unless
// `masks` (softmax logits, where -inf means masked). The methods check again, per matrix; this check comes first.
void require_finite_array(const Input& in, const std::string& tensor, bool masks = false);

// Matrix `batch` of the [..., rows, cols] values, in place.
MatrixView matrix_at(const Input& in, std::size_t batch, Eigen::Index rows, Eigen::Index cols);
MatrixViewF matrix_at_f32(const Input& in, std::size_t batch, Eigen::Index rows, Eigen::Index cols);

// A new float64 array of `shape` holding `values`.
py::array_t<double> to_array(const std::vector<double>& values, const std::vector<Eigen::Index>& shape);

// `threads` as the CLI takes --threads: [0, 1024], 0 meaning one per hardware thread (resolve_threads, the one place
// that says so). ValueError otherwise.
int thread_count(std::int64_t threads);
// EngineOptions from the engine's name ("auto", "fast", "reference"), thread_count(threads) and probs.
EngineOptions engine_options(const std::string& engine, std::int64_t threads, bool probs);

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
IntInput read_int_array(const py::handle& object, const char* name);

}  // namespace qattn::python
