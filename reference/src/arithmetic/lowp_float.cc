#include "qattn/reference/lowp_float.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace qattn::ref {
namespace {

// x · 2^k rounded once, the value std::ldexp returns, without its libm call (two calls per lowp_round were most of
// the SageAttention2 model's time). Where 2^k is a normal double it is built from its bits and the product is one
// correctly rounded multiplication, hence the same value as ldexp's single rounding of x · 2^k, overflow and
// subnormal results included; other k go to std::ldexp.
double scale_pow2(double x, int k) {
  if (k < -1022 || k > 1023) return std::ldexp(x, k);
  return x * std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

}  // namespace

int LowpFormat::emax() const {
  const int top = (1 << exponent_bits) - 1;  // all-ones exponent field
  return (specials == LowpSpecials::ieee ? top - 1 : top) - bias;
}

double LowpFormat::max_finite() const {
  // IEEE, FNUZ, none: largest significand 2 - 2^-M. FN: the all-ones mantissa of the top binade is NaN, so
  // 2 - 2^(1-M).
  const double significand = specials != LowpSpecials::fn ? 2 - scale_pow2(1.0, -mantissa_bits)
                                                          : 2 - scale_pow2(1.0, 1 - mantissa_bits);
  return scale_pow2(significand, emax());
}

double LowpFormat::min_normal() const { return scale_pow2(1.0, emin()); }
double LowpFormat::min_subnormal() const { return scale_pow2(1.0, emin() - mantissa_bits); }

// Each format is one object, built on the first call (a function-local static, so that another file's static
// initialiser may ask for a format before this file's globals would exist): name, exponent bits, mantissa bits,
// bias, subnormals, specials.
#define QATTN_LOWP_FORMAT(function, ...)    \
  const LowpFormat& function() {            \
    static const LowpFormat f{__VA_ARGS__}; \
    return f;                               \
  }
QATTN_LOWP_FORMAT(fp8_e4m3fn, "e4m3fn", 4, 3, 7, true, LowpSpecials::fn)
QATTN_LOWP_FORMAT(fp8_e5m2, "e5m2", 5, 2, 15, true, LowpSpecials::ieee)
QATTN_LOWP_FORMAT(fp8_e4m3fnuz, "e4m3fnuz", 4, 3, 8, true, LowpSpecials::fnuz)
QATTN_LOWP_FORMAT(fp8_e5m2fnuz, "e5m2fnuz", 5, 2, 16, true, LowpSpecials::fnuz)
QATTN_LOWP_FORMAT(fp4_e2m1, "e2m1", 2, 1, 1, true, LowpSpecials::none)
QATTN_LOWP_FORMAT(fp16_binary16, "binary16", 5, 10, 15, true, LowpSpecials::ieee)
QATTN_LOWP_FORMAT(bf16_bfloat16, "bfloat16", 8, 7, 127, true, LowpSpecials::ieee)
QATTN_LOWP_FORMAT(fp22_accumulator, "fp22", 8, 13, 127, true, LowpSpecials::ieee)
#undef QATTN_LOWP_FORMAT

double lowp_round(double x, const LowpFormat& f, LowpRounding mode, LowpOverflow overflow, std::mt19937_64* rng) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double max = f.max_finite();
  auto overflowed = [&](double sign_source) {
    // a format without NaN or infinity (E2M1) has nothing to overflow to: it saturates
    if (overflow == LowpOverflow::saturate || mode == LowpRounding::rz || f.specials == LowpSpecials::none)
      return std::copysign(max, sign_source);
    return f.has_inf() ? std::copysign(std::numeric_limits<double>::infinity(), sign_source) : nan;
  };
  if (std::isnan(x)) return nan;
  if (std::isinf(x)) {
    if (overflow == LowpOverflow::saturate || f.specials == LowpSpecials::none) return std::copysign(max, x);
    return f.has_inf() ? x : nan;
  }
  if (x == 0) return f.specials == LowpSpecials::fnuz ? 0.0 : x;
  const int e = std::max(std::ilogb(x), f.emin());
  if (!f.subnormals && std::fabs(x) < f.min_normal()) {
    // Flush-to-zero formats: below the smallest normal, round between 0 and min_normal in the same mode.
    const double y = std::fabs(x) / f.min_normal();
    double r = 0;
    switch (mode) {
      case LowpRounding::rne: r = y > 0.5 ? 1 : 0; break;
      case LowpRounding::rz: r = 0; break;
      case LowpRounding::rna: r = y >= 0.5 ? 1 : 0; break;
      case LowpRounding::stochastic: r = std::uniform_real_distribution<double>(0, 1)(*rng) < y ? 1 : 0; break;
    }
    return std::copysign(r * f.min_normal(), x);
  }
  const int quantum_exp = e - f.mantissa_bits;
  const double y = scale_pow2(x, -quantum_exp);  // exact: a power-of-two scaling
  double r = 0;
  switch (mode) {
    case LowpRounding::rne: r = std::nearbyint(y); break;  // default FE_TONEAREST
    case LowpRounding::rz: r = std::trunc(y); break;
    case LowpRounding::rna: r = std::round(y); break;
    case LowpRounding::stochastic: {
      if (!rng) throw std::invalid_argument("lowp_round: stochastic rounding needs a generator");
      const double lo = std::floor(y);
      r = lo + (std::uniform_real_distribution<double>(0, 1)(*rng) < y - lo ? 1 : 0);
      break;
    }
  }
  const double v = scale_pow2(r, quantum_exp);
  if (std::fabs(v) > max) return overflowed(x);
  if (v == 0) return f.specials == LowpSpecials::fnuz ? 0.0 : std::copysign(0.0, x);  // FNUZ: zero is unsigned
  return v;
}

