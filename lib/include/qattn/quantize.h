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
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>

namespace qattn {

// The rounding of x / s to a code: round half to even (the official IntAttention simulation, every other pipeline),
// or floor as IntAttention's Eq. 3 prints it (its @paper preset). The clamp is the same for both.
enum class Int8Rounding { rne, floor };

// Writes the codes of x to q (same length) and returns s. Throws std::invalid_argument if max |x| is not finite.
template <class T>
double quantize_int8_symmetric(std::span<const T> x, std::span<std::int8_t> q, Int8Rounding rounding = Int8Rounding::rne) {
  double amax = 0;
  for (const T v : x) amax = std::max(amax, std::abs(static_cast<double>(v)));
  if (!std::isfinite(amax)) throw std::invalid_argument("quantize_int8_symmetric: non-finite input");
  const double scale = amax > 0 ? amax / 127 : 1.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double t = static_cast<double>(x[i]) / scale;
    constexpr double kRound = 0x1.8p52;  // needs IEEE evaluation: no -ffast-math (CMakeLists.txt sets none)
    q[i] = static_cast<std::int8_t>(std::clamp(rounding == Int8Rounding::rne ? (t + kRound) - kRound : std::floor(t), -127.0, 127.0));
  }
  return scale;
}

}  // namespace qattn
