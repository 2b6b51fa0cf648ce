// EXAQ reference model: grids, clips, statistics, LUT_sum, calibration, masks, and the Eq. 14 solver.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "qattn/error.h"
#include "qattn/reference/exaq.h"
#include "qattn/reference/exaq_clipping.h"
#include "qattn/reference/registry.h"

using namespace qattn;
using namespace qattn::ref;

TEST_CASE("EXAQ Table 1 clips", "[exaq]") {
  CHECK(*exaq_table_clip(ExaqClip::gauss, 2, 1.0) == Approx(-3.51));
  CHECK(*exaq_table_clip(ExaqClip::gauss, 3, 2.0) == Approx(-5.56));
  CHECK(*exaq_table_clip(ExaqClip::gauss, 4, 0.0) == Approx(-2.27));
  CHECK(*exaq_table_clip(ExaqClip::laplace, 4, 1.0) == Approx(-6.97));
  CHECK_FALSE(exaq_table_clip(ExaqClip::laplace, 3, 1.0));
  CHECK_THROWS_AS(reference_registry().create("exaq:bits=3,clip=laplace"), SpecError);
}

TEST_CASE("EXAQ upstream grid: both ends, RNE, values below lo give exp(lo)", "[exaq]") {
  ExaqParams p;
  p.bits = 2;
  const auto levels = exaq_levels(p, -3.0, -6.0);  // lo = max(-6, -3) = -3, a = 3/3 = 1
  CHECK(levels == std::vector<double>{-3, -2, -1, 0});
  CHECK(exaq_code(p, -3.0, -6.0, -5.0) == 0);   // clipped to lo
  CHECK(exaq_code(p, -3.0, -6.0, -1.5) == 2);   // tie 1.5 -> 2 (even)
  CHECK(exaq_code(p, -3.0, -6.0, -2.5) == 0);   // tie 0.5 -> 0 (even)
  CHECK(exaq_code(p, -3.0, -6.0, 0.0) == 3);
  const auto from_min = exaq_levels(p, -3.0, -1.0);  // lo = min x when min > C: levels q / 3 - 1
  for (int q = 0; q < 4; ++q) CHECK(from_min[q] == Approx(q / 3.0 - 1).margin(1e-15));
  CHECK(exaq_levels(p, -3.0, 0.0) == std::vector<double>{0, 0, 0, 0});  // all values 0: no division by 0
}

TEST_CASE("EXAQ paper grid: step -C/2^b, midpoints, the max is not reconstructed exactly", "[exaq]") {
  ExaqParams p;
  p.bits = 2;
  p.grid = ExaqGrid::paper;
  CHECK(exaq_levels(p, -4.0, -9.0) == std::vector<double>{-3.5, -2.5, -1.5, -0.5});
  CHECK(exaq_code(p, -4.0, -9.0, -9.0) == 0);
  CHECK(exaq_code(p, -4.0, -9.0, 0.0) == 3);
  CHECK(exaq_code(p, -4.0, -9.0, -2.0) == 2);
}

TEST_CASE("EXAQ statistics: unbiased std over the scope, masks excluded", "[exaq]") {
  RowMatrixXd x(2, 3);
  x << 0, -1, -2, 0, -std::numeric_limits<double>::infinity(), -4;
  const ExaqStats all = exaq_stats(x, 0, 2);
  CHECK(all.count == 5);
  CHECK(all.min == -4);
  const double mean = -7.0 / 5;
  const double var = (std::pow(mean, 2) * 2 + std::pow(-1 - mean, 2) + std::pow(-2 - mean, 2) + std::pow(-4 - mean, 2)) / 4;
  CHECK(all.sigma == Approx(std::sqrt(var)));
  CHECK(exaq_stats(x, 1, 2).count == 2);
}

TEST_CASE("LUT_sum over packed codes equals the direct sum, every byte and random rows", "[exaq][certify]") {
  std::mt19937_64 g(9);
  for (int bits : {2, 3, 4}) {
    ExaqParams p;
    p.bits = bits;
    const auto lut = exaq_lut_q24(exaq_levels(p, -3.7, -8.0));
    const int per_byte = bits == 2 ? 4 : 2, n = 1 << bits;
    // Every combination of codes that fits one byte.
    const int combos = static_cast<int>(std::pow(n, per_byte));
    for (int c = 0; c < combos; ++c) {
      std::vector<int> codes;
      for (int k = 0, v = c; k < per_byte; ++k, v /= n) codes.push_back(v % n);
      REQUIRE(exaq_sum_packed(codes, lut, bits) == exaq_sum_direct(codes, lut));
    }
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int> codes(g() % 5000);
      for (int& c : codes) c = static_cast<int>(g() % n);
      REQUIRE(exaq_sum_packed(codes, lut, bits) == exaq_sum_direct(codes, lut));
    }
  }
}

