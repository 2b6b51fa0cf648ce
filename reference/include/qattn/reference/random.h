// Seeded normal deviates for the randomized parts of the reference models (TurboQuant's rotation signs and QJL
// sketch) and the synthetic data of the experiments: Box-Muller on std::mt19937_64, whose output sequence the
// C++ standard fixes, so a seed gives the same numbers on every platform (std::normal_distribution does not).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace qattn::ref {

class Normals {
 public:
  explicit Normals(std::uint64_t seed) : g_(seed) {}
  double operator()() {
    if (have_) return have_ = false, spare_;
    const double r = std::sqrt(-2 * std::log(uniform())), a = 2 * M_PI * uniform();
    spare_ = r * std::sin(a);
    have_ = true;
    return r * std::cos(a);
  }
  // Uniform in (0, 1): 53 random bits, offset by half an ulp so that 0 never occurs.
  double uniform() { return (static_cast<double>(g_() >> 11) + 0.5) * 0x1p-53; }
  // +1 or -1 with equal probability.
  double sign() { return (g_() >> 63) ? 1.0 : -1.0; }

 private:
  std::mt19937_64 g_;
  double spare_ = 0;
  bool have_ = false;
};

}  // namespace qattn::ref
