// The per-tensor symmetric INT8 quantiser of every integer pipeline: the reference models (Quant-Only, IntAttention),
// the fused kernels' driver and the bench all call this one.
//
//   s = max |x| / 127   (s = 1 when every x is 0, so the codes are 0 and nothing divides by zero)
//   q = clamp(round-half-even(x / s), -127, 127)      (-128 is never used: the grid is symmetric)
//
// x / s is a double division (float inputs are widened exactly first); round-half-even is std::nearbyint in the
// default rounding mode; the clamp only matters for values that round past 127 by the division's rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>

namespace qattn {

// Writes the codes of x to q (same length) and returns s. Throws std::invalid_argument if max |x| is not finite.
template <class T>
double quantize_int8_symmetric(std::span<const T> x, std::span<std::int8_t> q) {
  double amax = 0;
  for (const T v : x) amax = std::max(amax, std::abs(static_cast<double>(v)));
  if (!std::isfinite(amax)) throw std::invalid_argument("quantize_int8_symmetric: non-finite input");
  const double scale = amax > 0 ? amax / 127 : 1.0;
  for (std::size_t i = 0; i < x.size(); ++i)
    q[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(static_cast<double>(x[i]) / scale), -127.0, 127.0));
  return scale;
}

}  // namespace qattn
