// Every metric against a 50-digit recomputation written here, plus the documented degenerate cases.
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <span>

#include "qattn/metrics.h"
#include "support/test_scale.h"

using namespace qattn;
using Exact = boost::multiprecision::cpp_bin_float_50;

namespace {

struct ExactMetrics {
  double cossim, rel_l1, rmse, bias;
  double one_minus_cossim, error_to_norm;  // 1 - cos, and ||o - r|| / ||r||
};

ExactMetrics exact_metrics(const std::vector<double>& o, const std::vector<double>& r) {
  Exact dot = 0, oo = 0, rr = 0, l1 = 0, r1 = 0, sq = 0, sum = 0;
  for (std::size_t i = 0; i < o.size(); ++i) {
    const Exact a = o[i], b = r[i], e = a - b;
    dot += a * b;
    oo += a * a;
    rr += b * b;
    l1 += abs(e);
    r1 += abs(b);
    sq += e * e;
    sum += e;
  }
  const Exact n = static_cast<double>(o.size());
  return {static_cast<double>(dot / sqrt(oo * rr)), static_cast<double>(l1 / r1), static_cast<double>(sqrt(sq / n)),
          static_cast<double>(sum / n), static_cast<double>(1 - dot / sqrt(oo * rr)), static_cast<double>(sqrt(sq / rr))};
}

bool close(double got, double want, double rel) { return std::fabs(got - want) <= rel * std::fabs(want) + 1e-300; }

}  // namespace

TEST_CASE("metrics agree with 50-digit arithmetic", "[metrics][exact]") {
  std::mt19937_64 gen(5);
  std::normal_distribution<double> n(0.0, 1.0);
  const int trials = qattn::test::scaled(60, 10);
  qattn::test::announce_scale("metrics vs 50-digit arithmetic", trials);
  for (int trial = 0; trial < trials; ++trial) {
    const std::size_t size = 1 + gen() % 5000;
    const double scale = std::ldexp(1.0, static_cast<int>(gen() % 400) - 200);  // 2^-200 .. 2^199
    const double noise = std::ldexp(1.0, -static_cast<int>(gen() % 50));         // close and far outputs
    std::vector<double> r(size), o(size);
    for (std::size_t i = 0; i < size; ++i) {
      r[i] = scale * n(gen);
      o[i] = r[i] + scale * noise * n(gen);
    }
    const ErrorStats s = compare(o, r);
    const ExactMetrics e = exact_metrics(o, r);
    INFO("trial " << trial << " size " << size << " scale " << scale << " noise " << noise);
    CHECK(std::fabs(s.cossim - e.cossim) <= 4e-16);
    // 1 - CosSim from the error's sums: relative 1e-13, plus the rounding of ||o|| / ||r|| - 1 (a few ulps of 1) times
    // 2 | ||o|| / ||r|| - 1 | <= 2 ||o - r|| / ||r||: digits a CosSim of 1 - 1e-20 still has (1 - cossim has none).
    CHECK(std::fabs(s.one_minus_cossim - e.one_minus_cossim) <=
          1e-13 * e.one_minus_cossim + 2e-15 * e.error_to_norm + 1e-300);
    CHECK(close(s.rmse, e.rmse, 1e-14));
    CHECK(close(s.bias, e.bias, 1e-12));  // cancellation: mean of signed errors
    double mx = 0;
    std::vector<double> ae(size);
    for (std::size_t i = 0; i < size; ++i) mx = std::max(mx, ae[i] = std::fabs(o[i] - r[i]));
    CHECK(s.max_abs == mx);
    std::sort(ae.begin(), ae.end());
    const double med = size % 2 ? ae[size / 2] : (ae[size / 2 - 1] + ae[size / 2]) / 2;
    CHECK(close(s.median_abs, med, 1e-15));
    std::int64_t total = s.zero_errors;
    for (const auto& [k, c] : s.log2_histogram) total += c;
    CHECK(total == static_cast<std::int64_t>(size));
  }
}

TEST_CASE("histogram buckets are powers of two", "[metrics]") {
  const ErrorStats s = compare(std::vector<double>{1.0, 1.5, 2.0, 0.0, 1.0}, std::vector<double>{0.0, 0.0, 0.0, 0.0, 1.0 + 0.25});
  CHECK(s.zero_errors == 1);
  CHECK(s.log2_histogram.at(0) == 2);   // 1.0, 1.5 in [1, 2)
  CHECK(s.log2_histogram.at(1) == 1);   // 2.0
  CHECK(s.log2_histogram.at(-2) == 1);  // 0.25
}

