// The streamed evaluation's metrics (qattn/eval/panel_metrics.h, docs/streaming.md): panels of 64 rows folded in
// order give compare()'s and kl_rows' figures to a few ulps, counts, maxima and histogram exactly, the exact median
// with keep_errors and the bucketed one within 2^-12.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "qattn/eval/panel_metrics.h"
#include "qattn/metrics.h"

using namespace qattn;

namespace {

// Folds rows x cols values (row-major) panel by panel, as the streamed evaluation does.
eval::MetricFold fold(const std::vector<double>& out, const std::vector<double>& ref, long rows, long cols, bool keep,
                      bool kl) {
  eval::MetricFold f(keep);
  for (long r0 = 0; r0 < rows; r0 += eval::kPanelRows) {
    const long n = std::min(eval::kPanelRows, rows - r0);
    eval::PanelStats s = eval::panel_stats(out.data() + r0 * cols, ref.data() + r0 * cols, static_cast<std::size_t>(n * cols));
    if (kl) eval::add_panel_kl(s, out.data() + r0 * cols, ref.data() + r0 * cols, n, cols);
    f.add(s);
    f.add_errors(out.data() + r0 * cols, ref.data() + r0 * cols, static_cast<std::size_t>(n * cols));
  }
  return f;
}

void check_close(double a, double b, double ulps) {
  INFO(a << " vs " << b);
  CHECK(std::fabs(a - b) <= ulps * 0x1p-52 * std::fabs(b));
}

}  // namespace

TEST_CASE("panel metrics: the fold equals compare() to a few ulps, counts and maxima exactly", "[metrics]") {
  std::mt19937_64 g(201);
  for (const double magnitude : {1.0, 0x1p-1000, 0x1p+900}) {  // the ends of the double range too
    const long rows = 200, cols = 33;                             // a partial last panel
    std::normal_distribution<double> n(0, 1);
    std::vector<double> ref(rows * cols), out(rows * cols);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      ref[i] = n(g) * magnitude * (i < 64 * cols ? 1e-6 : 1.0);  // a first panel far smaller than the rest: rescaled
      out[i] = i % 7 == 0 ? ref[i] : ref[i] + 1e-3 * n(g) * std::fabs(ref[i]);
    }
    INFO("magnitude " << magnitude);
    const ErrorStats want = compare(std::span<const double>(out), std::span<const double>(ref));
    const ErrorStats got = fold(out, ref, rows, cols, true, false).stats();
    CHECK(got.count == want.count);
    CHECK(got.zero_errors == want.zero_errors);
    CHECK(got.max_abs == want.max_abs);
    CHECK(got.log2_histogram == want.log2_histogram);
    CHECK(got.median_abs == want.median_abs);
    check_close(got.cossim, want.cossim, 4);
    check_close(got.rel_l1, want.rel_l1, 4);
    check_close(got.rmse, want.rmse, 4);
    check_close(got.bias, want.bias, 1e6);  // a sum of signed terms that cancel: relative to the sum, not each term
    check_close(got.one_minus_cossim, want.one_minus_cossim, 64);
    const ErrorStats bucketed = fold(out, ref, rows, cols, false, false).stats();
    CHECK(std::fabs(bucketed.median_abs - want.median_abs) <= 0x1p-12 * want.median_abs);
  }
}

TEST_CASE("panel metrics: sums that overflow give compare()'s results (the checked path)", "[metrics]") {
  const long rows = 130, cols = 5;
  std::vector<double> ref(rows * cols), out(rows * cols);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ref[i] = (i % 3 == 0 ? -1.5 : 1.25) * 0x1p+1023;
    out[i] = i % 11 == 0 ? -ref[i] : ref[i];  // |o - r| = 2.5 or 3 times 2^1023 overflows: infinite errors and sums
  }
  const ErrorStats want = compare(std::span<const double>(out), std::span<const double>(ref));
  const ErrorStats got = fold(out, ref, rows, cols, true, false).stats();
  CHECK(std::isinf(want.max_abs));
  CHECK(got.max_abs == want.max_abs);
  CHECK(got.log2_histogram == want.log2_histogram);
  CHECK(got.zero_errors == want.zero_errors);
  for (const auto& [a, b] : {std::pair{got.rel_l1, want.rel_l1}, {got.rmse, want.rmse}, {got.bias, want.bias},
                             {got.cossim, want.cossim}, {got.one_minus_cossim, want.one_minus_cossim}}) {
    INFO(a << " vs " << b);
    CHECK((a == b || (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= 1e-12 * std::fabs(b)));
  }
}

