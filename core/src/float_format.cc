#include "qattn/float_format.h"

#include <cmath>
#include <limits>

namespace qattn {

double round_to_format(double x, const FloatFormat& f) {
  if (!std::isfinite(x) || x == 0.0) return x;
  // Exponent of x's leading bit, clamped below at emin so that subnormals share the quantum 2^(emin - p + 1).
  const int e = std::max(std::ilogb(x), f.emin);
  const int quantum_exp = e - (f.precision - 1);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -quantum_exp)), quantum_exp);
  // Overflow: IEEE rounds to infinity once |x| >= max_finite + half an ulp of max_finite; nearbyint has then
  // produced 2^(emax+1), which exceeds max_finite.
  if (std::fabs(r) > f.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

}  // namespace qattn
