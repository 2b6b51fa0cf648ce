// The per-tensor symmetric INT8 quantiser of every integer pipeline: the reference models (Quant-Only, IntAttention),
// the fused kernels' driver and the bench all call this one.
//
//   s = max |x| / 127   (s = 1 when every x is 0, so the codes are 0 and nothing divides by zero)
//   q = clamp(round-half-even(x / s), -127, 127)      (-128 is never used: the grid is symmetric; floor instead of
//                                                     round-half-even with Int8Rounding::floor, Eq. 3 as printed)
//
// x / s is a double division (float inputs are widened exactly first); round-half-even is that of the default
// rounding mode, computed as (t + 1.5 2^52) - 1.5 2^52: for |t| < 2^51 the sum's rounding to an integer is the one
// rounding, so this equals std::nearbyint(t) (a library call on baseline x86-64) bit for bit; |t| <= 127 (1 + 2^-52)
// here. The clamp only matters for values that round past 127 by the division's rounding.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <type_traits>

namespace qattn {

// The rounding of x / s to a code: round half to even (the official IntAttention simulation, every other pipeline),
// or floor as IntAttention's Eq. 3 prints it (its @paper preset). The clamp is the same for both.
enum class Int8Rounding { rne, floor };

// max |x|, computed on the bit patterns: with the sign bit cleared an IEEE float orders as an unsigned integer, so
// the integer maximum (which the compiler vectorises; a floating-point max reduction it does not, without
// -ffast-math) is the largest magnitude, and any NaN or infinity makes it non-finite.
template <class T>
double max_abs(std::span<const T> x) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  // Signed: with the sign bit cleared every pattern is non-negative, and signed compares are the cheaper ones.
  using Bits = std::conditional_t<std::is_same_v<T, float>, std::int32_t, std::int64_t>;
  constexpr Bits kMagnitude = std::numeric_limits<Bits>::max();
  constexpr std::size_t kLanes = 16;  // independent maxima, so the loop is not one dependency chain
  Bits top[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) top[l] = std::max(top[l], static_cast<Bits>(std::bit_cast<Bits>(x[i + l]) & kMagnitude));
  for (; i < x.size(); ++i) top[0] = std::max(top[0], static_cast<Bits>(std::bit_cast<Bits>(x[i]) & kMagnitude));
  return static_cast<double>(std::bit_cast<T>(*std::max_element(top, top + kLanes)));
}

// Writes the codes of x to q (same length) and returns s. Throws std::invalid_argument if max |x| is not finite.
template <class T>
double quantize_int8_symmetric(std::span<const T> x, std::span<std::int8_t> q, Int8Rounding rounding = Int8Rounding::rne) {
  const double amax = max_abs(x);
  if (!std::isfinite(amax)) throw std::invalid_argument("quantize_int8_symmetric: non-finite input");
  const double scale = amax > 0 ? amax / 127 : 1.0;
  // Where s is a normal double, |x / s| <= 127 (1 + 2^-52) (|x| <= amax, two roundings), so the rounded quotient is
  // an integer of magnitude <= 128 that converts to int32 exactly and is clamped there (the loop vectorises). Where
  // amax / 127 is subnormal (float64 inputs below 127 2^-1022) the quotient can be far larger, even infinite: the
  // clamp is then taken in double, before any conversion.
  const bool bounded = scale >= std::numeric_limits<double>::min();
  const auto code = [bounded](double rounded) {
    if (bounded) return static_cast<std::int8_t>(std::clamp(static_cast<std::int32_t>(rounded), -127, 127));
    return static_cast<std::int8_t>(std::clamp(rounded, -127.0, 127.0));
  };
  if (rounding == Int8Rounding::rne) {
    constexpr double kRound = 0x1.8p52;  // needs IEEE evaluation: no -ffast-math (CMakeLists.txt sets none)
    for (std::size_t i = 0; i < x.size(); ++i) q[i] = code((static_cast<double>(x[i]) / scale + kRound) - kRound);
  } else {
    for (std::size_t i = 0; i < x.size(); ++i) q[i] = code(std::floor(static_cast<double>(x[i]) / scale));
  }
  return scale;
}

}  // namespace qattn
