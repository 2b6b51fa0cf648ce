// SAS against the exact softmax: the declared contract (docs/methods/sas.md) on generated rows, its table, and
// its tightness; permutation equivariance and shift invariance of the model.
#include <rapidcheck.h>

#include <catch2/catch.hpp>
#include <cstdio>

#include "qattn/reference/sas.h"
#include "qattn/reference/softmax.h"
#include "support/rows.h"

using namespace qattn;
using namespace qattn::ref;
using namespace qattn::test;

TEST_CASE("the SAS contract table matches SasBound", "[sas][contract]") {
  SasParams p;
  const SasBound b = SasBound::make(p);
  const double poly_err = poly_max_relative_error(kSasPaperPoly);
  CHECK(poly_err == Approx(1.0314e-3).epsilon(1e-3));  // docs/methods/sas.md: 1.0314e-3 for the Eq. 15 cubic
  CHECK(b.eps == Approx(poly_err).epsilon(1e-6));
  CHECK(b.kappa(128) == Approx((1 + b.eps) * (1 + 127 * std::exp(-6.0)) / (1 - b.eps) - 1).epsilon(1e-6));
  CHECK(b.row_l1(128) == Approx(b.kappa(128) + 127 * std::exp(-6.0)).epsilon(1e-12));
  p.half = true;
  CHECK(SasBound::make(p).eps > 0.02);  // binary16 Horner dominates: docs table
  CHECK(SasBound::make(p).eps < 0.03);
}

TEST_CASE("SAS meets its declared contract", "[sas][contract][property]") {
  double worst_kept[2] = {0, 0}, worst_l1[2] = {0, 0};
  REQUIRE(rc::check("per-element and per-row bounds", [&] {
    SasParams p;
    p.n_r = -*rc::gen::inRange(10, 121) / 10.0;
    p.half = *rc::gen::arbitrary<bool>();
    if (*rc::gen::arbitrary<bool>()) p.poly = sas_lsq_poly();
    const RowFamily f = *rc::gen::elementOf(std::vector<RowFamily>(std::begin(kRowFamilies), std::end(kRowFamilies)));
    const std::vector<double> row = make_row(f, *rc::gen::inRange(1, 4097), *rc::gen::arbitrary<std::uint64_t>(), 30.0);
    const Eigen::Map<const RowMatrixXd> x(row.data(), 1, static_cast<Eigen::Index>(row.size()));
    const RowMatrixXd got = sas_softmax_rows(x, p);
    const auto exact = softmax_exact(row);
    Eigen::Index valid = 0;
    double p_max = 0;
    for (std::size_t j = 0; j < row.size(); ++j) {
      valid += std::isfinite(row[j]);
      p_max = std::max(p_max, static_cast<double>(exact[j]));
    }
    if (valid == 0) return;
    const SasBound b = SasBound::make(p);
    double l1 = 0;
    for (std::size_t j = 0; j < row.size(); ++j) {
      const double pe = static_cast<double>(exact[j]);
      const double err = std::fabs(got(0, static_cast<Eigen::Index>(j)) - pe);
      l1 += err;
      RC_ASSERT(err <= b.element(pe, p_max, valid) + 1e-300);
      if (pe >= std::exp(p.n_r) * p_max * (1 + b.eps) && pe > 0)
        worst_kept[p.half] = std::max(worst_kept[p.half], err / b.element(pe, p_max, valid));
    }
    RC_ASSERT(l1 <= b.row_l1(valid));
    worst_l1[p.half] = std::max(worst_l1[p.half], l1 / b.row_l1(valid));
  }));
  std::printf("\nSAS contract tightness (worst observed / bound): double path: kept entries %.3f, row L1 %.3f;"
              " binary16 path: kept entries %.3f, row L1 %.3f\n", worst_kept[0], worst_l1[0], worst_kept[1], worst_l1[1]);
}

// Shift invariance is exact (the model sees only m - x). Permutation changes the order of the FP normalisation sum,
// so it holds to that sum's rounding: (L + 2) u relative.
TEST_CASE("SAS is shift invariant exactly and permutation equivariant to rounding", "[sas][property]") {
  REQUIRE(rc::check("permutation and shift", [] {
    SasParams p;
    p.half = *rc::gen::arbitrary<bool>();
    const RowFamily f = *rc::gen::elementOf(std::vector<RowFamily>(std::begin(kRowFamilies), std::end(kRowFamilies)));
    std::vector<double> row = make_row(f, *rc::gen::inRange(1, 300), *rc::gen::arbitrary<std::uint64_t>(), 30.0);
    // Snap to a 2^-10 grid so that adding an integer shift is exact.
    for (double& v : row) if (std::isfinite(v)) v = std::ldexp(std::round(std::ldexp(v, 10)), -10);
    const Eigen::Map<const RowMatrixXd> x(row.data(), 1, static_cast<Eigen::Index>(row.size()));
    const RowMatrixXd base = sas_softmax_rows(x, p);
    const RowMatrixXd shifted = sas_softmax_rows((x.array() + 64.0).matrix(), p);
    RC_ASSERT(base == shifted);
    const RowMatrixXd rev = x.rowwise().reverse();
    const RowMatrixXd back = sas_softmax_rows(rev, p).rowwise().reverse();
    const double tol = (static_cast<double>(row.size()) + 2) * (p.half ? 0x1p-24 : 0x1p-53) * 2;
    for (Eigen::Index j = 0; j < base.cols(); ++j) RC_ASSERT(std::fabs(back(0, j) - base(0, j)) <= tol * base(0, j));
  }));
}
