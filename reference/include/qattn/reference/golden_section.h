// Golden-section search: the one minimiser of the reference models (EXAQ's clip solvers, SAS's error maximum).
//
// For f unimodal on [a, b], each step probes m1 = b - (b - a) / phi and m2 = a + (b - a) / phi (1 / phi =
// (sqrt 5 - 1) / 2) and keeps [a, m2] when f(m1) < f(m2), else [m1, b]; after n steps the interval has shrunk by
// phi^-n (n = 60: 3e-13 of the start; n = 100: 1e-21). Returns the final interval; its midpoint is the estimate. To
// maximise, pass -f. Probes are recomputed each step (two calls of f per step), so the result depends only on f, a,
// b and n.
#pragma once

#include <utility>

namespace qattn::ref {

inline constexpr double kInverseGoldenRatio = 0.6180339887498949;  // (sqrt(5) - 1) / 2 rounded to double

template <class F>
std::pair<double, double> golden_section_interval(F&& f, double a, double b, int iterations) {
  for (int it = 0; it < iterations; ++it) {
    const double m1 = b - (b - a) * kInverseGoldenRatio, m2 = a + (b - a) * kInverseGoldenRatio;
    if (f(m1) < f(m2)) b = m2;
    else a = m1;
  }
  return {a, b};
}

template <class F>
double golden_section_minimize(F&& f, double a, double b, int iterations) {
  const auto [lo, hi] = golden_section_interval(f, a, b, iterations);
  return 0.5 * (lo + hi);
}

}  // namespace qattn::ref
