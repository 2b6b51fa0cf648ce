// IndexSoftmax properties over generated rows, for every combination of rules: exact shift invariance,
// permutation equivariance, monotonicity, range, the exact row-sum range of each normalisation, and the declared
// error contract against the exact softmax of the real logits (with its tightness reported).
#include <rapidcheck.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <numeric>

#include "qattn/reference/index_softmax.h"
#include "qattn/reference/index_softmax_contract.h"
#include "qattn/reference/softmax.h"
#include "support/rows.h"

using namespace qattn;
using namespace qattn::ref;
using namespace qattn::test;

namespace {

struct Case {
  IndexSoftmaxParams params;
  double alpha;
  std::int64_t c_int;
  std::vector<std::int32_t> a;
  std::vector<bool> valid;  // std::vector<bool> has no data(); copied into a bool array when used
  RowFamily family;
};

// Every choice the model offers, drawn at random (q8 only with u8, as the registry enforces).
rc::Gen<IndexSoftmaxParams> gen_params() {
  return rc::gen::exec([] {
    IndexSoftmaxParams p;
    p.bits = *rc::gen::inRange(1, 9);
    p.c = *rc::gen::inRange(10, 121) / 10.0;
    p.cint_rounding = *rc::gen::element(CintRounding::round, CintRounding::trunc, CintRounding::floor);
    p.lut_rounding = *rc::gen::element(LutRounding::floor, LutRounding::round);
    p.index_rule = *rc::gen::element(IndexRule::floor, IndexRule::round, IndexRule::floor_f32, IndexRule::q26_round,
                                     IndexRule::q26_floor);
    p.normalization = *rc::gen::element(Normalization::floor, Normalization::f32_rne, Normalization::q8_reciprocal);
    p.p_format = p.normalization == Normalization::q8_reciprocal ? PFormat::u8 : *rc::gen::element(PFormat::u8, PFormat::s8);
    return p;
  });
}

// Real logits from a row family (|x| <= 40), quantised with a scale alpha chosen so that c_int lies in [4, 1e5].
Case make_case(const IndexSoftmaxParams& params, RowFamily f, int length, std::uint64_t seed, double log_cint) {
  Case k{params, 0, 0, {}, {}, f};
  const double target = std::exp(log_cint);
  k.alpha = params.c / target;
  k.c_int = cint_from_alpha(params.c, k.alpha, params.cint_rounding);
  const std::vector<double> x = make_row(f, length, seed, 40.0);
  for (double v : x) {
    const bool masked = std::isinf(v);
    k.valid.push_back(!masked);
    k.a.push_back(masked ? 0 : static_cast<std::int32_t>(std::clamp(std::round(v / k.alpha), -2147483647.0, 2147483647.0)));
  }
  return k;
}

rc::Gen<Case> gen_case() {
  return rc::gen::exec([] {
    const IndexSoftmaxParams p = *gen_params();
    const RowFamily f = *rc::gen::elementOf(std::vector<RowFamily>(std::begin(kRowFamilies), std::end(kRowFamilies)));
    const int length = *rc::gen::inRange(1, 4097);
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    const double log_cint = *rc::gen::inRange(0, 1000) / 1000.0 * (std::log(1e5) - std::log(4.0)) + std::log(4.0);
    return make_case(p, f, length, seed, log_cint);
  });
}

struct Output {
  std::vector<std::int32_t> p;
  IndexSoftmaxTrace trace;
};

Output run(const Case& k, const std::vector<std::int32_t>& a, const std::vector<bool>& valid) {
  std::unique_ptr<bool[]> v(new bool[valid.size()]);
  std::copy(valid.begin(), valid.end(), v.get());
  Output o;
  o.p.resize(a.size());
  const auto lut = index_lut(k.params.bits, k.params.c, k.params.lut_rounding);
  index_softmax_row(a.data(), v.get(), static_cast<Eigen::Index>(a.size()), k.c_int, k.params, lut, o.p.data(), &o.trace);
  return o;
}

std::string describe(const Case& k) {
  return "b=" + std::to_string(k.params.bits) + " c=" + std::to_string(k.params.c) + " cint=" +
         std::string(to_string(k.params.cint_rounding)) + " lut=" + std::string(to_string(k.params.lut_rounding)) +
         " index=" + std::string(to_string(k.params.index_rule)) + " norm=" + std::string(to_string(k.params.normalization)) +
         " s=" + std::to_string(k.params.p_scale()) + " alpha=" + std::to_string(k.alpha) + " c_int=" +
         std::to_string(k.c_int) + " L=" + std::to_string(k.a.size()) + " family=" + family_name(k.family);
}

}  // namespace

