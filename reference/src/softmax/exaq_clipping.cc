#include "qattn/reference/exaq_clipping.h"
#include "qattn/reference/golden_section.h"

#include <cmath>
#include <algorithm>
#include <stdexcept>
#include <vector>

namespace qattn::ref {
namespace {

double phi(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
double cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// e^a Phi(z) without overflow or underflow on the way: in Eq. 14's closed form e^a reaches e^(2 sigma^2) while
// Phi(z) falls below 1e-300 for the same sigma, and the product stays at most 1. Phi in logs: erfc while it is
// normal, the asymptotic series -z^2/2 - ln(-z sqrt(2 pi)) + ln(1 - 1/z^2 + 3/z^4) below z = -30.
double exp_times_cdf(double a, double z) {
  if (z > -30) {
    const double c = cdf(z);
    return c > 0 ? std::exp(a + std::log(c)) : 0.0;
  }
  const double z2 = z * z;
  return std::exp(a - 0.5 * z2 - std::log(-z * std::sqrt(2 * M_PI)) + std::log1p(-1 / z2 + 3 / (z2 * z2)));
}

}  // namespace

double expected_max_std_normal(int n) {
  if (n < 1) throw std::invalid_argument("expected_max_std_normal: n >= 1");
  if (n == 1) return 0.0;
  // E[max] = int x n phi(x) Phi(x)^{n-1} dx, Simpson on [-10, 10] with 20000 panels.
  const int panels = 20000;
  const double a = -10, b = 10, h = (b - a) / panels;
  double s = 0;
  for (int i = 0; i <= panels; ++i) {
    const double x = a + i * h;
    const double w = (i == 0 || i == panels) ? 1 : (i % 2 ? 4 : 2);
    s += w * x * n * phi(x) * std::pow(cdf(x), n - 1);
  }
  return s * h / 3;
}

double exaq_clip_mse(double clip, double sigma, double mu, int bits, QuantNoise noise) {
  const double levels = std::ldexp(1.0, bits);
  double quant = 0;
  switch (noise) {
    case QuantNoise::step_midpoint: quant = std::pow(-clip / levels, 2) / 12; break;
    case QuantNoise::step_endpoints: quant = std::pow(-clip / (levels - 1), 2) / 12; break;
    case QuantNoise::symmetric: quant = clip * clip / (3 * levels * levels); break;
  }
  const double z = (clip - mu) / sigma;
  return quant + sigma * sigma * ((1 + z * z) * cdf(z) + z * phi(z));
}

double exaq_clip_mse_exp(double clip, double sigma, double mu, int bits) {
  const int levels = 1 << bits;
  const double step = -clip / levels;
  auto q = [&](double x) {
    const double k = std::clamp(std::floor((x - clip) / step), 0.0, levels - 1.0);
    return clip + (k + 0.5) * step;
  };
  // Integrate piecewise between quantiser breakpoints so that Simpson sees smooth integrands.
  std::vector<double> cuts = {mu - 12 * sigma};
  for (int k = 0; k <= levels; ++k) {
    const double b = clip + k * step;
    if (b > cuts.back() && b < std::max(0.0, mu + 12 * sigma)) cuts.push_back(b);
  }
  cuts.push_back(std::max(0.0, mu + 12 * sigma));
  double total = 0;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    const double a = cuts[i], b = cuts[i + 1];
    if (!(b > a)) continue;
    const double xm = 0.5 * (a + b), level = q(xm);
    const int panels = 200;
    const double h = (b - a) / panels;
    double s = 0;
    for (int j = 0; j <= panels; ++j) {
      const double x = a + j * h, w = (j == 0 || j == panels) ? 1 : (j % 2 ? 4 : 2);
      s += w * std::pow(std::exp(level) - std::exp(x), 2) * phi((x - mu) / sigma) / sigma;
    }
    total += s * h / 3;
  }
  return total;
}

double exaq_solve_clip_exp(double sigma, double mu, int bits) {
  double best = -0.05, best_v = INFINITY;
  for (double c = -0.05; c >= mu - 12 * sigma; c -= 0.05) {
    const double v = exaq_clip_mse_exp(c, sigma, mu, bits);
    if (v < best_v) best_v = v, best = c;
  }
  return golden_section_minimize([&](double c) { return exaq_clip_mse_exp(c, sigma, mu, bits); }, best - 0.05,
                                 std::min(-1e-9, best + 0.05), 60);
}

double exaq_clip_mse_eq14(double clip, double sigma, double mu, int bits) {
  const double z = (clip - mu) / sigma, s2 = sigma * sigma;
  const double a2 = 2 * mu + 2 * s2, a1 = mu + s2 / 2;  // ln E2, ln E1
  const double quant = clip * clip / (12 * std::ldexp(1.0, 2 * bits)) *
                       std::max(0.0, exp_times_cdf(a2, (-mu - 2 * s2) / sigma) - exp_times_cdf(a2, z - 2 * sigma));
  const double clipped =
      exp_times_cdf(2 * clip, z) - 2 * exp_times_cdf(clip + a1, z - sigma) + exp_times_cdf(a2, z - 2 * sigma);
  return quant + std::max(0.0, clipped);
}

double exaq_solve_clip_eq14(double sigma, double mu, int bits) {
  if (!(sigma > 0)) throw std::invalid_argument("exaq_solve_clip_eq14: sigma > 0");
  const double lo = mu - 12 * sigma, hi = -1e-9;
  double best = hi, best_v = exaq_clip_mse_eq14(hi, sigma, mu, bits);
  const int scan = 2000;
  for (int i = 0; i <= scan; ++i) {
    const double c = lo + (hi - lo) * i / scan;
    const double v = exaq_clip_mse_eq14(c, sigma, mu, bits);
    if (v < best_v) best_v = v, best = c;
  }
  return golden_section_minimize([&](double c) { return exaq_clip_mse_eq14(c, sigma, mu, bits); },
                                 std::max(lo, best - (hi - lo) / scan), std::min(hi, best + (hi - lo) / scan), 100);
}

double exaq_solve_clip(double sigma, double mu, int bits, QuantNoise noise) {
  if (!(sigma > 0)) throw std::invalid_argument("exaq_solve_clip: sigma > 0");
  const double lo = mu - 12 * sigma, hi = -1e-9;
  double best = hi, best_v = exaq_clip_mse(hi, sigma, mu, bits, noise);
  const int scan = 2000;
  for (int i = 0; i <= scan; ++i) {
    const double c = lo + (hi - lo) * i / scan;
    const double v = exaq_clip_mse(c, sigma, mu, bits, noise);
    if (v < best_v) best_v = v, best = c;
  }
  return golden_section_minimize([&](double c) { return exaq_clip_mse(c, sigma, mu, bits, noise); },
                                 std::max(lo, best - (hi - lo) / scan), std::min(hi, best + (hi - lo) / scan), 100);
}

}  // namespace qattn::ref
