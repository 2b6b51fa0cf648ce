// EXAQ against the exact softmax: the declared contract (docs/methods/exaq.md §5) for every grid, clip, scope and
// sum on generated rows, and its tightness; permutation equivariance of the row-scope model.
#include <rapidcheck.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <algorithm>
#include <map>

#include "qattn/reference/exaq.h"
#include "qattn/reference/softmax.h"
#include "support/rows.h"

using namespace qattn;
using namespace qattn::ref;
using namespace qattn::test;

TEST_CASE("EXAQ meets its declared contract", "[exaq][contract][property]") {
  std::map<std::string, double> worst;
  REQUIRE(rc::check("per-element bound vs the exact softmax", [&worst] {
    ExaqParams p;
    p.bits = *rc::gen::inRange(2, 5);
    p.clip = *rc::gen::element(ExaqClip::gauss, ExaqClip::optimal, ExaqClip::fixed, ExaqClip::none);
    p.fixed_c = -*rc::gen::inRange(5, 200) / 10.0;
    p.scope = ExaqScope::row;  // the bound is per scope; row scope makes each row its own
    p.grid = *rc::gen::element(ExaqGrid::upstream, ExaqGrid::paper);
    p.xhat_bf16 = *rc::gen::arbitrary<bool>();
    p.sum = *rc::gen::element(ExaqSum::fp, ExaqSum::q24_direct, ExaqSum::q24_lutsum);
    const RowFamily f = *rc::gen::elementOf(std::vector<RowFamily>(std::begin(kRowFamilies), std::end(kRowFamilies)));
    const std::vector<double> row = make_row(f, *rc::gen::inRange(1, 2049), *rc::gen::arbitrary<std::uint64_t>(), 40.0);
    const Eigen::Map<const RowMatrixXd> s(row.data(), 1, static_cast<Eigen::Index>(row.size()));
    std::vector<double> clips;
    const RowMatrixXd got = exaq_softmax(s, p, &clips);
    const auto exact = softmax_exact(row);
    double m = -INFINITY;
    for (double v : row) m = std::max(m, v);
    RowMatrixXd x = s;
    for (Eigen::Index j = 0; j < x.cols(); ++j) x(0, j) = std::isinf(row[j]) ? row[j] : row[j] - m;
    const ExaqStats st = exaq_stats(x, 0, 1);
    if (st.count == 0) return;
    const ExaqBound b = ExaqBound::make(p, clips.at(0), st.min, st.count);
    Eigen::Index below = 0;
    for (Eigen::Index j = 0; j < x.cols(); ++j) below += std::isfinite(x(0, j)) && x(0, j) < b.lo;
    double w = 0;
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      if (!std::isfinite(x(0, j))) {
        RC_ASSERT(got(0, j) == 0.0);
        continue;
      }
      const double pe = static_cast<double>(exact[j]);
      const double bound = b.element(pe, x(0, j), below);
      const double err = std::fabs(got(0, j) - pe);
      if (!(err <= bound))
        RC_FAIL("bits " + std::to_string(p.bits) + (p.grid == ExaqGrid::upstream ? " upstream" : " paper") + " grid, sum " +
                std::to_string(static_cast<int>(p.sum)) + ", bf16 " + std::to_string(p.xhat_bf16) + ", C " +
                std::to_string(clips.at(0)) + ", min " + std::to_string(st.min) + ", L " + std::to_string(st.count) +
                ": x " + std::to_string(x(0, j)) + " lo " + std::to_string(b.lo) + " p^ " + std::to_string(got(0, j)) +
                " p " + std::to_string(pe) + " err " + std::to_string(err) + " bound " + std::to_string(bound));
      w = std::max(w, err / bound);
    }
    const std::string key = std::string(p.grid == ExaqGrid::upstream ? "upstream" : "paper") + " grid, " +
                            std::to_string(p.bits) + " bits";
    worst[key] = std::max(worst[key], w);
  }));
  std::printf("\nEXAQ contract tightness (worst |p^ - p| / bound):\n");
  for (const auto& [k, w] : worst) std::printf("  %-22s %.3f\n", k.c_str(), w);
}

TEST_CASE("the EXAQ contract table matches ExaqBound", "[exaq][contract]") {
  // docs/methods/exaq.md §5, "Declared bound": upstream grid, 2 bits, C = -4, min x = -10, L = 128, FP sum.
  ExaqParams p;
  p.bits = 2;
  const ExaqBound b = ExaqBound::make(p, -4.0, -10.0, 128);
  CHECK(b.lo == -4.0);
  CHECK(b.d == Approx(2.0 / 3).epsilon(1e-12));
  CHECK(b.tau == Approx(130 * 4 * std::ldexp(1.0, -53)).epsilon(1e-12));
  CHECK(b.element(0.1, -1.0, 3) == Approx(0.1 * std::expm1(4.0 / 3) + b.tau).epsilon(1e-12));  // 0.2794
  CHECK(b.element(0.01, -7.0, 3) == Approx(std::exp(-4.0 + 4.0 / 3) + b.tau).epsilon(1e-12));  // 0.0695
  // Paper grid, 4 bits, C = -6: lo = C, D = 6/16, d = 3/16; bf16 x^ adds |lo| 2^-8.
  p.bits = 4;
  p.grid = ExaqGrid::paper;
  p.xhat_bf16 = true;
  CHECK(ExaqBound::make(p, -6.0, -20.0, 128).d == Approx(3.0 / 16 + 6.0 / 256).epsilon(1e-9));
}

TEST_CASE("EXAQ is monotone, and permutation equivariant exactly with fixed-point sums", "[exaq][property]") {
  REQUIRE(rc::check("monotone and permutation", [] {
    ExaqParams p;
    p.bits = *rc::gen::inRange(2, 5);
    p.grid = *rc::gen::element(ExaqGrid::upstream, ExaqGrid::paper);
    p.scope = *rc::gen::element(ExaqScope::tensor, ExaqScope::row);
    p.sum = *rc::gen::element(ExaqSum::q24_direct, ExaqSum::q24_lutsum);
    const RowFamily f = *rc::gen::elementOf(std::vector<RowFamily>(std::begin(kRowFamilies), std::end(kRowFamilies)));
    const std::vector<double> row = make_row(f, *rc::gen::inRange(1, 600), *rc::gen::arbitrary<std::uint64_t>(), 40.0);
    const Eigen::Map<const RowMatrixXd> s(row.data(), 1, static_cast<Eigen::Index>(row.size()));
    const RowMatrixXd got = exaq_softmax(s, p);
    std::vector<Eigen::Index> order;
    for (Eigen::Index j = 0; j < s.cols(); ++j)
      if (std::isfinite(row[j])) order.push_back(j);
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return row[a] < row[b]; });
    for (std::size_t i = 1; i < order.size(); ++i) RC_ASSERT(got(0, order[i]) >= got(0, order[i - 1]));
    const RowMatrixXd rev = s.rowwise().reverse();
    RC_ASSERT(exaq_softmax(rev, p).rowwise().reverse() == got);
  }));
}