TEST_CASE("binary_exponent is std::ilogb, normal and subnormal, both signs", "[metrics]") {
  std::mt19937_64 gen(11);
  for (int i = 0; i < 200000; ++i) {
    // every exponent field, subnormals (field 0) included, with random fraction bits and sign
    const std::uint64_t bits = gen() & ~(std::uint64_t{0x7ff} << 52);
    const std::uint64_t field = gen() % 2047;
    const double x = std::bit_cast<double>(bits | field << 52);
    if (x == 0) continue;
    INFO(x);
    REQUIRE(binary_exponent(x) == std::ilogb(x));
  }
  for (const double x : {std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(),
                         std::numeric_limits<double>::max(), -3 * std::numeric_limits<double>::denorm_min(), 1.0})
    CHECK(binary_exponent(x) == std::ilogb(x));
}

TEST_CASE("the ends of the double range: subnormal and infinite errors, scales whose inverse is no double", "[metrics]") {
  const double tiny = std::numeric_limits<double>::denorm_min();  // 2^-1074
  // Subnormal errors and values: their histogram keys are std::ilogb's, and the norms are scaled by 2^-1030 and
  // 2^-1074, whose inverses overflow (the division path), against the 50-digit recomputation.
  const std::vector<double> o{tiny, 1e-310, 3 * tiny}, r{0.0, 2 * tiny, tiny};
  const ErrorStats s = compare(o, r);
  CHECK(s.log2_histogram.at(std::ilogb(tiny)) == 1);
  CHECK(s.log2_histogram.at(std::ilogb(1e-310 - 2 * tiny)) == 1);
  CHECK(s.log2_histogram.at(std::ilogb(2 * tiny)) == 1);
  const ExactMetrics want = exact_metrics(o, r);
  CHECK(close(s.cossim, want.cossim, 1e-14));
  CHECK(close(s.rmse, want.rmse, 1e-14));
  // An error beyond DBL_MAX is +inf, under std::ilogb's key for it (INT_MAX), next to finite ones.
  const ErrorStats inf = compare(std::vector<double>{std::numeric_limits<double>::max(), 1.5},
                                 std::vector<double>{-std::numeric_limits<double>::max(), 1.0});
  CHECK(inf.log2_histogram.at(std::ilogb(INFINITY)) == 1);
  CHECK(inf.log2_histogram.at(-1) == 1);
  CHECK(inf.log2_histogram.size() == 2);
  CHECK(inf.max_abs == INFINITY);
}

TEST_CASE("degenerate inputs give the documented results", "[metrics]") {
  CHECK_THROWS_AS(compare(std::vector<double>{1.0}, std::vector<double>{1.0, 2.0}), std::invalid_argument);
  const ErrorStats empty = compare(std::vector<double>{}, std::vector<double>{});
  CHECK(empty.count == 0);
  CHECK(std::isnan(empty.cossim));
  CHECK(std::isnan(empty.rmse));
  const ErrorStats nan = compare(std::vector<double>{1.0, NAN, 2.0}, std::vector<double>{1.0, 1.0, INFINITY});
  CHECK(nan.nonfinite == 2);
  CHECK(std::isnan(nan.cossim));
  CHECK(std::isnan(nan.rel_l1));
  const ErrorStats zeros = compare(std::vector<double>{0.0, 0.0}, std::vector<double>{0.0, 0.0});
  CHECK(zeros.cossim == 1.0);
  CHECK(zeros.one_minus_cossim == 0.0);
  CHECK(zeros.rel_l1 == 0.0);
  CHECK(zeros.rmse == 0.0);
  const ErrorStats one_zero = compare(std::vector<double>{0.0, 0.0}, std::vector<double>{1.0, 0.0});
  CHECK(one_zero.cossim == 0.0);
  CHECK(one_zero.one_minus_cossim == 1.0);
  const ErrorStats ref_zero = compare(std::vector<double>{1.0, 0.0}, std::vector<double>{0.0, 0.0});
  CHECK(ref_zero.rel_l1 == INFINITY);
  CHECK(ref_zero.cossim == 0.0);
  // Huge values: no overflow in the norms.
  const ErrorStats huge = compare(std::vector<double>{1e300, -1e300}, std::vector<double>{1e300, -1e300});
  CHECK(huge.cossim == 1.0);
  CHECK(huge.one_minus_cossim == 0.0);
  CHECK(std::isnan(nan.one_minus_cossim));
  CHECK(huge.rmse == 0.0);
}

