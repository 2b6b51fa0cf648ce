// Group-wise clipping (IntAttention Eq. 16-18, index_softmax_grouped) meets its declared bound against the exact
// softmax of the real logits alpha_j a_j, under both readings of the row maximum, every index, table and
// normalisation rule, and block scales up to 100x apart (docs/pipelines/intattention.md, "Error of the two readings").
#include <rapidcheck.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>

#include "qattn/key_groups.h"
#include "qattn/reference/index_softmax.h"
#include "qattn/reference/index_softmax_contract.h"
#include "qattn/reference/softmax.h"
#include "support/rows.h"

using namespace qattn;
using namespace qattn::ref;
using namespace qattn::test;

TEST_CASE("group-wise clipping meets its declared error contract", "[index][groups][contract][property]") {
  std::map<std::string, double> worst_element, worst_l1;
  REQUIRE(rc::check("per-element and per-row bounds vs the exact softmax of alpha_j a_j", [&] {
    IndexSoftmaxParams p;
    p.bits = *rc::gen::inRange(1, 9);
    p.c = *rc::gen::inRange(10, 121) / 10.0;
    p.cint_rounding = *rc::gen::element(CintRounding::round, CintRounding::floor);
    p.lut_rounding = *rc::gen::element(LutRounding::floor, LutRounding::round);
    p.index_rule = *rc::gen::element(IndexRule::floor, IndexRule::round, IndexRule::floor_f32, IndexRule::q26_round,
                                     IndexRule::q26_floor);
    p.normalization = *rc::gen::element(Normalization::floor, Normalization::f32_rne, Normalization::q8_reciprocal);
    p.p_format = p.normalization == Normalization::q8_reciprocal ? PFormat::u8 : *rc::gen::element(PFormat::u8, PFormat::s8);
    const GroupMax rule = *rc::gen::element(GroupMax::global, GroupMax::offset);
    const RowFamily f = *rc::gen::elementOf(std::vector<RowFamily>(std::begin(kRowFamilies), std::end(kRowFamilies)));
    const int requested = *rc::gen::inRange(1, 1025);
    const Eigen::Index block = *rc::gen::inRange(1, 257);
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    // alpha_j = alpha_max / u_j, u_j log-uniform in [1, 100]; alpha_max puts c_int of the largest scale in [4, 1e4].
    const double alpha_max = p.c / std::exp(*rc::gen::inRange(0, 1000) / 1000.0 * std::log(2500.0) + std::log(4.0));
    const std::vector<double> x = make_row(f, requested, seed, 40.0);  // one entry for the single-element family
    const Eigen::Index length = static_cast<Eigen::Index>(x.size()), blocks = (length + block - 1) / block;
    std::vector<double> alpha(static_cast<std::size_t>(blocks));
    for (double& a : alpha) a = alpha_max / std::exp(*rc::gen::inRange(0, 1001) / 1000.0 * std::log(100.0));
    alpha[0] = alpha_max;
    std::vector<std::int32_t> a(x.size());
    std::unique_ptr<bool[]> valid(new bool[x.size()]);
    std::vector<double> real(x.size());
    double a_max = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double s = alpha[j / block];
      valid[j] = !std::isinf(x[j]);
      a[j] = valid[j] ? static_cast<std::int32_t>(std::round(x[j] / s)) : 0;
      real[j] = valid[j] ? s * a[j] : -std::numeric_limits<double>::infinity();
      a_max = std::max(a_max, std::fabs(static_cast<double>(a[j])));
    }
    KeyGroupClip clip;
    clip.block = block;
    clip.ratio = key_group_ratios(alpha);  // s_Q = 1, scale = 1: alpha_j = s_K^(j)
    for (double s : alpha) clip.c_int.push_back(cint_from_alpha(p.c, s, p.cint_rounding));
    clip.rule = rule;
    clip.offset_scale = key_group_offset_scale(1.0, alpha_max, 1.0, p.bits, p.c);
    std::vector<std::int32_t> out(x.size());
    index_softmax_grouped_row(a.data(), valid.get(), length, clip, p, index_lut(p.bits, p.c, p.lut_rounding), out.data());
    const Eigen::Index visible = std::count(valid.get(), valid.get() + length, true);
    if (visible == 0) {
      RC_ASSERT(std::all_of(out.begin(), out.end(), [](int v) { return v == 0; }));
      return;
    }
    const std::vector<Exact50> exact = softmax_exact(real);
    double p_max = 0;
    for (const auto& v : exact) p_max = std::max(p_max, static_cast<double>(v));
    const IndexSoftmaxBound bound = IndexSoftmaxBound::make_grouped(p, clip, alpha, a_max);
    const double s = p.p_scale();
    double l1 = 0, worst = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double pj = static_cast<double>(exact[j]);
      const double err = std::fabs(out[j] / s - pj);
      l1 += err;
      const double b = bound.element(pj, p_max, visible) + 1e-12;
      if (!(err <= b))
        RC_FAIL(std::string(to_string(rule)) + " b=" + std::to_string(p.bits) + " index=" +
                std::string(to_string(p.index_rule)) + ": element " + std::to_string(j) + " err " +
                std::to_string(err) + " > bound " + std::to_string(b));
      worst = std::max(worst, err / b);
    }
    const double bl1 = bound.row_l1(p_max, visible) + 1e-12;
    RC_ASSERT(l1 <= bl1);
    const std::string key = std::string(to_string(rule)) + " / " + std::string(to_string(p.index_rule));
    worst_element[key] = std::max(worst_element[key], worst);
    worst_l1[key] = std::max(worst_l1[key], l1 / bl1);
  }));
  std::printf("\nGroup-wise clipping contract tightness (worst observed / bound) by reading / index rule:\n");
  for (const auto& [key, w] : worst_element) std::printf("  %-22s element %.3f   row L1 %.3f\n", key.c_str(), w, worst_l1[key]);
}

TEST_CASE("the group-wise bound adds the carried-maximum terms to the per-tensor bound", "[index][groups][contract]") {
  // Two blocks, alpha = (0.066, 0.0132): block 2's terms dominate under the global reading (its alpha is smaller but
  // the fixed-point term grows as 1 / r); with equal scales the global reading adds alpha / 2 + a_max / 2^30.
  IndexSoftmaxParams paper;
  KeyGroupClip clip;
  clip.block = 4;
  const std::vector<double> alpha = {0.066, 0.066};
  clip.ratio = key_group_ratios(alpha);
  clip.c_int = {100, 100};
  const IndexSoftmaxBound per_tensor = IndexSoftmaxBound::make(paper, 0.066, 100);
  const IndexSoftmaxBound global = IndexSoftmaxBound::make_grouped(paper, clip, alpha, 1000);
  CHECK(global.theta == Approx(per_tensor.theta + 0.066 * (0.5 + 1000.0 / std::ldexp(1.0, 30))).epsilon(1e-12));
  CHECK(global.theta == Approx(0.24590).margin(5e-6));  // the contract table's row
  CHECK(global.eta == 1.0);
  clip.rule = GroupMax::offset;
  const IndexSoftmaxBound offset = IndexSoftmaxBound::make_grouped(paper, clip, alpha, 1000);
  CHECK(offset.theta == Approx(per_tensor.theta + 6.6 / 31 / 2 + 1000 * 0.066 / std::ldexp(1.0, 30)).epsilon(1e-12));
  CHECK(offset.theta == Approx(0.31935).margin(5e-6));
  CHECK(offset.eta == 1.0);
  CHECK(offset.nu == per_tensor.nu);
}
