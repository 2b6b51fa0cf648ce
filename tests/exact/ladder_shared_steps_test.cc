// The steps the fused kernels share with the reference model by construction (docs/kernels.md, "What the ladder
// proves"): on those the ladder's equality is no evidence, so each is certified here or in the named test against
// exact arithmetic:
//   - the per-tensor INT8 quantiser (qattn/quantize.h): here, against the exact real-number codes;
//   - c_int (cint_from_alpha): tests/exact/certify_index_test.cc, against the exact quotient;
//   - exp_f32_poly and the 16-lane sum (qattn/exp_f32.h): tests/unit/exp_f32_test.cc, against e^x;
//   - the key-group steps (qattn/key_groups.h): here, the scale ratios against the exact quotient and the anchor
//     and the offset against their defining inequalities in exact integers.
#include <boost/multiprecision/cpp_int.hpp>
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "qattn/key_groups.h"
#include "qattn/quantize.h"

namespace {

using boost::multiprecision::cpp_int;
using boost::multiprecision::cpp_rational;

// The double as an exact rational.
cpp_rational exact(double v) {
  int e = 0;
  const double m = std::frexp(v, &e);
  const auto mant = static_cast<std::int64_t>(std::ldexp(m, 53));  // v = mant 2^(e - 53), exact
  cpp_rational r(mant);
  if (e - 53 >= 0) r *= cpp_rational(cpp_int(1) << (e - 53));
  else r /= cpp_rational(cpp_int(1) << (53 - e));
  return r;
}

// round-half-even of an exact rational.
cpp_int round_half_even(const cpp_rational& v) {
  const cpp_int num = numerator(v), den = denominator(v);  // den > 0
  cpp_int q = num / den;  // toward zero
  if (num < 0 && q * den != num) q -= 1;  // floor
  const cpp_rational frac = v - cpp_rational(q);
  if (frac > cpp_rational(1, 2) || (frac == cpp_rational(1, 2) && (q & 1) != 0)) q += 1;
  return q;
}

// The code the definition asks for in real numbers: clamp(rne(127 x / max|x|), -127, 127).
int exact_code(double x, double amax) {
  if (amax == 0) return 0;
  cpp_int q = round_half_even(exact(x) * 127 / exact(amax));
  if (q > 127) q = 127;
  if (q < -127) q = -127;
  return static_cast<int>(q);
}

}  // namespace

TEST_CASE("ladder: the shared INT8 quantiser against the exact real-number codes", "[ladder][certify]") {
  std::mt19937_64 g(2026);
  std::normal_distribution<double> n(0, 1);
  std::uniform_int_distribution<int> k(-127, 126);
  long cases = 0, off_by_one = 0, worse = 0, random_off = 0;
  for (int t = 0; t < 400; ++t) {
    std::vector<double> x(256);
    const double spread = std::ldexp(1.0, static_cast<int>(g() % 40) - 20);
    for (double& v : x) v = spread * std::clamp(n(g), -3.9, 3.9);
    x[0] = spread * 4;  // the maximum, kept by the replacements below
    const double amax = x[0];
    // Half the tensors also hold values on the rounding boundaries x = (k + 1/2) amax / 127 (in double): there the
    // double quotient x / s can land on either side of the tie.
    const bool adversarial = t % 2 == 1;
    if (adversarial)
      for (std::size_t i = 1; i < x.size(); i += 2) x[i] = (k(g) + 0.5) * amax / 127;
    std::vector<std::int8_t> q(x.size());
    qattn::quantize_int8_symmetric(std::span<const double>(x), std::span<std::int8_t>(q));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const int want = exact_code(x[i], amax), diff = std::abs(q[i] - want);
      ++cases;
      off_by_one += diff == 1;
      worse += diff > 1;
      random_off += diff != 0 && (!adversarial || i % 2 == 0);
    }
  }
  std::printf("INT8 quantiser certification: %ld codes; off by one from the exact real-number code: %ld (all on "
              "constructed ties), %ld among the random values; off by more: %ld\n",
              cases, off_by_one, random_off, worse);
  CHECK(worse == 0);       // never more than one code from the definition in real numbers
  CHECK(random_off == 0);  // and only where x sits within a rounding of a tie
  CHECK(off_by_one > 0);   // the constructed ties do reach the double rounding: the check can see a difference
  // All zeros: scale 1, codes 0; the largest |x| maps to +-127 exactly.
  std::vector<double> z(5, 0.0), w = {-254.0, 125.0, 254.0};  // s = 2: 125 / 2 = 62.5 exactly
  std::vector<std::int8_t> qz(5), qw(3);
  CHECK(qattn::quantize_int8_symmetric(std::span<const double>(z), std::span<std::int8_t>(qz)) == 1.0);
  CHECK(qz == std::vector<std::int8_t>(5, 0));
  qattn::quantize_int8_symmetric(std::span<const double>(w), std::span<std::int8_t>(qw));
  CHECK(qw == std::vector<std::int8_t>{-127, 62, 127});  // the tie 62.5 goes to even (away from zero: 63)
  // Int8Rounding::floor (IntAttention Eq. 3 as printed): s = 2, x / s = -127, -0.5, 62.5, 126.95, 127.
  const std::vector<double> f = {-254.0, -1.0, 125.0, 253.9, 254.0};
  std::vector<std::int8_t> q_floor(5), q_rne(5);
  qattn::quantize_int8_symmetric(std::span<const double>(f), std::span<std::int8_t>(q_floor), qattn::Int8Rounding::floor);
  qattn::quantize_int8_symmetric(std::span<const double>(f), std::span<std::int8_t>(q_rne));
  CHECK(q_floor == std::vector<std::int8_t>{-127, -1, 62, 126, 127});
  CHECK(q_rne == std::vector<std::int8_t>{-127, 0, 62, 127, 127});
  // The rounding by adding and subtracting 1.5 2^52 equals std::nearbyint on every code, ties and their neighbours
  // (one ulp either side) included, for float and double inputs.
  std::mt19937_64 h(77);
  std::uniform_int_distribution<int> code(-127, 126);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> x(257);
    const double amax = std::ldexp(1.0, trial % 40 - 20) * 3.1;
    const double s = amax / 127;
    x[0] = amax;
    for (std::size_t i = 1; i < x.size(); ++i) {
      const double tie = (code(h) + 0.5) * s;
      x[i] = i % 3 == 0 ? tie : std::nextafter(tie, i % 3 == 1 ? 0.0 : 2 * tie);
    }
    std::vector<float> xf(x.begin(), x.end());
    for (const bool as_float : {false, true}) {
      std::vector<std::int8_t> q(x.size()), want(x.size());
      const double scale = as_float ? qattn::quantize_int8_symmetric(std::span<const float>(xf), std::span<std::int8_t>(q))
                                    : qattn::quantize_int8_symmetric(std::span<const double>(x), std::span<std::int8_t>(q));
      for (std::size_t i = 0; i < x.size(); ++i)
        want[i] = static_cast<std::int8_t>(std::clamp(
            std::nearbyint((as_float ? static_cast<double>(xf[i]) : x[i]) / scale), -127.0, 127.0));
      INFO("trial " << trial << " float " << as_float);
      CHECK(q == want);
    }
  }
}