double lowp_decode(std::uint32_t code, const LowpFormat& f) {
  const int m_bits = f.mantissa_bits, e_bits = f.exponent_bits;
  const bool negative = (code >> (m_bits + e_bits)) & 1u;
  const std::uint32_t e_field = (code >> m_bits) & ((1u << e_bits) - 1);
  const std::uint32_t m_field = code & ((1u << m_bits) - 1);
  const std::uint32_t top = (1u << e_bits) - 1;
  double v;
  if (f.specials == LowpSpecials::fnuz && code == 1u << (m_bits + e_bits)) return std::numeric_limits<double>::quiet_NaN();
  if (f.specials == LowpSpecials::ieee && e_field == top) {
    v = m_field ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (f.specials == LowpSpecials::fn && e_field == top && m_field == (1u << m_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e_field == 0) {
    v = f.subnormals ? scale_pow2(static_cast<double>(m_field), f.emin() - m_bits) : 0.0;
  } else {
    v = scale_pow2(static_cast<double>((1u << m_bits) | m_field), static_cast<int>(e_field) - f.bias - m_bits);
  }
  return negative ? -v : v;
}

std::uint32_t lowp_encode(double value, const LowpFormat& f) {
  const int m_bits = f.mantissa_bits, e_bits = f.exponent_bits;
  const std::uint32_t sign = std::signbit(value) ? 1u << (m_bits + e_bits) : 0u;
  const std::uint32_t top = (1u << e_bits) - 1;
  if (std::isnan(value)) {
    if (f.specials == LowpSpecials::fnuz) return 1u << (m_bits + e_bits);  // the one NaN: the negative-zero code
    if (f.specials == LowpSpecials::none) throw std::invalid_argument("lowp_encode: " + f.name + " has no NaN");
    return sign | (top << m_bits) | ((1u << m_bits) - 1);  // the all-ones NaN (IEEE and FN)
  }
  if (std::isinf(value)) {
    if (!f.has_inf()) throw std::invalid_argument("lowp_encode: " + f.name + " has no infinity");
    return sign | (top << m_bits);
  }
  const double a = std::fabs(value);
  if (a == 0) return f.specials == LowpSpecials::fnuz ? 0u : sign;
  if (a > f.max_finite()) throw std::invalid_argument("lowp_encode: value beyond max_finite of " + f.name);
  const int e = std::max(std::ilogb(a), f.emin());
  const double scaled = scale_pow2(a, m_bits - e);
  if (scaled != std::floor(scaled)) throw std::invalid_argument("lowp_encode: value not representable in " + f.name);
  const auto significand = static_cast<std::uint32_t>(scaled);
  if (a < f.min_normal()) {
    if (!f.subnormals) throw std::invalid_argument("lowp_encode: subnormal in a flush-to-zero format");
    return sign | significand;  // exponent field 0
  }
  return sign | (static_cast<std::uint32_t>(e + f.bias) << m_bits) | (significand & ((1u << m_bits) - 1));
}

std::uint8_t fp8_from_float(float x, const LowpFormat& f, Fp8Cast cast) {
  if (f.bits() != 8) throw std::invalid_argument("fp8_from_float: " + f.name + " is not an 8-bit format");
  const bool ptx = cast == Fp8Cast::ptx_satfinite;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double r = std::isnan(x) ? nan : lowp_round(x, f, LowpRounding::rne, ptx ? LowpOverflow::saturate : LowpOverflow::non_saturating);
  if (std::isnan(r)) r = ptx ? nan : std::copysign(nan, static_cast<double>(x));  // PTX writes the positive NaN
  return static_cast<std::uint8_t>(lowp_encode(r, f));
}

}  // namespace qattn::ref