TEST_CASE("EXAQ softmax: masks, single entries, q24 == lutsum bit for bit, calibration", "[exaq]") {
  const double inf = std::numeric_limits<double>::infinity();
  RowMatrixXd s(3, 4);
  s << 1, 0.5, -inf, -3, -inf, -inf, -inf, -inf, 2, -inf, -inf, -inf;
  for (const char* spec : {"exaq", "exaq@upstream", "exaq@paper", "exaq:sigma=row", "exaq:clip=none", "exaq:clip=optimal"}) {
    INFO(spec);
    const RowMatrixXd p = reference_registry().create(spec)->softmax_rows(s);
    CHECK(p(0, 2) == 0);
    CHECK(p.row(0).sum() == Approx(1.0).epsilon(1e-6));
    CHECK(p.row(1).isZero());
    CHECK(p(2, 0) == Approx(1.0).epsilon(1e-6));
  }
  std::mt19937_64 g(4);
  std::normal_distribution<double> n(0, 3);
  RowMatrixXd big(16, 300);
  for (Eigen::Index i = 0; i < big.size(); ++i) big.data()[i] = n(g);
  for (int bits : {2, 3, 4}) {
    const std::string b = std::to_string(bits);
    CHECK(reference_registry().create("exaq:sum=q24,bits=" + b)->softmax_rows(big) ==
          reference_registry().create("exaq:sum=lutsum,bits=" + b)->softmax_rows(big));
  }
  ExaqCalibrator cal(2);
  CHECK(cal.use(-3, -10) == std::pair<double, double>{-3, -10});
  CHECK(cal.use(-5, -12) == std::pair<double, double>{-5, -12});
  CHECK(cal.frozen());
  CHECK(cal.use(-9, -1) == std::pair<double, double>{-4, -11});
}

TEST_CASE("Eq. 14 solver: closed-form clipping MSE and its minimum", "[exaq]") {
  CHECK(expected_max_std_normal(1) == 0.0);
  CHECK(expected_max_std_normal(2) == Approx(1 / std::sqrt(M_PI)).epsilon(1e-9));
  CHECK(expected_max_std_normal(3) == Approx(1.5 / std::sqrt(M_PI)).epsilon(1e-9));
  // The clipping term against a direct quadrature of E[(X - C)^2; X < C].
  const double sigma = 1.7, mu = -2.0, c = -4.5;
  double q = 0;
  const int panels = 200000;
  const double a = mu - 15 * sigma, h = (c - a) / panels;
  for (int i = 0; i <= panels; ++i) {
    const double x = a + i * h, w = (i == 0 || i == panels) ? 1 : (i % 2 ? 4 : 2);
    q += w * (x - c) * (x - c) * std::exp(-0.5 * std::pow((x - mu) / sigma, 2)) / (sigma * std::sqrt(2 * M_PI));
  }
  q *= h / 3;
  CHECK(exaq_clip_mse(c, sigma, mu, 2, QuantNoise::step_midpoint) == Approx(q + std::pow(4.5 / 4, 2) / 12).epsilon(1e-8));
  const double best = exaq_solve_clip(sigma, mu, 2, QuantNoise::step_endpoints);
  for (double dc : {-0.05, 0.05})
    CHECK(exaq_clip_mse(best + dc, sigma, mu, 2, QuantNoise::step_endpoints) >
          exaq_clip_mse(best, sigma, mu, 2, QuantNoise::step_endpoints));
}

TEST_CASE("Q24 sums never divide 0 by 0: the LUT is relative to the top level", "[exaq]") {
  // Paper grid with a large clip: the top level is -D/2 = -17.4, where round(e^-17.4 2^24) would be 0.
  RowMatrixXd s(1, 5);
  s << 0.0, -30.0, -80.0, -100.0, -5.0;
  for (const char* sum : {"q24", "lutsum"}) {
    const RowMatrixXd p =
        reference_registry().create(std::string("exaq:grid=paper,clip=fixed,c=-138.9,sum=") + sum)->softmax_rows(s);
    CHECK_FALSE(p.array().isNaN().any());
    CHECK(p.sum() == Approx(1.0).epsilon(1e-6));
    CHECK(p(0, 0) == p(0, 4));  // 0 and -5 fall in the same top bin of width 34.7
  }
  ExaqParams p;
  p.grid = ExaqGrid::paper;
  const auto lut = exaq_lut_q24(exaq_levels(p, -138.9, -138.9));
  CHECK(lut.back() == (std::int64_t{1} << 24));
}

