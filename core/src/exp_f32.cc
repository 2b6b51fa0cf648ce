#include "qattn/exp_f32.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qattn {

float exp_f32_poly(float x) {
  using K = ExpF32Constants;
  if (x == -std::numeric_limits<float>::infinity()) return 0.0f;
  x = std::max(x, K::kMin);
  const float n = std::nearbyint(x * K::kLog2e);
  const float r = (x - n * K::kLn2Hi) - n * K::kLn2Lo;
  float p = K::kC[6];
  for (int k = 5; k >= 1; --k) p = p * r + K::kC[k];
  p = p * r + K::kC[0];
  return std::ldexp(p, static_cast<int>(n));
}

void softmax_row_lanes16(const float* s, const bool* visible, std::ptrdiff_t n, float* p) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::ptrdiff_t j = 0; j < n; ++j)
    if (!visible || visible[j]) m = std::max(m, s[j]);
  if (m == -std::numeric_limits<float>::infinity()) {
    std::fill(p, p + n, 0.0f);
    return;
  }
  float part[16] = {};
  for (std::ptrdiff_t j = 0; j < n; ++j) {
    p[j] = (!visible || visible[j]) ? exp_f32_poly(s[j] - m) : 0.0f;
    part[j % 16] += p[j];
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) part[i] += part[i + w];
  for (std::ptrdiff_t j = 0; j < n; ++j) p[j] /= part[0];
}

}  // namespace qattn
