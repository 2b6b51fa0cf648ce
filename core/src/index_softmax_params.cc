#include "qattn/index_softmax_params.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace qattn {

void validate(const IndexSoftmaxParams& params) {
  if (params.bits < 1 || params.bits > 8)
    throw std::invalid_argument("IndexSoftmax: b must be in 1..8, got " + std::to_string(params.bits));
  if (!(params.c > 0) || !std::isfinite(params.c))
    throw std::invalid_argument("IndexSoftmax: c must be finite and > 0, got " + std::to_string(params.c));
  if (params.normalization == Normalization::q8_reciprocal && params.p_format != PFormat::u8)
    throw std::invalid_argument("norm=q8-reciprocal is defined for p=u8 only (the upstream NEON kernel)");
}

void validate(const IndexSoftmaxParams& params, std::int64_t c_int) {
  validate(params);
  if (c_int < 1 || c_int > kCintMax)
    throw std::invalid_argument("IndexSoftmax: c_int must be in [1, 2^30], got " + std::to_string(c_int));
}

std::string_view to_string(CintRounding r) { return name_of(kCintRoundings, r); }
std::string_view to_string(LutRounding r) { return name_of(kLutRoundings, r); }
std::string_view to_string(IndexRule r) { return name_of(kIndexRules, r); }
std::string_view to_string(Normalization r) { return name_of(kNormalizations, r); }

std::int64_t cint_from_alpha(double c, double alpha, CintRounding rounding) {
  if (!(c > 0) || !std::isfinite(c)) throw std::invalid_argument("c_int: c must be finite and > 0");
  if (!(alpha > 0) || !std::isfinite(alpha)) throw std::invalid_argument("c_int: alpha must be finite and > 0");
  const double x = c / alpha;  // may be +inf for tiny alpha: saturates below
  double r = 0;
  switch (rounding) {
    case CintRounding::round: r = std::round(x); break;
    case CintRounding::trunc: r = std::trunc(x); break;
    case CintRounding::floor: r = std::floor(x); break;
  }
  if (!(r < static_cast<double>(kCintMax))) return kCintMax;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(r));
}

}  // namespace qattn
