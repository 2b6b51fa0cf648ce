// Scales the size of randomized and exhaustive tests. QATTN_TEST_SCALE (a positive real, default 1) multiplies
// case counts; CI sets it below 1 for runs under qemu, where everything is 20-70x slower. Tests print the scale
// they ran with, so a reduced run is never mistaken for a full one.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

namespace qattn::test {

inline double test_scale() {
  static const double s = [] {
    const char* v = std::getenv("QATTN_TEST_SCALE");
    const double x = v ? std::atof(v) : 1.0;
    return x > 0 ? x : 1.0;
  }();
  return s;
}

inline int scaled(int n, int at_least = 1) {
  return std::max(at_least, static_cast<int>(n * test_scale()));
}

inline void announce_scale(const std::string& what, int n) {
  std::cout << what << ": " << n << " cases (QATTN_TEST_SCALE=" << test_scale() << ")\n";
}

}  // namespace qattn::test
