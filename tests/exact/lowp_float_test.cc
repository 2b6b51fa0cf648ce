// Low-precision formats against exact arithmetic: every FP8 code decoded and compared with a 50-digit value,
// every midpoint and near-midpoint of consecutive values rounded in every mode, overflow in both modes, FP22
// truncation of random doubles against an exact computation.
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "qattn/float_format.h"
#include "qattn/reference/lowp_float.h"

using namespace qattn;
using namespace qattn::ref;
using Exact = boost::multiprecision::cpp_bin_float_50;

namespace {

// Exact value of a code from the IEEE-style layout, written independently of lowp_decode.
Exact exact_value(std::uint32_t code, int e_bits, int m_bits, int bias) {
  const bool neg = code >> (e_bits + m_bits);
  const int e = static_cast<int>((code >> m_bits) & ((1u << e_bits) - 1));
  const int m = static_cast<int>(code & ((1u << m_bits) - 1));
  Exact v = e == 0 ? Exact(m) / pow(Exact(2), m_bits) * pow(Exact(2), 1 - bias)
                   : (1 + Exact(m) / pow(Exact(2), m_bits)) * pow(Exact(2), e - bias);
  return neg ? -v : v;
}

// The positive finite values of a format, ascending.
std::vector<double> positive_values(const LowpFormat& f) {
  std::vector<double> v;
  for (std::uint32_t c = 0; c < (1u << (f.bits() - 1)); ++c) {
    const double x = lowp_decode(c, f);
    if (std::isfinite(x)) v.push_back(x);
  }
  return v;
}

}  // namespace

TEST_CASE("FP8 E4M3FN: all 256 codes", "[lowp][exact]") {
  const LowpFormat& f = fp8_e4m3fn();
  CHECK(f.max_finite() == 448.0);
  CHECK(f.min_subnormal() == std::ldexp(1.0, -9));
  int nans = 0;
  for (std::uint32_t c = 0; c < 256; ++c) {
    const double v = lowp_decode(c, f);
    if ((c & 0x7f) == 0x7f) {  // S.1111.111
      CHECK(std::isnan(v));
      ++nans;
      continue;
    }
    REQUIRE(std::isfinite(v));  // no infinity in E4M3FN
    CHECK(Exact(v) == exact_value(c, 4, 3, 7));
    CHECK(lowp_encode(v, f) == c);
    CHECK(lowp_round(v, f, LowpRounding::rne, LowpOverflow::non_saturating) == v);
  }
  CHECK(nans == 2);
  CHECK_THROWS_AS(lowp_encode(INFINITY, f), std::invalid_argument);
}

TEST_CASE("FP8 E5M2: all 256 codes", "[lowp][exact]") {
  const LowpFormat& f = fp8_e5m2();
  CHECK(f.max_finite() == 57344.0);
  int infs = 0, nans = 0;
  for (std::uint32_t c = 0; c < 256; ++c) {
    const double v = lowp_decode(c, f);
    if (((c >> 2) & 0x1f) == 0x1f) {
      if (c & 3) {
        CHECK(std::isnan(v));
        ++nans;
      } else {
        CHECK(std::isinf(v));
        ++infs;
      }
      continue;
    }
    CHECK(Exact(v) == exact_value(c, 5, 2, 15));
    CHECK(lowp_encode(v, f) == c);
  }
  CHECK(infs == 2);
  CHECK(nans == 6);
}

TEST_CASE("every midpoint and near-midpoint rounds correctly in every mode", "[lowp][exact]") {
  for (const LowpFormat* f : {&fp8_e4m3fn(), &fp8_e5m2(), &fp16_binary16()}) {
    INFO(f->name);
    const std::vector<double> v = positive_values(*f);
    for (std::size_t i = 0; i + 1 < v.size(); ++i) {
      const double a = v[i], b = v[i + 1], mid = a + (b - a) / 2;
      const bool a_even = (lowp_encode(a, *f) & 1u) == 0;
      for (double s : {1.0, -1.0}) {
        auto r = [&](double x, LowpRounding m) { return lowp_round(s * x, *f, m, LowpOverflow::non_saturating); };
        CHECK(r(mid, LowpRounding::rne) == s * (a_even ? a : b));
        CHECK(r(mid, LowpRounding::rna) == s * b);
        CHECK(r(mid, LowpRounding::rz) == s * a);
        CHECK(r(std::nextafter(mid, 0.0), LowpRounding::rne) == s * a);
        CHECK(r(std::nextafter(mid, INFINITY), LowpRounding::rne) == s * b);
        CHECK(r(std::nextafter(b, 0.0), LowpRounding::rz) == s * a);
      }
    }
  }
  // binary16 agrees with the core's round_to_format on midpoints (two independent implementations).
  const std::vector<double> h = positive_values(fp16_binary16());
  for (std::size_t i = 0; i + 1 < h.size(); ++i) {
    const double mid = h[i] + (h[i + 1] - h[i]) / 2;
    CHECK(lowp_round(mid, fp16_binary16(), LowpRounding::rne, LowpOverflow::non_saturating) == round_to_format(mid, kBinary16));
  }
}

