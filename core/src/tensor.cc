#include "qattn/tensor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "qattn/float_format.h"

namespace qattn {

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

std::uint16_t f32_to_f16_bits(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  const double r = round_to_format(x, kBinary16);  // exact value of the nearest binary16
  if (std::isinf(r)) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const double a = std::fabs(r);
  if (a == 0.0) return sign;
  int e = std::ilogb(a);
  if (e < -14) {  // subnormal: a = m * 2^-24
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(a, 24)));
  }
  const auto mant = static_cast<std::uint16_t>(std::ldexp(a, 10 - e) - 1024.0);
  return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | mant);
}

float f16_bits_to_f32(std::uint16_t h) {
  const bool neg = (h & 0x8000u) != 0;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(mant, -24);
  else v = std::ldexp(1024 + mant, exp - 25);
  return static_cast<float>(neg ? -v : v);
}

std::uint16_t f32_to_bf16_bits(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  // bfloat16 is the top half of binary32; round the dropped 16 bits to nearest, ties to even. Overflow carries
  // into the exponent and yields infinity, as it should.
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float bf16_bits_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::int64_t Tensor::element_count() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

namespace {

// Bits is the signed integer of T's width: with the sign bit cleared every pattern is non-negative.
template <class Bits, class T>
std::size_t finite_prefix_of(std::span<const T> x) {
  static_assert(sizeof(Bits) == sizeof(T));
  constexpr Bits kMagnitude = std::numeric_limits<Bits>::max();                       // all but the sign
  constexpr Bits kExponent = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());  // exponent all ones
  constexpr std::size_t kBlock = 256, kLanes = 16;  // 16 independent maxima: not one dependency chain
  for (std::size_t b = 0; b < x.size(); b += kBlock) {
    const std::size_t n = std::min(kBlock, x.size() - b);
    Bits top[kLanes] = {};
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (std::size_t l = 0; l < kLanes; ++l)
        top[l] = std::max(top[l], static_cast<Bits>(std::bit_cast<Bits>(x[b + i + l]) & kMagnitude));
    for (; i < n; ++i) top[0] = std::max(top[0], static_cast<Bits>(std::bit_cast<Bits>(x[b + i]) & kMagnitude));
    if (*std::max_element(top, top + kLanes) < kExponent) continue;
    for (std::size_t i = 0; i < n; ++i)
      if (!std::isfinite(x[b + i])) return b + i;
  }
  return x.size();
}

}  // namespace

std::size_t finite_prefix(std::span<const float> x) { return finite_prefix_of<std::int32_t>(x); }
std::size_t finite_prefix(std::span<const double> x) { return finite_prefix_of<std::int64_t>(x); }

namespace {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double element_to_double(DType t, const std::byte* p) {
  switch (t) {
    case DType::f64: return load<double>(p);
    case DType::f32: return load<float>(p);
    case DType::f16: return f16_bits_to_f32(load<std::uint16_t>(p));
    case DType::bf16: return bf16_bits_to_f32(load<std::uint16_t>(p));
    case DType::i8: return load<std::int8_t>(p);
    case DType::u8: return load<std::uint8_t>(p);
    case DType::i16: return load<std::int16_t>(p);
    case DType::i32: return load<std::int32_t>(p);
    case DType::i64: return static_cast<double>(load<std::int64_t>(p));
    case DType::u16: return load<std::uint16_t>(p);
    case DType::u32: return load<std::uint32_t>(p);
  }
  return 0.0;
}

// Integers are stored only when exactly representable. The upper limit is compared as max + 1 (a power of two,
// exact in double) so that int64's 2^63 - 1, which double cannot hold, is handled correctly.
template <class I>
void store_integer(double v, std::byte* p, DType t) {
  const double lo = static_cast<double>(std::numeric_limits<I>::min());
  const double hi_exclusive = std::ldexp(1.0, std::numeric_limits<I>::digits);
  if (!(v == std::nearbyint(v)) || v < lo || v >= hi_exclusive)
    throw std::domain_error("value " + std::to_string(v) + " is not representable as " + std::string(dtype_name(t)));
  const I i = static_cast<I>(v);
  std::memcpy(p, &i, sizeof(I));
}

}  // namespace