TEST_CASE("IndexSoftmax exact invariances", "[index][property]") {
  REQUIRE(rc::check("shift invariance: P(a + k) == P(a) exactly", [] {
    const Case k = *gen_case();
    std::int64_t lo = INT32_MAX, hi = INT32_MIN;
    for (std::size_t j = 0; j < k.a.size(); ++j) lo = std::min<std::int64_t>(lo, k.a[j]), hi = std::max<std::int64_t>(hi, k.a[j]);
    const std::int64_t shift = *rc::gen::inRange<std::int64_t>(INT32_MIN - lo, INT32_MAX - hi + 1);
    std::vector<std::int32_t> b(k.a);
    for (auto& v : b) v = static_cast<std::int32_t>(v + shift);
    RC_ASSERT(run(k, k.a, k.valid).p == run(k, b, k.valid).p);
  }));
  REQUIRE(rc::check("permutation equivariance: P(pi a) == pi P(a) exactly", [] {
    const Case k = *gen_case();
    std::vector<std::size_t> perm(k.a.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937_64 g(*rc::gen::arbitrary<std::uint64_t>());
    std::shuffle(perm.begin(), perm.end(), g);
    std::vector<std::int32_t> b(k.a.size());
    std::vector<bool> vb(k.a.size());
    for (std::size_t j = 0; j < perm.size(); ++j) b[j] = k.a[perm[j]], vb[j] = k.valid[perm[j]];
    const Output o = run(k, k.a, k.valid), ob = run(k, b, vb);
    for (std::size_t j = 0; j < perm.size(); ++j) RC_ASSERT(ob.p[j] == o.p[perm[j]]);
  }));
  REQUIRE(rc::check("monotone, non-negative, at most s_P; masked entries are 0", [] {
    const Case k = *gen_case();
    const Output o = run(k, k.a, k.valid);
    std::vector<std::size_t> order;
    for (std::size_t j = 0; j < k.a.size(); ++j) {
      RC_ASSERT(o.p[j] >= 0);
      RC_ASSERT(o.p[j] <= k.params.p_scale());
      if (k.valid[j]) order.push_back(j);
      else RC_ASSERT(o.p[j] == 0);
    }
    std::sort(order.begin(), order.end(), [&](auto x, auto y) { return k.a[x] < k.a[y]; });
    for (std::size_t i = 1; i < order.size(); ++i) {
      RC_ASSERT(o.p[order[i]] >= o.p[order[i - 1]]);
      if (k.a[order[i]] == k.a[order[i - 1]]) RC_ASSERT(o.p[order[i]] == o.p[order[i - 1]]);
    }
  }));
}

TEST_CASE("IndexSoftmax row sum lies in its derived range", "[index][property]") {
  std::map<Normalization, std::pair<double, double>> seen;  // closest approach to lo and hi, in units of the slack
  REQUIRE(rc::check("row-sum range per normalisation", [&seen] {
    const Case k = *gen_case();
    const Output o = run(k, k.a, k.valid);
    if (std::none_of(k.valid.begin(), k.valid.end(), [](bool b) { return b; })) {
      RC_ASSERT(std::all_of(o.p.begin(), o.p.end(), [](auto v) { return v == 0; }));
      return;
    }
    const std::int64_t nnz = std::count_if(o.trace.e.begin(), o.trace.e.end(), [](int e) { return e > 0; });
    const double sum = std::accumulate(o.p.begin(), o.p.end(), 0.0);
    const RowSumRange r = row_sum_range(k.params.normalization, k.params.p_scale(), o.trace.row_sum, nnz);
    RC_ASSERT(sum >= r.lo);
    RC_ASSERT(sum <= r.hi);
  }));
}

TEST_CASE("the IndexSoftmax contract table matches IndexSoftmaxBound", "[index][contract]") {
  // theta, eta, nu for two presets at c_int = 100, alpha = 0.066 (docs/methods/index-softmax.md, "Declared bound").
  IndexSoftmaxParams paper;  // defaults: b=5, c=6.6, floor everywhere, u8
  const IndexSoftmaxBound b = IndexSoftmaxBound::make(paper, 0.066, 100);
  CHECK(b.theta == Approx(6.6 / 31).epsilon(1e-12));
  CHECK(b.eta == 1.0);
  CHECK(b.nu == Approx(1.0 / 255).epsilon(1e-15));
  IndexSoftmaxParams neon = paper;
  neon.lut_rounding = LutRounding::round;
  neon.index_rule = IndexRule::q26_round;
  neon.normalization = Normalization::q8_reciprocal;
  const IndexSoftmaxBound n = IndexSoftmaxBound::make(neon, 0.066, 100);
  CHECK(n.theta == Approx((0.5 + 100.0 / 134217728.0) * 6.6 / 31).epsilon(1e-12));
  CHECK(n.eta == 0.5);
  CHECK(n.nu == Approx((0.5 + 255.0 / 512.0) / 255).epsilon(1e-15));
  // A row of 128 entries with p_max = 0.5: D, S_lo and the per-element bound of an entry with p = 0.01.
  CHECK(b.row_mass_error(0.5, 128) == Approx(510 * std::expm1(6.6 / 31) + 128).epsilon(1e-12));
  CHECK(b.row_sum_lower(0.5, 128) == Approx(std::max(255.0, 510 - (510 * std::expm1(6.6 / 31) + 128))).epsilon(1e-12));
  CHECK(b.element(0.01, 0.5, 128) == Approx(0.0039215686 + (0.01 * 510 * 0.23726 + 1 + 0.01 * 249.0) / 261).epsilon(1e-3));
}

TEST_CASE("IndexSoftmax meets its declared error contract", "[index][contract][property]") {
  std::map<std::string, double> worst_element, worst_l1;
  REQUIRE(rc::check("per-element and per-row bounds vs the exact softmax of alpha * a", [&] {
    const Case k = *gen_case();
    const Output o = run(k, k.a, k.valid);
    std::vector<double> x(k.a.size());
    Eigen::Index valid = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      x[j] = k.valid[j] ? k.alpha * k.a[j] : -std::numeric_limits<double>::infinity();
      valid += k.valid[j];
    }
    if (valid == 0) return;
    const std::vector<Exact50> exact = softmax_exact(x);
    double p_max = 0;
    for (const auto& v : exact) p_max = std::max(p_max, static_cast<double>(v));
    const IndexSoftmaxBound bound = IndexSoftmaxBound::make(k.params, k.alpha, k.c_int);
    const double s = k.params.p_scale();
    double l1 = 0, worst = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double p = static_cast<double>(exact[j]);
      const double err = std::fabs(o.p[j] / s - p);
      l1 += err;
      // 1e-12: alpha * a is rounded to double before the exact softmax (relative 1e-16 per logit).
      const double b = bound.element(p, p_max, valid) + 1e-12;
      if (!(err <= b)) RC_FAIL(describe(k) + ": element " + std::to_string(j) + " err " + std::to_string(err) + " > bound " + std::to_string(b));
      worst = std::max(worst, err / b);
    }
    const double bl1 = bound.row_l1(p_max, valid) + 1e-12;
    RC_ASSERT(l1 <= bl1);
    const std::string key = std::string(to_string(k.params.normalization)) + " / " + std::string(to_string(k.params.index_rule));
    worst_element[key] = std::max(worst_element[key], worst);
    worst_l1[key] = std::max(worst_l1[key], l1 / bl1);
  }));
  std::printf("\nIndexSoftmax contract tightness (worst observed / bound) by normalisation / index rule:\n");
  for (const auto& [key, w] : worst_element) std::printf("  %-28s element %.3f   row L1 %.3f\n", key.c_str(), w, worst_l1[key]);
}
