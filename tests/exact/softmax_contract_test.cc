// softmax_ref<Scalar> against softmax_exact: the declared error contract (softmax.h, docs/softmax-reference.md)
// holds on every generated row, its table here matches the code, and it is tight: the worst observed error
// reaches at least a quarter of the bound.
#include <rapidcheck.h>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <random>

#include "qattn/reference/softmax.h"
#include "support/rows.h"
#include "support/test_scale.h"

#if QATTN_HAVE_MPFR
#include <boost/multiprecision/mpfr.hpp>
#endif

using namespace qattn;
using namespace qattn::ref;
using namespace qattn::test;

namespace {

// The contract, restated (docs/softmax-reference.md, table "Declared bound"). eps(p, L) / u for a few (p, L):
// ln(1/p) + ln L + pairwise_depth(L) + 6.
struct ContractRow {
  double p;
  Eigen::Index L;
  double eps_over_u;
};
constexpr ContractRow kContractTable[] = {
    {1.0, 1, 6.0},                      // depth 0
    {1.0, 8, 8.0794415416798357 + 7},   // ln 8 + depth 7 + 6
    {0.5, 2, 0.6931471805599453 * 2 + 1 + 6},
    {1.0, 128, 4.8520302639196169 + 11 + 6},
    {1.0, 4096, 8.3177661667193433 + 16 + 6},
    {1e-300, 4096, 690.77552789821368 + 8.3177661667193433 + 16 + 6},
};

struct Tightness {
  double worst_ratio = 0;   // max over elements of |p^ - p| / bound
  double worst_rel_err = 0; // max relative error over elements with p >= smallest normal
  long elements = 0;
};

// Tightness over the constructed worst-case rows (far_tail_row), kept apart from the random families.
template <class Scalar>
Tightness& tight_witness() {
  static Tightness t;
  return t;
}

// Checks one row; returns false (after printing) if the bound fails anywhere.
template <class Scalar>
bool check_row(const std::vector<double>& row_in, Tightness& t) {
  using Contract = SoftmaxRefContract<Scalar>;
  const Eigen::Index L = static_cast<Eigen::Index>(row_in.size());
  Eigen::Matrix<Scalar, 1, Eigen::Dynamic> row(L);
  std::vector<double> as_double(L);
  for (Eigen::Index i = 0; i < L; ++i) as_double[i] = static_cast<double>(row(i) = static_cast<Scalar>(row_in[i]));
  const auto got = softmax_ref(row);
  const std::vector<Exact50> exact = softmax_exact(as_double);
  for (Eigen::Index i = 0; i < L; ++i) {
    const double p = static_cast<double>(exact[i]);
    const double err = static_cast<double>(abs(Exact50(static_cast<double>(got(i))) - exact[i]));
    if (std::isinf(as_double[i])) {  // masked: exactly zero
      if (got(i) != 0) return false;
      continue;
    }
    const double bound = Contract::bound(p, L);
    if (!(err <= bound)) {
      std::printf("bound violated: L=%ld i=%ld x=%.17g p=%.17g got=%.17g err=%.3g bound=%.3g\n", static_cast<long>(L),
                  static_cast<long>(i), as_double[i], p, static_cast<double>(got(i)), err, bound);
      return false;
    }
    t.worst_ratio = std::max(t.worst_ratio, err / bound);
    if (p >= std::numeric_limits<Scalar>::min()) t.worst_rel_err = std::max(t.worst_rel_err, err / p);
    ++t.elements;
  }
  return true;
}

// The worst case of the contract, built on purpose: one logit at height H above a cluster in [-1, 1], with H
// close to the underflow limit ln(1/min_normal). Then d_i = x_i - m is about -H, and x_i - m is inexact (x_i
// has a finer ulp than m), so the exp-argument term u |d_i| ~ u ln(1/p_i) of the bound is nearly realised.
template <class Scalar>
std::vector<double> far_tail_row(int length, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const double H = 0.9 * -std::log(static_cast<double>(std::numeric_limits<Scalar>::min()));
  std::vector<double> row(length);
  for (double& x : row) x = static_cast<double>(static_cast<Scalar>(unit(g)));
  row[seed % length] = H + 0.5 * (1 + unit(g));
  return row;
}

template <class Scalar>
std::map<RowFamily, Tightness> run_contract(const char* type_name) {
  std::map<RowFamily, Tightness> tight;
  for (RowFamily f : kRowFamilies) {
    // Appended in place: the same text built with operator+ on a temporary trips GCC 12's -Warray-bounds false
    // positive in libstdc++ once the unity build inlines more of it.
    std::string name = type_name;
    name += " softmax_ref within its declared bound: ";
    name += family_name(f);
    const bool ok = rc::check(name, [&tight, f] {
      const int length = *rc::gen::inRange(1, 4097);
      const auto seed = *rc::gen::arbitrary<std::uint64_t>();
      RC_ASSERT(check_row<Scalar>(make_row(f, length, seed), tight[f]));
    });
    REQUIRE(ok);
    // A fixed sweep as well, so that the tightness figure does not depend on how many random cases ran.
    for (int length : {1, 7, 128, 1000, 4096})
      for (std::uint64_t seed = 1; seed <= 6; ++seed) REQUIRE(check_row<Scalar>(make_row(f, length, seed), tight[f]));
  }
  for (int length : {2, 16, 128, 4096})
    for (std::uint64_t seed = 1; seed <= 4; ++seed) REQUIRE(check_row<Scalar>(far_tail_row<Scalar>(length, seed), tight_witness<Scalar>()));
  return tight;
}

// Returns the overall ratio after printing the per-family table.
template <class Scalar>
double report_tightness(const std::map<RowFamily, Tightness>& tight, const char* type_name) {
  double overall = 0;
  std::printf("\n%s contract tightness (worst |p^-p| / bound, per family):\n", type_name);
  for (const auto& [f, t] : tight) {
    std::printf("  %-20s ratio %.3f   worst relative error %.3g (= %.1f u)   elements %ld\n", family_name(f).c_str(),
                t.worst_ratio, t.worst_rel_err, t.worst_rel_err / SoftmaxRefContract<Scalar>::u, t.elements);
    overall = std::max(overall, t.worst_ratio);
  }
  const Tightness& w = tight_witness<Scalar>();
  std::printf("  %-20s ratio %.3f   worst relative error %.3g (= %.1f u)   elements %ld\n", "far tail (witness)",
              w.worst_ratio, w.worst_rel_err, w.worst_rel_err / SoftmaxRefContract<Scalar>::u, w.elements);
  overall = std::max(overall, w.worst_ratio);
  std::printf("  overall ratio %.3f\n", overall);
  return overall;
}

}  // namespace