Eigen::ArrayXd Tensor::to_double() const {
  const std::int64_t n = element_count();
  Eigen::ArrayXd out(n);
  const std::size_t w = dtype_size(dtype);
  for (std::int64_t i = 0; i < n; ++i) out[i] = element_to_double(dtype, bytes.data() + i * w);
  return out;
}

std::int32_t IntMatrixView::operator()(Eigen::Index r, Eigen::Index c) const {
  const Eigen::Index i = r * cols_ + c;
  switch (dtype_) {
    case DType::i8: return static_cast<const std::int8_t*>(data_)[i];
    case DType::i16: return static_cast<const std::int16_t*>(data_)[i];
    default: return static_cast<const std::int32_t*>(data_)[i];
  }
}

const std::int32_t* IntMatrixView::row(Eigen::Index r, std::vector<std::int32_t>& scratch) const {
  if (dtype_ == DType::i32) return static_cast<const std::int32_t*>(data_) + r * cols_;
  scratch.resize(static_cast<std::size_t>(cols_));
  for (Eigen::Index c = 0; c < cols_; ++c) scratch[static_cast<std::size_t>(c)] = (*this)(r, c);
  return scratch.data();
}

std::vector<MatrixView> views(const std::vector<RowMatrixXd>& m) {
  return {m.begin(), m.end()};
}

std::vector<MatrixViewF> views(const std::vector<RowMatrixXf>& m) {
  return {m.begin(), m.end()};
}

namespace {

template <class View, class Matrix>
const typename Matrix::Scalar* packed(const View& x, Matrix& storage) {
  if (x.outerStride() == x.cols() || x.rows() <= 1) return x.data();
  storage = x;
  return storage.data();
}

}  // namespace

const double* packed_rows(const MatrixView& x, RowMatrixXd& storage) { return packed(x, storage); }
const float* packed_rows(const MatrixViewF& x, RowMatrixXf& storage) { return packed(x, storage); }

RowMatrixXd Tensor::as_rows() const {
  const std::int64_t cols = shape.empty() ? 1 : shape.back();
  const std::int64_t n = element_count();
  if (cols == 0) {
    if (n != 0) throw std::invalid_argument("as_rows: last axis has size 0");
    return RowMatrixXd(0, 0);
  }
  RowMatrixXd out(n / cols, cols);  // filled in place: no flat copy first (fresh pages are costly)
  const std::size_t w = dtype_size(dtype);
  for (std::int64_t i = 0; i < n; ++i) out.data()[i] = element_to_double(dtype, bytes.data() + i * w);
  return out;
}

std::string Tensor::shape_string() const {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Tensor Tensor::from_double(DType dtype, std::vector<std::int64_t> shape, std::span<const double> values) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  if (t.element_count() != static_cast<std::int64_t>(values.size()))
    throw std::invalid_argument("from_double: " + std::to_string(values.size()) + " values for shape " +
                                t.shape_string());
  const std::size_t w = dtype_size(dtype);
  t.bytes.resize(values.size() * w);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::byte* p = t.bytes.data() + i * w;
    const double v = values[i];
    switch (dtype) {
      case DType::f64: std::memcpy(p, &v, 8); break;
      case DType::f32: {
        // double -> float is IEEE round-to-nearest-even in hardware (one rounding, overflow to inf).
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::f16: {
        // Round from double directly: going through float first could round twice.
        const double r = round_to_format(v, kBinary16);
        const std::uint16_t h = f32_to_f16_bits(static_cast<float>(r));  // exact: r is a binary16 value
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::bf16: {
        const double r = round_to_format(v, kBfloat16);
        const std::uint16_t h = f32_to_bf16_bits(static_cast<float>(r));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::i8: store_integer<std::int8_t>(v, p, dtype); break;
      case DType::u8: store_integer<std::uint8_t>(v, p, dtype); break;
      case DType::i16: store_integer<std::int16_t>(v, p, dtype); break;
      case DType::i32: store_integer<std::int32_t>(v, p, dtype); break;
      case DType::i64: store_integer<std::int64_t>(v, p, dtype); break;
      case DType::u16: store_integer<std::uint16_t>(v, p, dtype); break;
      case DType::u32: store_integer<std::uint32_t>(v, p, dtype); break;
    }
  }
  return t;
}

}  // namespace qattn