TEST_CASE("ladder: the shared key-group steps against exact arithmetic", "[ladder][certify][groups]") {
  std::mt19937_64 g(1605);
  // rho_j = RNE(2^30 s_j / s_max) through one double quotient: within 1/2 + 2^-22 of the exact 2^30 s_j / s_max.
  std::uniform_real_distribution<double> log_scale(-20, 5);
  std::size_t ratio_cases = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<double> s(1 + trial % 7);
    for (double& x : s) x = std::exp(log_scale(g) * (trial % 3 == 0 ? 0.01 : 1.0));
    const double s_max = *std::max_element(s.begin(), s.end());
    if (std::any_of(s.begin(), s.end(), [&](double x) { return x / s_max < 0x1p-31; })) continue;
    const std::vector<std::int64_t> rho = qattn::key_group_ratios(s);
    for (std::size_t j = 0; j < s.size(); ++j, ++ratio_cases) {
      const cpp_rational truth = exact(s[j]) * cpp_rational(cpp_int(1) << 30) / exact(s_max);
      const cpp_rational err = cpp_rational(rho[j]) - truth;
      CHECK(abs(err) <= cpp_rational(1, 2) + cpp_rational(1, 1 << 22));
    }
  }
  CHECK(ratio_cases > 5000);
  // M_j = key_group_anchor(mu, rho): the unique integer with 2 M rho <= 2 mu + rho < 2 (M + 1) rho (mu / rho rounded
  // half up), checked in 128-bit integers over the whole range the row can reach (|mu| <= 2^61, rho in [1, 2^30]).
  std::uniform_int_distribution<std::int64_t> mu_dist(-(std::int64_t{1} << 61), std::int64_t{1} << 61);
  std::uniform_int_distribution<std::int64_t> rho_dist(1, std::int64_t{1} << 30);
  for (int trial = 0; trial < 200000; ++trial) {
    const std::int64_t mu = trial % 4 == 0 ? mu_dist(g) % 100000 : mu_dist(g);
    const std::int64_t rho = trial % 5 == 0 ? 1 + rho_dist(g) % 7 : rho_dist(g);
    const __int128 m = qattn::key_group_anchor(mu, rho);
    const __int128 lhs = 2 * m * rho, mid = 2 * static_cast<__int128>(mu) + rho;
    INFO("mu " << mu << " rho " << rho);
    REQUIRE(lhs <= mid);
    REQUIRE(mid < lhs + 2 * static_cast<__int128>(rho));
  }
  // k_j = min(RNE(gap kappa), 2^b - 1): within 1/2 of the double product, and clamped.
  for (int trial = 0; trial < 10000; ++trial) {
    const std::int64_t gap = std::uniform_int_distribution<std::int64_t>(0, std::int64_t{1} << 50)(g);
    const double kappa = std::exp(log_scale(g) - 20);
    const int bits = 1 + trial % 8, k = qattn::key_group_offset(gap, kappa, bits);
    const double x = static_cast<double>(gap) * kappa, last = (1 << bits) - 1;
    if (x >= last + 0.5) CHECK(k == last);
    else CHECK(std::fabs(k - x) <= 0.5);
  }
}