TEST_CASE("overflow in both saturation modes", "[lowp]") {
  const LowpFormat& e4 = fp8_e4m3fn();
  const auto sat = LowpOverflow::saturate, non = LowpOverflow::non_saturating;
  CHECK(lowp_round(464.0, e4, LowpRounding::rne, non) == 448.0);  // tie between 448 (even) and the 480 slot
  CHECK(std::isnan(lowp_round(465.0, e4, LowpRounding::rne, non)));  // OCP: no inf, so overflow is NaN
  CHECK(lowp_round(465.0, e4, LowpRounding::rne, sat) == 448.0);
  CHECK(lowp_round(-1e9, e4, LowpRounding::rne, sat) == -448.0);
  CHECK(lowp_round(1e9, e4, LowpRounding::rz, non) == 448.0);  // IEEE: rz overflow gives max finite
  CHECK(lowp_round(INFINITY, e4, LowpRounding::rne, sat) == 448.0);
  CHECK(std::isnan(lowp_round(INFINITY, e4, LowpRounding::rne, non)));
  const LowpFormat& e5 = fp8_e5m2();
  CHECK(lowp_round(61440.0, e5, LowpRounding::rne, non) == INFINITY);  // 57344 + half ulp (4096)
  CHECK(lowp_round(61439.0, e5, LowpRounding::rne, non) == 57344.0);
  CHECK(lowp_round(61440.0, e5, LowpRounding::rne, sat) == 57344.0);
  CHECK(lowp_round(-1e6, e5, LowpRounding::rna, non) == -INFINITY);
  // Underflow: below half the smallest subnormal rounds to (signed) zero under rne.
  CHECK(lowp_round(std::ldexp(1.0, -11), e4, LowpRounding::rne, non) == 0.0);
  CHECK(std::signbit(lowp_round(-std::ldexp(1.0, -11), e4, LowpRounding::rne, non)));
  CHECK(lowp_round(std::ldexp(1.5, -10), e4, LowpRounding::rne, non) == std::ldexp(1.0, -9));
}

TEST_CASE("stochastic rounding is unbiased and replayable", "[lowp]") {
  std::mt19937_64 g(1);
  const double x = 1.0 + 0.3 * 0.125;  // 30% of the way from 1 to 1.125 in E4M3FN
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sum += lowp_round(x, fp8_e4m3fn(), LowpRounding::stochastic, LowpOverflow::saturate, &g);
  CHECK(std::fabs(sum / n - x) < 4 * 0.125 * std::sqrt(0.3 * 0.7 / n));  // within 4 standard errors
  std::mt19937_64 g1(7), g2(7);
  for (int i = 0; i < 100; ++i)
    CHECK(lowp_round(x, fp8_e4m3fn(), LowpRounding::stochastic, LowpOverflow::saturate, &g1) ==
          lowp_round(x, fp8_e4m3fn(), LowpRounding::stochastic, LowpOverflow::saturate, &g2));
}

TEST_CASE("FP22 truncation of random doubles against exact arithmetic", "[lowp][exact]") {
  const LowpFormat& f = fp22_accumulator();
  CHECK(f.max_finite() == std::ldexp(2 - std::ldexp(1.0, -13), 127));
  std::mt19937_64 g(5);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-140, 127);
  for (int i = 0; i < 100000; ++i) {
    const double x = (g() & 1 ? -1 : 1) * std::ldexp(mant(g), expo(g));
    // Exact: keep 13 fraction bits of the binade (or of 2^-126 for subnormals), toward zero.
    const int e = std::max(std::ilogb(x), -126);
    const Exact q = pow(Exact(2), e - 13);
    const Exact want = trunc(Exact(x) / q) * q;
    REQUIRE(Exact(lowp_round(x, f, LowpRounding::rz, LowpOverflow::non_saturating)) == want);
  }
}
