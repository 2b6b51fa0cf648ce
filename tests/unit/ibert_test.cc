// I-BERT's integer-only softmax (qattn/reference/ibert.h, docs/methods/ibert.md): the paper's Algorithms 1-2 and the
// official variant on golden vectors, the i-exp error against e^x, the refusals, and the float path. The golden
// vectors were derived from the formulas in the doc in exact integer arithmetic, independently of this code.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/ibert.h"
#include "qattn/reference/registry.h"

using namespace qattn;

namespace {

std::vector<std::int64_t> row(const std::vector<std::int64_t>& q, double scale, ref::IbertExp exp, ref::IbertNorm norm) {
  ref::IbertParams p;
  p.exp = exp;
  p.norm = norm;
  std::vector<std::int64_t> out(q.size());
  const std::unique_ptr<bool[]> visible(new bool[q.size()]);
  std::fill(visible.get(), visible.get() + q.size(), true);
  ref::ibert_softmax_row(q, std::span<const bool>(visible.get(), q.size()), scale, p, out);
  return out;
}

}  // namespace

TEST_CASE("ibert: Algorithms 1-2 at S = 0.01, worked by hand", "[ibert]") {
  // q_ln2 = floor(ln2 / 0.01) = 69, q_b = floor(1.353 / 0.01) = 135, q_c = floor(0.344 / (0.3585e-4)) = 9595.
  // q = 0: z = 0, (0 + 135)^2 + 9595 = 27820 (27820 a S^2 = 0.99735 ~ e^0).
  CHECK(ref::ibert_exp(0, 0.01, ref::IbertExp::paper) == 27820);
  // q = -69: z = 1, q_p = 0: 27820 >> 1.
  CHECK(ref::ibert_exp(-69, 0.01, ref::IbertExp::paper) == 13910);
  // q = -100: z = 1, q_p = -31: (104^2 + 9595) >> 1 = 20411 >> 1 (0.36585 ~ e^-1 = 0.36788).
  CHECK(ref::ibert_exp(-100, 0.01, ref::IbertExp::paper) == 10205);
  CHECK(ref::ibert_exp(-1000, 0.01, ref::IbertExp::paper) == 1);
  CHECK(ref::ibert_exp(-5000, 0.01, ref::IbertExp::paper) == 0);  // z = 72 >= 63: shifted out
}

TEST_CASE("ibert: the official variant at S = 0.01", "[ibert]") {
  // x0 = floor(-0.6931 / 0.01) = -70 (not -69: floor of a negative), clamp at 30 x0 = -2100, 2^30 scaling, then the
  // 16-bit grid of step 1/32767.
  CHECK(ref::ibert_exp(0, 0.01, ref::IbertExp::upstream) == 32767);
  CHECK(ref::ibert_exp(-70, 0.01, ref::IbertExp::upstream) == 16383);
  CHECK(ref::ibert_exp(-100, 0.01, ref::IbertExp::upstream) == 12159);
  CHECK(ref::ibert_exp(-1000, 0.01, ref::IbertExp::upstream) == 2);
  CHECK(ref::ibert_exp(-2100, 0.01, ref::IbertExp::upstream) == 0);
  CHECK(ref::ibert_exp(-5000, 0.01, ref::IbertExp::upstream) == 0);  // clamped to -2100 first
}

TEST_CASE("ibert: normalisation to 8 bits, division and factor32", "[ibert]") {
  using E = ref::IbertExp;
  using N = ref::IbertNorm;
  CHECK(row({0, -50, -100, -300}, 0.01, E::paper, N::division) == std::vector<std::int64_t>{126, 76, 46, 6});
  CHECK(row({0, -50, -100, -300}, 0.01, E::upstream, N::factor32) == std::vector<std::int64_t>{126, 76, 46, 6});
  // One entry: the division gives 2^8 (P = 1, a ninth bit); factor32 gives 255 (32767 floor(2^32 / 32767) < 2^32).
  CHECK(row({7}, 0.01, E::paper, N::division) == std::vector<std::int64_t>{256});
  CHECK(row({7}, 0.01, E::upstream, N::factor32) == std::vector<std::int64_t>{255});
  CHECK(row({10, 10}, 0.01, E::paper, N::division) == std::vector<std::int64_t>{128, 128});
}

