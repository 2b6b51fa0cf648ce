#include "qattn/key_groups.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace qattn {

std::string_view to_string(GroupMax rule) { return rule == GroupMax::global ? "global" : "offset"; }

std::vector<std::int64_t> key_group_ratios(std::span<const double> s_k) {
  double s_max = 0;
  for (std::size_t j = 0; j < s_k.size(); ++j) {
    if (!(std::isfinite(s_k[j]) && s_k[j] > 0))
      throw std::invalid_argument("key groups: the scale of key block " + std::to_string(j) + " (" +
                                  std::to_string(s_k[j]) + ") is not a finite number > 0");
    s_max = std::max(s_max, s_k[j]);
  }
  std::vector<std::int64_t> rho(s_k.size());
  for (std::size_t j = 0; j < s_k.size(); ++j) {
    rho[j] = static_cast<std::int64_t>(std::nearbyint(std::ldexp(s_k[j] / s_max, kKeyRatioBits)));
    if (rho[j] < 1)
      throw std::invalid_argument("key groups: the scale of key block " + std::to_string(j) + " is " +
                                  std::to_string(s_k[j] / s_max) +
                                  " of the largest, below the 2^-31 that the fixed-point scale ratio holds");
  }
  return rho;
}

std::int64_t key_group_anchor(std::int64_t mu, std::int64_t rho_j) {
  // floor((2 mu + rho) / (2 rho)) with a floor division for a negative numerator; |2 mu + rho| < 2^63.
  const std::int64_t n = 2 * mu + rho_j, d = 2 * rho_j;
  const std::int64_t q = n / d;
  return (n % d != 0 && n < 0) ? q - 1 : q;
}

double key_group_offset_scale(double s_q, double s_k_max, double scale, int bits, double c) {
  return s_q * s_k_max * scale * static_cast<double>((1 << bits) - 1) / (c * std::ldexp(1.0, kKeyRatioBits));
}

int key_group_offset(std::int64_t gap, double kappa, int bits) {
  const double last = (1 << bits) - 1;
  const double k = std::nearbyint(static_cast<double>(gap) * kappa);
  return static_cast<int>(std::clamp(k, 0.0, last));
}

}  // namespace qattn
