// "My" IndexSoftmax row kernel, written from docs/methods/index-softmax.md section 1 as printed in the paper
// (IntAttention Eq. 8, 11, 13, 15: every rounding a floor), for b = 5 and c = 6.6: what a user would write for their
// own hardware. It uses nothing from qattn. own_index_softmax_test.cc checks it against `index@paper`.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace mine {

inline constexpr int kBits = 5;
inline constexpr std::int64_t kT1 = (1 << kBits) - 1;  // T1 = 2^b - 1 table steps
inline constexpr double kC = 6.6;                        // clip in logit units

// LUT[i] = floor(255 exp(-c i / T1)), LUT[0] = 255, LUT[T1] = 0 (Eq. 13, ends forced).
inline std::array<std::int64_t, kT1 + 1> table() {
  std::array<std::int64_t, kT1 + 1> lut{};
  for (int i = 0; i <= kT1; ++i) lut[i] = static_cast<std::int64_t>(std::floor(255.0 * std::exp(-kC * i / kT1)));
  lut[0] = 255;
  lut[kT1] = 0;
  return lut;
}

// UINT8 P (x255) of one row of INT32 logits with integer clip c_int. Two deliberate bugs behind flags: `round_index`,
// the index rounded half up instead of floored (Eq. 11), an off-by-one at step boundaries; `uint16_sum`, the row sum
// kept in a uint16 as IntAttention's NEON kernel keeps it, which wraps once the row sums past 65535 (from about 258
// entries).
inline std::vector<std::int32_t> index_softmax(std::span<const std::int32_t> a, std::int64_t c_int,
                                               bool round_index = false, bool uint16_sum = false) {
  static const auto lut = table();
  std::vector<std::int32_t> p(a.size(), 0);
  if (a.empty()) return p;
  const std::int64_t m = *std::max_element(a.begin(), a.end());
  std::vector<std::int64_t> e(a.size());
  std::int64_t s = 0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    const std::int64_t d = std::min<std::int64_t>(m - a[j], c_int);                   // Eq. 8 clip: [0, c_int]
    const std::int64_t idx = round_index ? (2 * d * kT1 + c_int) / (2 * c_int)      // the bug: round half up
                                         : d * kT1 / c_int;                          // Eq. 11: floor
    e[j] = lut[static_cast<std::size_t>(idx)];
    s += e[j];
  }
  if (uint16_sum) s = static_cast<std::uint16_t>(s);  // the bug: wraps mod 65536
  if (s == 0) s = 1;                                   // (a wrapped sum of 0 would divide by zero)
  for (std::size_t j = 0; j < a.size(); ++j)
    p[j] = static_cast<std::int32_t>(std::min<std::int64_t>(255 * e[j] / s, 255));  // Eq. 15: floor
  return p;
}

// A float softmax kernel of the usual kind, for the contract checker: max subtraction, exp, one division per entry.
// `skip_max` is its deliberate bug: without the max subtraction exp overflows on large logits.
inline std::vector<double> softmax(std::span<const double> x, bool skip_max = false) {
  std::vector<double> p(x.size(), 0.0);
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v);
  if (m == -INFINITY) return p;  // empty or fully masked
  if (skip_max) m = 0;
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += p[i] = std::exp(x[i] - m);
  for (double& v : p) v /= s;
  return p;
}

}  // namespace mine
