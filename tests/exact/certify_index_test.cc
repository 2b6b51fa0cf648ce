// Exact certification of IndexSoftmax's constants and integer arithmetic (docs/methods/index-softmax.md,
// "Certification"). Prints a report; asserts what must hold exactly.
//   1. every LUT entry for b = 1..8 and c = 1.0, 1.1, ..., 12.0, against 50-digit exp;
//   2. c_int in double against the exact value (square root in 50 digits), for every rounding mode;
//   3. the fast normalisations against exact division, exhaustively for every E in [0, 255] and every row sum
//      S in [255, 255 L] (L = 65536, scaled down by QATTN_TEST_SCALE in emulated runs).
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "qattn/reference/index_softmax.h"
#include "qattn/reciprocal_division.h"
#include "support/test_scale.h"

using namespace qattn::ref;
using qattn::FloorDivider16;
using Exact = boost::multiprecision::cpp_bin_float_50;

TEST_CASE("certify: every IndexSoftmax LUT entry against 50-digit exp", "[index][certify]") {
  long entries = 0, double_wrong = 0, decimal_differs = 0;
  double closest = 1;  // smallest distance of 255 exp(.) to a rounding boundary seen
  for (int bits = 1; bits <= 8; ++bits) {
    const int last = (1 << bits) - 1;
    for (int k = 10; k <= 120; ++k) {
      const double c = k / 10.0;
      for (LutRounding mode : {LutRounding::floor, LutRounding::round}) {
        const auto lut = index_lut(bits, c, mode);
        for (int i = 1; i < last; ++i) {  // entries 0 and last are forced
          const Exact v = 255 * exp(-Exact(c) * i / last);                     // the double c a user passes
          const Exact v_dec = 255 * exp(-Exact(k) / 10 * i / last);            // the decimal c as written
          const Exact boundary_shift = mode == LutRounding::floor ? Exact(0) : Exact(0.5);
          const long exact = static_cast<long>(floor(v + boundary_shift));
          const long exact_dec = static_cast<long>(floor(v_dec + boundary_shift));
          const double frac = static_cast<double>(v + boundary_shift - floor(v + boundary_shift));
          closest = std::min({closest, frac, 1 - frac});
          ++entries;
          if (lut[i] != exact) {
            ++double_wrong;
            std::printf("  LUT wrong side: b=%d c=%.1f %s entry %d: double %d, exact %ld\n", bits, c,
                        mode == LutRounding::floor ? "floor" : "round", i, lut[i], exact);
          }
          if (exact != exact_dec) ++decimal_differs;
        }
      }
    }
  }
  std::printf("LUT certification: %ld entries (b 1..8, c 1.0..12.0, floor and round); double exp on the wrong side: %ld;"
              " entries where double c and decimal c disagree: %ld; closest approach of 255 exp to a boundary: %.3g\n",
              entries, double_wrong, decimal_differs, closest);
  CHECK(double_wrong == 0);
}

TEST_CASE("certify: c_int in double against the exact value", "[index][certify]") {
  const double amax[] = {0.5, 1.0, 2.5, 2.77, 3.07, 5.0, 5.75, 6.31, 7.14, 8.51, 12.33, 20.0};
  const int dims[] = {64, 80, 96, 128, 256};
  long cases = 0;
  long disagree[3] = {0, 0, 0};
  double worst_margin = 0;  // largest distance (in units of the double's ulp) of an exact value from its boundary
                            // among the disagreements: they must all be within rounding of a boundary
  auto check = [&](double dbl, const Exact& exact, int mode) {
    Exact r;
    if (mode == 0) r = round(exact);
    else r = trunc(exact);  // trunc == floor for these positive values
    const double d = mode == 0 ? std::round(dbl) : std::trunc(dbl);
    if (d != static_cast<double>(r)) {
      ++disagree[mode];
      const Exact boundary = mode == 0 ? floor(exact) + Exact(0.5) : round(exact);
      const double ulps = static_cast<double>(abs(exact - boundary)) / (std::nextafter(dbl, INFINITY) - dbl);
      worst_margin = std::max(worst_margin, ulps);
    }
  };
  for (int k = 10; k <= 120; ++k) {
    const double c = k / 10.0;
    for (double aq : amax)
      for (double ak : amax)
        for (int d : dims) {
          const double sq = aq / 127, sk = ak / 127;
          const double dbl = c * std::sqrt(static_cast<double>(d)) / (sq * sk);
          const Exact exact = Exact(c) * sqrt(Exact(d)) / (Exact(sq) * Exact(sk));
          check(dbl, exact, 0);
          check(dbl, exact, 1);
          ++cases;
        }
    // Scales chosen to hit an integer clip: alpha = c / n, as a user calibrating c_int would write it.
    for (int n = 1; n <= 5000; ++n) {
      const double alpha = c / n;
      const double dbl = c / alpha;
      const Exact exact = Exact(c) / Exact(alpha);
      check(dbl, exact, 0);
      check(dbl, exact, 1);
      ++cases;
    }
  }
  std::printf("c_int certification: %ld (c, scales) cases; double vs exact disagreements: round %ld, trunc/floor %ld;"
              " every disagreement lies within %.2f ulp of its rounding boundary\n",
              cases, disagree[0], disagree[1], worst_margin);
  CHECK(worst_margin <= 2.0);  // double is wrong only where no double evaluation could be right
}

