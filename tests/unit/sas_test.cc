// SAS reference model: its pieces against independent computations.
#include <catch2/catch.hpp>
#include <cmath>

#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/sas.h"

using namespace qattn;
using namespace qattn::ref;

TEST_CASE("SAS exp: LUT times cubic, threshold, binary16 path", "[sas]") {
  SasParams p;
  const auto& a = kSasPaperPoly;
  for (double y : {0.0, 0.25, 1.0, 1.7, 3.999, 5.5, 6.0}) {
    const double i = std::floor(y), f = y - i;
    CHECK(sas_exp(y, p) == Approx(std::exp(-i) * (a[0] + a[1] * f + a[2] * f * f + a[3] * f * f * f)).epsilon(1e-15));
    CHECK(sas_exp(y, p) == Approx(std::exp(-y)).epsilon(1.1e-3));  // the cubic is within 0.103% of e^-f
  }
  CHECK(sas_exp(6.0, p) > 0);            // x - max = n_r exactly is kept
  CHECK(sas_exp(6.0 + 1e-12, p) == 0);   // below the threshold is dropped
  p.n_r = -5;
  CHECK(sas_exp(5.5, p) == 0);
  p.n_r = 0;
  CHECK_THROWS_AS(sas_exp(1.0, p), std::invalid_argument);
  SasParams h;
  h.half = true;
  for (double y : {0.1, 0.37, 2.2, 5.9}) {
    const double e = sas_exp(y, h);
    CHECK(round_to_format(e, kBinary16) == e);  // the product is a binary16 value
    CHECK(e == Approx(std::exp(-y)).epsilon(2e-2));
  }
}

TEST_CASE("SAS softmax rows: masks, normalisation, NaN", "[sas]") {
  const double inf = std::numeric_limits<double>::infinity();
  RowMatrixXd x(3, 4);
  x << 0, -1, -inf, -10, -inf, -inf, -inf, -inf, 1, NAN, 0, 0;
  for (bool half : {false, true}) {
    SasParams p;
    p.half = half;
    const RowMatrixXd s = sas_softmax_rows(x, p);
    CHECK(s(0, 2) == 0);
    CHECK(s(0, 3) == 0);  // -10 - 0 < -6: dropped
    CHECK(s.row(0).sum() == Approx(1.0).epsilon(1e-6));
    CHECK(s.row(1).isZero());
    CHECK(std::isnan(s(2, 0)));
  }
}

TEST_CASE("SAS least-squares cubic and polynomial error", "[sas]") {
  const auto c = sas_lsq_poly();
  // Normal equations: the residual e^{-x} - POLY is orthogonal to 1, x, x^2, x^3 (Simpson's rule, 2000 panels).
  for (int k = 0; k < 4; ++k) {
    double s = 0;
    const int n = 2000;
    for (int i = 0; i <= n; ++i) {
      const double f = static_cast<double>(i) / n, w = (i == 0 || i == n) ? 1 : (i % 2 ? 4 : 2);
      s += w * (std::exp(-f) - (c[0] + c[1] * f + c[2] * f * f + c[3] * f * f * f)) * std::pow(f, k);
    }
    CHECK(std::fabs(s / (3 * n)) < 1e-12);
  }
  CHECK(c[0] == Approx(0.99961).epsilon(1e-5));
  CHECK(c[3] == Approx(-0.10250).epsilon(1e-3));
  CHECK(poly_max_relative_error(kSasPaperPoly) > 0);
  // The Eq. 15 cubic is worst at f -> 1: POLY(1) = 0.3675 against e^-1 = 0.36788.
  CHECK(poly_max_relative_error(kSasPaperPoly) == Approx(std::fabs(0.3675 * std::exp(1.0) - 1)).epsilon(1e-6));
  // Taylor cubic: worst at f = 1 too, |e (1 - 1 + 1/2 - 1/6) - 1|.
  CHECK(poly_max_relative_error({1, -1, 0.5, -1.0 / 6}) == Approx(std::fabs(std::exp(1.0) / 3 - 1)).epsilon(1e-9));
}

TEST_CASE("the sas method in the registry", "[sas]") {
  const Registry& r = reference_registry();
  CHECK(r.canonical(parse_method_spec("sas@paper")) == "sas:nr=-6,poly=paper,half=true");
  CHECK_THROWS_AS(r.create("sas:nr=1"), SpecError);
  RowMatrixXd x(1, 3);
  x << 0.5, 0.0, -7.0;
  const RowMatrixXd p = r.create("sas")->softmax_rows(x);
  CHECK(p(0, 2) == 0);
  CHECK(p.sum() == Approx(1.0));
}