TEST_CASE("panel metrics: degenerate inputs as compare() defines them", "[metrics]") {
  const long rows = 70, cols = 3;
  std::vector<double> zero(rows * cols, 0.0), ones(rows * cols, 1.0);
  CHECK(fold(zero, zero, rows, cols, true, false).stats().cossim == 1.0);
  CHECK(fold(zero, zero, rows, cols, true, false).stats().one_minus_cossim == 0.0);
  CHECK(fold(ones, zero, rows, cols, true, false).stats().one_minus_cossim == 1.0);
  CHECK(fold(ones, zero, rows, cols, true, false).stats().cossim == 0.0);
  CHECK(std::isinf(fold(ones, zero, rows, cols, true, false).stats().rel_l1));
  CHECK(fold(zero, zero, rows, cols, false, false).stats().median_abs == 0.0);
  std::vector<double> bad = ones;
  bad[150] = NAN;  // in the third panel: every distance NaN, the counts kept
  const ErrorStats s = fold(bad, ones, rows, cols, true, false).stats();
  const ErrorStats want = compare(std::span<const double>(bad), std::span<const double>(ones));
  CHECK(s.nonfinite == 1);
  CHECK(s.zero_errors == want.zero_errors);
  CHECK(std::isnan(s.cossim));
  CHECK(std::isnan(s.median_abs));
}

TEST_CASE("panel metrics: KL of probability rows equals kl_rows'", "[metrics]") {
  std::mt19937_64 g(202);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const long rows = 150, cols = 40;
  std::vector<double> p(rows * cols), q(rows * cols);
  for (long r = 0; r < rows; ++r) {
    double sp = 0, sq = 0;
    for (long c = 0; c < cols; ++c) sp += p[r * cols + c] = u(g), sq += q[r * cols + c] = u(g);
    for (long c = 0; c < cols; ++c) p[r * cols + c] /= sp, q[r * cols + c] /= sq;
  }
  q[100 * cols + 5] = 0;  // one row where the reference's P is 0 and the method's is not: +inf
  const KlStats want = kl_rows(Eigen::Map<const RowMatrixXd>(q.data(), rows, cols), Eigen::Map<const RowMatrixXd>(p.data(), rows, cols));
  const KlStats got = fold(p, q, rows, cols, false, true).kl();
  CHECK(std::isinf(want.mean));
  CHECK(std::isinf(got.mean));
  q[100 * cols + 5] = 1e-3;
  p[100 * cols + 6] = 0;  // the method's zero: finite
  const KlStats want2 = kl_rows(Eigen::Map<const RowMatrixXd>(q.data(), rows, cols), Eigen::Map<const RowMatrixXd>(p.data(), rows, cols));
  const KlStats got2 = fold(p, q, rows, cols, false, true).kl();
  check_close(got2.mean, want2.mean, 4);
  CHECK(got2.max == want2.max);
  CHECK(std::isfinite(got2.mean));
}

TEST_CASE("panel metrics: the paired vector sums equal ScaledSum::add's, bit for bit", "[metrics]") {
  // panel_stats adds two compensated sums per SIMD vector (GCC vector extensions); the scalar ScaledSum::add over
  // the same terms in the same order must give the same sum and compensation, bit for bit.
  std::mt19937_64 g(7);
  std::normal_distribution<double> n(0, 1);
  for (const double magnitude : {1.0, 0x1p-1000, 0x1p+900, 3e-7}) {
    const std::size_t size = 64 * 37;
    std::vector<double> ref(size), out(size);
    for (std::size_t i = 0; i < size; ++i) {
      ref[i] = i % 13 == 0 ? 0.0 : n(g) * magnitude;
      out[i] = i % 5 == 0 ? ref[i] : ref[i] * (1 + 0.01 * n(g)) + (i % 17 == 0 ? magnitude * n(g) : 0.0);
    }
    const eval::PanelStats s = eval::panel_stats(out.data(), ref.data(), size);
    REQUIRE(s.nonfinite == 0);
    // 2^-e as panel_stats scales: the panel maxima's exponents, a multiplication (exact for these magnitudes)
    auto scaled = [](double x, int e) { return std::ldexp(x, -e); };
    eval::ScaledSum dot, oo, rr, l1, r1, sq, signed_err;
    for (std::size_t i = 0; i < size; ++i) {
      const double o = scaled(out[i], s.eo), r = scaled(ref[i], s.er), abs_err = std::fabs(out[i] - ref[i]),
                   e = scaled(abs_err, s.ee);
      dot.add(o * r);
      oo.add(o * o);
      rr.add(r * r);
      l1.add(abs_err);
      r1.add(std::fabs(ref[i]));
      sq.add(e * e);
      signed_err.add(out[i] - ref[i]);
    }
    INFO("magnitude " << magnitude);
    for (const auto& [got, want] : {std::pair{s.dot, dot}, {s.oo, oo}, {s.rr, rr}, {s.l1, l1}, {s.r1, r1}, {s.sq, sq},
                                    {s.signed_err, signed_err}}) {
      CHECK(got.sum == want.sum);
      CHECK(got.comp == want.comp);
    }
  }
}