TEST_CASE("certify: fast normalisations against exact division, exhaustively", "[index][certify]") {
  const long max_l = qattn::test::scaled(65536, 256);
  qattn::test::announce_scale("normalisation certification: rows of L <= " + std::to_string(max_l) + ", S in [255, 255 L]", 1);
  const std::int64_t max_s = 255 * max_l;
  long floor_div_fail = 0, q8_vs_round = 0, q8_vs_floor = 0, f32_vs_rne = 0;
  int q8_max_dev = 0, f32_max_dev = 0;
  std::int64_t q8_zero_from = -1;
  for (std::int64_t s = 255; s <= max_s; ++s) {
    const FloorDivider16 div = FloorDivider16::make(static_cast<std::uint64_t>(s));
    std::int64_t q = 0, r = 0;  // exact 255 E = q S + r, updated incrementally (no division in the loop)
    for (int e = 0; e <= 255; ++e) {
      if (e > 0) {
        r += 255;
        while (r >= s) r -= s, ++q;
      }
      const std::int64_t round_up = q + (2 * r >= s);                          // ties up (q8's target)
      const std::int64_t rne = q + (2 * r > s || (2 * r == s && (q & 1)));      // ties to even (f32's target)
      if (div.divide(static_cast<std::uint32_t>(255 * e)) != q) ++floor_div_fail;
      const std::int32_t q8 = normalize(e, s, 255, Normalization::q8_reciprocal);
      if (q8 != round_up) ++q8_vs_round, q8_max_dev = std::max<int>(q8_max_dev, std::abs(q8 - static_cast<int>(round_up)));
      if (q8 != q) ++q8_vs_floor;
      const std::int32_t f = normalize(e, s, 255, Normalization::f32_rne);
      if (f != rne) ++f32_vs_rne, f32_max_dev = std::max<int>(f32_max_dev, std::abs(f - static_cast<int>(rne)));
    }
    if (q8_zero_from < 0 && normalize(255, s, 255, Normalization::q8_reciprocal) == 0) q8_zero_from = s;
  }
  const double pairs = 256.0 * static_cast<double>(max_s - 254);
  std::printf("normalisation certification over %.3g (E, S) pairs:\n"
              "  FloorDivider16 (multiply-shift) vs exact floor: %ld failures\n"
              "  q8-reciprocal vs exact round-half-up: %ld differ (%.2f%%), max |diff| %d; vs exact floor: %ld differ;"
              " every P is 0 from S = %lld on\n"
              "  f32-rne vs exact round-half-even: %ld differ, max |diff| %d\n",
              pairs, floor_div_fail, q8_vs_round, 100.0 * q8_vs_round / pairs, q8_max_dev, q8_vs_floor,
              static_cast<long long>(q8_zero_from), f32_vs_rne, f32_max_dev);
  CHECK(floor_div_fail == 0);
  CHECK(f32_max_dev <= 1);
  CHECK(q8_zero_from == 130561);  // ns = round(65280 / S) = 0 once S > 130560 = 512 * 255
}
