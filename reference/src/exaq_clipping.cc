#include "qattn/reference/exaq_clipping.h"

#include <cmath>
#include <stdexcept>

namespace qattn::ref {
namespace {

double phi(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
double cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

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
  double a = std::max(lo, best - (hi - lo) / scan), b = std::min(hi, best + (hi - lo) / scan);
  for (int it = 0; it < 100; ++it) {
    const double m1 = b - (b - a) * 0.6180339887498949, m2 = a + (b - a) * 0.6180339887498949;
    if (exaq_clip_mse(m1, sigma, mu, bits, noise) < exaq_clip_mse(m2, sigma, mu, bits, noise)) b = m2;
    else a = m1;
  }
  return 0.5 * (a + b);
}

}  // namespace qattn::ref