TEST_CASE("Eq. 14 as printed: the closed form against quadrature, and its solution against Table 1", "[exaq]") {
  // The closed form (exaq_clipping.h) against Simpson quadrature of the two integrals as printed.
  for (const double sigma : {0.5, 1.0, 2.5})
    for (const double mu : {0.0, -3.0})
      for (const int bits : {2, 3})
        for (const double clip : {-1.0, -4.0, -7.5}) {
          const double pref = clip * clip / (12 * std::ldexp(1.0, 2 * bits));
          auto pdf = [&](double x) { return std::exp(-0.5 * std::pow((x - mu) / sigma, 2)) / (sigma * std::sqrt(2 * M_PI)); };
          auto simpson = [&](auto f, double a, double b) {
            const int n = 20000;
            const double h = (b - a) / n;
            double s = f(a) + f(b);
            for (int i = 1; i < n; ++i) s += (i % 2 ? 4 : 2) * f(a + i * h);
            return s * h / 3;
          };
          const double quant = pref * simpson([&](double x) { return std::exp(2 * x) * pdf(x); }, clip, 0.0);
          const double clipped =
              simpson([&](double x) { return std::pow(std::exp(clip) - std::exp(x), 2) * pdf(x); }, mu - 14 * sigma, clip);
          INFO("sigma " << sigma << " mu " << mu << " bits " << bits << " C " << clip);
          CHECK(exaq_clip_mse_eq14(clip, sigma, mu, bits) == Approx(quant + clipped).epsilon(1e-9));
        }
  // Wide logits (sigma 30: e^(2 sigma^2) alone overflows double) still give a finite error and a clip below 0.
  for (const double sigma : {30.0, 200.0}) {
    INFO("sigma " << sigma);
    const double e = exaq_clip_mse_eq14(-5.0, sigma, -3 * sigma, 2);
    CHECK(std::isfinite(e));
    CHECK(e >= 0);
    const double c = exaq_solve_clip_eq14(sigma, -3 * sigma, 2);
    CHECK(std::isfinite(c));
    CHECK(c < 0);
  }
  // Solved for zero-mean input over sigma in [0.9, 3.4], its least-squares lines are far from Table 1's
  // (-1.66 sigma - 1.85, -1.75 sigma - 2.06).
  for (const int bits : {2, 3}) {
    std::vector<double> s, c;
    for (int i = 0; i <= 25; ++i) s.push_back(0.9 + 0.1 * i), c.push_back(exaq_solve_clip_eq14(s.back(), 0.0, bits));
    double mx = 0, my = 0;
    for (std::size_t i = 0; i < s.size(); ++i) mx += s[i] / s.size(), my += c[i] / s.size();
    double sxy = 0, sxx = 0;
    for (std::size_t i = 0; i < s.size(); ++i) sxy += (s[i] - mx) * (c[i] - my), sxx += (s[i] - mx) * (s[i] - mx);
    const double slope = sxy / sxx, intercept = my - slope * mx;
    INFO("bits " << bits << ": " << slope << " sigma + " << intercept);
    CHECK(slope == Approx(bits == 2 ? -0.491 : -0.578).margin(0.005));
    CHECK(intercept == Approx(bits == 2 ? -1.075 : -1.298).margin(0.005));
  }
  // The clip rule through the registry.
  CHECK(reference_registry().canonical(parse_method_spec("exaq:clip=eq14")).find("clip=eq14") != std::string::npos);
  const RowMatrixXd x = (RowMatrixXd(1, 4) << 0.0, -1.0, -2.5, -6.0).finished();
  const RowMatrixXd p = reference_registry().create("exaq:clip=eq14")->softmax_rows(x);
  CHECK(p.sum() == Approx(1.0).margin(1e-9));
}

TEST_CASE("EXAQ refuses finite logits whose standard deviation overflows float64, under every preset", "[exaq]") {
  // Row spread 2e300: (x - mean)^2 overflows, so sigma, the clip and every code would be undefined (this crashed
  // before: a NaN code indexed the table).
  RowMatrixXd x(2, 8);
  for (Eigen::Index j = 0; j < 8; ++j) x(0, j) = j % 2 ? 1e300 : -1e300, x(1, j) = static_cast<double>(j);
  for (const std::string spec : {"exaq", "exaq@paper", "exaq:sigma=row", "exaq:clip=optimal", "exaq:clip=eq14"}) {
    INFO(spec);
    CHECK_THROWS_WITH(reference_registry().create(parse_method_spec(spec))->softmax_rows(x), Catch::Contains("overflows float64"));
  }
  // Wide but representable spreads still run: 1e150 gives sigma ~1e150, finite.
  RowMatrixXd w = x;
  w.row(0) *= 1e-150;
  const RowMatrixXd p = reference_registry().create("exaq")->softmax_rows(w);
  CHECK(p.allFinite());
}