TEST_CASE("ibert: i-exp error against e^x (doc §4)", "[ibert]") {
  // At S = 0.001 over x in [-20, 0]: |q_exp a S^2 - e^x| <= 2.5e-3 (paper), |q_exp / 32767 - e^x| <= 2.5e-3
  // (official); largest seen 2.13e-3 and 1.94e-3.
  double worst_paper = 0, worst_upstream = 0;
  for (std::int64_t q = 0; q > -20000; q -= 7) {
    const double exact = std::exp(q * 0.001);
    worst_paper = std::max(worst_paper, std::abs(ref::ibert_exp(q, 0.001, ref::IbertExp::paper) * 0.3585e-6 - exact));
    worst_upstream = std::max(worst_upstream, std::abs(ref::ibert_exp(q, 0.001, ref::IbertExp::upstream) / 32767.0 - exact));
  }
  CHECK(worst_paper <= 2.5e-3);
  CHECK(worst_paper > 1e-3);  // the polynomial is not exact: the bound is tight
  CHECK(worst_upstream <= 2.5e-3);
}

TEST_CASE("ibert: float logits, masks and refusals through the registry", "[ibert]") {
  const auto& reg = ref::reference_registry();
  // in-bits 8: S = 1.27 / 127 = 0.01, q = 100, 50, -25, -127 (round half to even), the row above's grid.
  RowMatrixXd x(1, 4);
  x << 1.0, 0.5, -0.25, -1.27;
  const RowMatrixXd p = reg.create("ibert:in-bits=8")->softmax_rows(x);
  CHECK(p(0, 0) == 128.0 / 256);
  CHECK(p(0, 1) == 77.0 / 256);
  CHECK(p(0, 2) == 36.0 / 256);
  CHECK(p(0, 3) == 13.0 / 256);
  RowMatrixXd m(2, 3);
  m << 0, -INFINITY, -1, -INFINITY, -INFINITY, -INFINITY;
  const RowMatrixXd pm = reg.create("ibert")->softmax_rows(m);
  CHECK(pm(0, 1) == 0);
  CHECK(pm(0, 0) > pm(0, 2));
  CHECK(pm.row(1).isZero(0));
  // S >= ln 2 has no q_ln2; a grid too fine for int32: max |x| = 1e-3 at 24 bits.
  CHECK_THROWS_AS(ref::ibert_exp(-1, 0.7, ref::IbertExp::paper), InputError);
  CHECK_THROWS_AS(reg.create("ibert:in-bits=24")->softmax_rows((RowMatrixXd(1, 2) << 1e-3, 0).finished()), InputError);
}

TEST_CASE("ibert: every grid either fits INT32 or is refused, never overflowing on the way") {
  // Grids from S = 0.5 down to 1e-300: the constants q_b, q_c (b_int, c_int) pass 2^31, then 2^63 (where a bare
  // cast would be undefined), and the squares pass 2^63; each call must return a value in the variant's range or
  // throw InputError. The sanitizer build turns any overflow on the way into a failure.
  int refused[2] = {0, 0}, computed[2] = {0, 0};
  for (const auto variant : {ref::IbertExp::paper, ref::IbertExp::upstream}) {
    const int v = variant == ref::IbertExp::paper ? 0 : 1;
    for (double scale = 0.5; scale > 1e-300; scale /= 7.3) {
      for (const std::int64_t q : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{-1000}, std::int64_t{-(1LL << 40)}}) {
        try {
          const std::int64_t e = ref::ibert_exp(q, scale, variant);
          CHECK(e >= 0);
          CHECK(e <= (variant == ref::IbertExp::paper ? std::int64_t{INT32_MAX} : std::int64_t{32767}));
          ++computed[v];
        } catch (const InputError&) {
          ++refused[v];
        }
      }
    }
    CAPTURE(v);
    CHECK(computed[v] > 0);
    CHECK(refused[v] > 0);
  }
  // The largest INT32 value at q = 0, at the first grid where it would not fit: S just below the boundary where
  // q_b^2 + q_c = 2^31 - 1 (paper) is refused, just above computes.
  CHECK_THROWS_AS(ref::ibert_exp(0, 2.0e-5, ref::IbertExp::paper), InputError);
  CHECK_NOTHROW(ref::ibert_exp(0, 4.0e-5, ref::IbertExp::paper));
}
