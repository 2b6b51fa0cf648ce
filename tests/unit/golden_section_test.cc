// golden_section_minimize (qattn/reference/golden_section.h): the constant, convergence, and the interval it keeps.
#include <catch2/catch.hpp>
#include <cmath>

#include "qattn/reference/golden_section.h"

using namespace qattn::ref;

TEST_CASE("golden-section search: the constant and a known minimum", "[golden-section]") {
  CHECK(kInverseGoldenRatio == (std::sqrt(5.0) - 1) / 2);
  CHECK(std::abs(golden_section_minimize([](double x) { return (x - 0.3) * (x - 0.3); }, 0, 1, 60) - 0.3) < 1e-8);
  // A minimum at an end of the interval: the search converges onto the end.
  CHECK(std::abs(golden_section_minimize([](double x) { return x; }, -2, 5, 100) + 2) < 1e-12);
  // Maximising by negation (SAS's error maximum): e^-x x on [0, 3] peaks at x = 1.
  CHECK(std::abs(golden_section_minimize([](double x) { return -x * std::exp(-x); }, 0, 3, 80) - 1) < 1e-7);
  // After n steps the interval is (b - a) phi^-n wide.
  const auto [lo, hi] = golden_section_interval([](double x) { return std::abs(x - 0.7); }, 0, 1, 20);
  CHECK(std::abs((hi - lo) - std::pow(kInverseGoldenRatio, 20)) < 1e-12);
}
