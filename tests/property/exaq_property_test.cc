// EXAQ against the exact softmax: the declared contract (docs/methods/exaq.md §5) for every grid, clip, scope and
// sum on generated rows, and its tightness; permutation equivariance of the row-scope model.
#include <rapidcheck.h>

#include <catch2/catch.hpp>
#include <cstdio>
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
        RC_FAIL("bits " + std::to_string(p.bits) + " x " + std::to_string(x(0, j)) + " lo " + std::to_string(b.lo) +
                " err " + std::to_string(err) + " bound " + std::to_string(bound));
      w = std::max(w, err / bound);
    }
    const std::string key = std::string(p.grid == ExaqGrid::upstream ? "upstream" : "paper") + " grid, " +
                            std::to_string(p.bits) + " bits";
    worst[key] = std::max(worst[key], w);
  }));
  std::printf("\nEXAQ contract tightness (worst |p^ - p| / bound):\n");
  for (const auto& [k, w] : worst) std::printf("  %-22s %.3f\n", k.c_str(), w);
}