TEST_CASE("KL over probability rows: D(p || p_ref), zeros, never negative", "[metrics]") {
  RowMatrixXd ref(2, 3), p(2, 3);
  ref << 0.5, 0.5, 0.0, 0.25, 0.25, 0.5;
  p << 0.5, 0.5, 0.0, 0.5, 0.25, 0.25;
  const KlStats k = kl_rows(ref, p);
  const double row1 = 0.5 * std::log(2.0) + 0.25 * std::log(0.5);  // KL(p || ref) of row 1; row 0 is 0
  CHECK(k.max == Approx(row1).epsilon(1e-15));
  CHECK(k.mean == Approx(row1 / 2).epsilon(1e-15));
  // The method's zero where the reference has mass: that mass, finite (a quantised P's zeros)
  p(1, 2) = 0.0;
  CHECK(kl_rows(ref, p).max == Approx(0.5 * std::log(2.0) - 0.25 + 0.5).epsilon(1e-15));
  // Mass where the reference has none: +inf
  p(1, 2) = 0.25;
  ref(1, 2) = 0.0;
  CHECK(kl_rows(ref, p).mean == INFINITY);
  p(1, 2) = -0.1;
  CHECK(std::isnan(kl_rows(ref, p).mean));
  ref(1, 2) = 0.5;
  CHECK(looks_like_probability_rows(ref));
  CHECK_FALSE(looks_like_probability_rows(p));
  CHECK_THROWS_AS(kl_rows(ref, RowMatrixXd::Zero(1, 3)), std::invalid_argument);
}

TEST_CASE("KL terms against 50-digit arithmetic, from nearly equal rows to far off, and rows that do not sum to 1 stay >= 0",
          "[metrics]") {
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (const double spread : {1e-12, 1e-7, 1e-3, 0.05, 0.5, 3.0}) {
    INFO("relative spread " << spread);
    double worst = 0;
    for (int t = 0; t < 2000; ++t) {
      const double r = std::ldexp(u(rng) + 0.5, -static_cast<int>(40 * u(rng)));
      const double p = r * std::exp(spread * (2 * u(rng) - 1));
      const Exact pe(p), re(r), exact = pe * boost::multiprecision::log(pe / re) - pe + re;
      const double got = kl_term(p, r);
      CHECK(got >= 0);
      if (exact > 0) worst = std::max(worst, std::abs(static_cast<double>((Exact(got) - exact) / exact)));
    }
    CHECK(worst < 1e-11);
  }
  // A row scaled by (1 - 1e-6), as a low-precision P that sums to less than 1: the old sum p_ref ln(p_ref / p) was
  // negative here; D(p || r) is not
  RowMatrixXd ref(1, 4), p(1, 4);
  ref << 0.1, 0.2, 0.3, 0.4;
  p = ref * (1 - 1e-6);
  CHECK(kl_rows(ref, p).mean > 0);
  CHECK(kl_rows(ref, ref).mean == 0);
}

TEST_CASE("float32 values give the statistics of their float64 values", "[metrics]") {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> o(257), r(257);
  for (std::size_t i = 0; i < o.size(); ++i) r[i] = n(rng), o[i] = r[i] + 1e-3f * n(rng);
  o[5] = r[5];  // one exact match
  const auto widened = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const auto same = [](const ErrorStats& a, const ErrorStats& b) {
    CHECK(a.count == b.count);
    CHECK(a.nonfinite == b.nonfinite);
    CHECK(a.zero_errors == b.zero_errors);
    CHECK(a.log2_histogram == b.log2_histogram);
    for (const auto& [x, y] : {std::pair{a.cossim, b.cossim}, {a.rel_l1, b.rel_l1}, {a.rmse, b.rmse},
                               {a.max_abs, b.max_abs}, {a.bias, b.bias}, {a.median_abs, b.median_abs}})
      CHECK((x == y || (std::isnan(x) && std::isnan(y))));
  };
  const ErrorStats f = compare(std::span<const float>(o), std::span<const float>(r));
  CHECK(f.zero_errors == 1);
  CHECK(f.cossim < 1.0);
  same(f, compare(widened(o), widened(r)));
  o[9] = NAN;
  same(compare(std::span<const float>(o), std::span<const float>(r)), compare(widened(o), widened(r)));
}
