#include "qattn/reference/index_softmax_contract.h"

#include <algorithm>
#include <cmath>

namespace qattn::ref {

IndexSoftmaxBound IndexSoftmaxBound::make(const IndexSoftmaxParams& p, double alpha, std::int64_t c_int) {
  const double t1 = (1 << p.bits) - 1;
  const double delta = p.c / t1;
  const double rho = std::fabs(p.c - alpha * static_cast<double>(c_int));
  const double q26 = static_cast<double>(c_int) / static_cast<double>(std::int64_t{1} << 27);
  double k = 1;
  switch (p.index_rule) {
    case IndexRule::floor: k = 1; break;
    case IndexRule::round: k = 0.5; break;
    case IndexRule::floor_f32: k = 1 + 3 * 255 * std::ldexp(1.0, -24); break;
    case IndexRule::q26_round: k = 0.5 + q26; break;
    case IndexRule::q26_floor: k = 1 + q26; break;
  }
  IndexSoftmaxBound b;
  b.theta = k * delta + rho;
  b.r = p.lut_rounding == LutRounding::floor ? 1.0 : 0.5;
  const auto lut = index_lut(p.bits, p.c, p.lut_rounding);
  const double saturated_entry = lut[index_of(c_int, c_int, p.bits, p.index_rule)];
  b.eta = std::max({b.r, 255.0 * std::exp(-(p.c - b.theta)), saturated_entry});
  const double s = p.p_scale();
  switch (p.normalization) {
    case Normalization::floor: b.nu = 1.0 / s; break;
    case Normalization::f32_rne: b.nu = (0.5 + s * std::ldexp(1.0, -23)) / s; break;
    case Normalization::q8_reciprocal: b.nu = (0.5 + 255.0 / 512.0) / s; break;
  }
  return b;
}

IndexSoftmaxBound IndexSoftmaxBound::make_grouped(const IndexSoftmaxParams& p, const KeyGroupClip& clip,
                                                  const std::vector<double>& alpha, double a_max) {
  const double alpha_max = *std::max_element(alpha.begin(), alpha.end());
  const double delta = p.c / ((1 << p.bits) - 1);
  IndexSoftmaxBound worst;
  for (std::size_t j = 0; j < alpha.size(); ++j) {
    IndexSoftmaxBound b = make(p, alpha[j], clip.c_int[j]);
    const double r = alpha[j] / alpha_max, rho = static_cast<double>(clip.ratio[j]);
    b.theta += clip.rule == GroupMax::global ? alpha[j] * (0.5 + a_max * (1 + r) / (2 * r * rho))
                                             : delta / 2 + a_max * alpha_max * std::ldexp(1.0, -kKeyRatioBits);
    const auto lut = index_lut(p.bits, p.c, p.lut_rounding);
    const double saturated_entry = lut[index_of(clip.c_int[j], clip.c_int[j], p.bits, p.index_rule)];
    b.eta = std::max({b.r, 255.0 * std::exp(-(p.c - b.theta)), saturated_entry});
    if (j == 0 || b.theta > worst.theta) worst.theta = b.theta;
    worst.eta = std::max(worst.eta, b.eta);
    worst.r = b.r;
    worst.nu = b.nu;
  }
  return worst;
}

double IndexSoftmaxBound::row_mass_error(double p_max, Eigen::Index valid) const {
  return 255.0 / p_max * std::expm1(theta) + static_cast<double>(valid) * eta;
}

double IndexSoftmaxBound::row_sum_lower(double p_max, Eigen::Index valid) const {
  return std::max(255.0, 255.0 / p_max - row_mass_error(p_max, valid));
}

double IndexSoftmaxBound::element(double p, double p_max, Eigen::Index valid) const {
  const double u_total = 255.0 / p_max;
  return nu + (p * u_total * std::expm1(theta) + eta + p * row_mass_error(p_max, valid)) / row_sum_lower(p_max, valid);
}

double IndexSoftmaxBound::row_l1(double p_max, Eigen::Index valid) const {
  return static_cast<double>(valid) * nu + 2 * row_mass_error(p_max, valid) / row_sum_lower(p_max, valid);
}

RowSumRange row_sum_range(Normalization rule, int p_scale, std::int64_t row_sum, std::int64_t nnz) {
  const double s = p_scale, n = static_cast<double>(nnz), big_s = static_cast<double>(row_sum);
  switch (rule) {
    case Normalization::floor: return {s - n + 1, s};  // s - nnz < sum <= s, and the sum is an integer
    case Normalization::f32_rne: {
      const double slack = n * (0.5 + s * std::ldexp(1.0, -23));
      return {s - slack, s + slack};
    }
    case Normalization::q8_reciprocal:
      if (row_sum == p_scale) return {s, s};
      return {s - big_s / 512 - 127 * n / 256, s + big_s / 512 + n / 2};
  }
  return {0, 0};
}

}  // namespace qattn::ref