TEST_CASE("the contract table matches SoftmaxRefContract", "[softmax][contract]") {
  for (const ContractRow& r : kContractTable) {
    INFO("p=" << r.p << " L=" << r.L);
    CHECK(SoftmaxRefContract<double>::eps(r.p, r.L) / SoftmaxRefContract<double>::u == Approx(r.eps_over_u).epsilon(1e-12));
    CHECK(SoftmaxRefContract<float>::eps(r.p, r.L) / SoftmaxRefContract<float>::u == Approx(r.eps_over_u).epsilon(1e-12));
  }
  CHECK(SoftmaxRefContract<double>::u == std::ldexp(1.0, -53));
  CHECK(SoftmaxRefContract<float>::u == std::ldexp(1.0, -24));
  CHECK(SoftmaxRefContract<double>::tau == 4 * std::numeric_limits<double>::denorm_min());
  CHECK(pairwise_depth(1) == 0);
  CHECK(pairwise_depth(8) == 7);
  CHECK(pairwise_depth(9) == 1 + 4);
  CHECK(pairwise_depth(4096) == 16);
}

TEST_CASE("double softmax_ref meets its bound on generated rows, tightly", "[softmax][contract][property]") {
  // The double contract is required to be tight: the worst observed error reaches >= 1/4 of the bound.
  const double overall = report_tightness<double>(run_contract<double>("double"), "double");
  CHECK(overall >= 0.25);
  CHECK(overall <= 1.0);
}

TEST_CASE("float softmax_ref meets its bound on generated rows, tightly", "[softmax][contract][property]") {
  const double overall = report_tightness<float>(run_contract<float>("float"), "float");
  CHECK(overall >= 0.25);
  CHECK(overall <= 1.0);
}

TEST_CASE("special rows: masks, empty, NaN, +inf, single element", "[softmax]") {
  const double inf = std::numeric_limits<double>::infinity();
  Eigen::RowVectorXd all_masked(3);
  all_masked << -inf, -inf, -inf;
  CHECK(softmax_ref(all_masked).isZero());
  for (const auto& v : softmax_exact(std::vector<double>{-inf, -inf})) CHECK(v == 0);
  CHECK(softmax_ref(Eigen::RowVectorXd(0)).size() == 0);
  CHECK(softmax_exact(std::vector<double>{}).empty());
  Eigen::RowVectorXd with_nan(2), with_inf(2);
  with_nan << 1.0, std::nan("");
  with_inf << 1.0, inf;
  CHECK(softmax_ref(with_nan).array().isNaN().all());
  CHECK(softmax_ref(with_inf).array().isNaN().all());
  CHECK(isnan(softmax_exact(std::vector<double>{1.0, inf})[0]));
  Eigen::RowVectorXd one(1);
  one << -9999.5;
  CHECK(softmax_ref(one)(0) == 1.0);
  // Multiprecision instantiation: the same algorithm at 50 digits agrees with softmax_exact to ~1e-48.
  Eigen::Matrix<Exact50, 1, Eigen::Dynamic> mp(4);
  mp << Exact50(1), Exact50(-2), Exact50(0.5), Exact50(3);
  const auto pm = softmax_ref(mp);
  const auto pe = softmax_exact(std::vector<double>{1, -2, 0.5, 3});
  for (int i = 0; i < 4; ++i) CHECK(abs(pm(i) - pe[i]) < Exact50("1e-48"));
}

#if QATTN_HAVE_MPFR
TEST_CASE("MPFR and cpp_bin_float exact backends agree", "[softmax][mpfr]") {
  using boost::multiprecision::mpfr_float_50;
  for (RowFamily f : kRowFamilies) {
    const std::vector<double> row = make_row(f, 300, 99);
    const auto a = softmax_exact<Exact50>(row);
    const auto b = softmax_exact<mpfr_float_50>(row);
    for (std::size_t i = 0; i < row.size(); ++i) {
      const Exact50 bb(b[i].str(60));
      CHECK(abs(a[i] - bb) <= Exact50("1e-45") * a[i]);
    }
  }
}
#endif
