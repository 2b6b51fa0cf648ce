// The low-precision formats and matrix units of qattn's Python binding (_qattn, python/src/module.cc): FP8/FP6/FP4
// codes, MX and NVFP4 block quantisation, and the MMA models (qattn.mma, qattn.mma_models). python/qattn/__init__.py
// documents each function. Inputs are converted as module.cc says; outputs are new arrays. The GIL is released
// around every computation.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/lowp_convert.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/tensor.h"

namespace py = pybind11;

namespace qattn::python {
namespace {

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

}  // namespace

void add_lowp_and_mma(py::module_& m) {
  m.def("fp8_encode", &fp8_encode, py::arg("x"), py::arg("format"), py::arg("saturate") = true);
  m.def("lowp_encode", &lowp_encode, py::arg("x"), py::arg("format"), py::arg("rounding"), py::arg("saturate"));
  m.def("lowp_decode", &lowp_decode, py::arg("codes"), py::arg("format"));
  m.def("mx_quantize", &mx_quantize, py::arg("x"), py::arg("format"), py::arg("block"));
  m.def("nvfp4_quantize", &nvfp4_quantize, py::arg("x"));
  m.def("mma", &mma, py::arg("a"), py::arg("bt"), py::arg("c"), py::arg("model"), py::arg("scale_a"),
        py::arg("scale_bt"));
  m.def("mma_models", &mma_models);
}

}  // namespace qattn::python
