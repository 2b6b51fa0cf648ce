// Group-wise clipping (IntAttention Eq. 16-18) in the reference model: equal block scales reproduce the per-tensor
// pipeline bit for bit, the two-block row of docs/pipelines/intattention.md gives its largest P to the block with
// the larger real logit, keys and their scales permute jointly, masks, and the refusals.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "support/random_matrix.h"
#include "qattn/error.h"
#include "qattn/key_groups.h"
#include "qattn/reference/index_softmax.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/registry.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::random_matrix;

namespace {

AttentionResult run(const std::string& spec, const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v,
                    const AttentionMask& mask = {}) {
  return reference_registry().create(parse_method_spec(spec))->attention(q, k, v, 1 / std::sqrt(double(q.cols())), mask);
}

// K whose every block of `block` keys has the same max |K| (one planted entry each), so every block scale is equal.
RowMatrixXd equal_block_maxima(Eigen::Index keys, Eigen::Index d, Eigen::Index block, std::mt19937_64& g) {
  RowMatrixXd k = random_matrix(keys, d, 1.0, g);
  const double top = k.cwiseAbs().maxCoeff() * 1.25;
  for (Eigen::Index j0 = 0; j0 < keys; j0 += block) k(j0 + (j0 / block) % std::min<Eigen::Index>(block, keys - j0), (j0 / block) % d) = (j0 / block) % 2 ? top : -top;
  return k;
}

// The row of one query through index_softmax_grouped with scales s_k (s_Q = 1, logit scale 1).
std::vector<std::int32_t> grouped_row(const std::vector<std::int32_t>& a, Eigen::Index block, std::vector<double> s_k,
                                      GroupMax rule, const IndexSoftmaxParams& params = {}) {
  KeyGroupClip clip;
  clip.block = block;
  clip.ratio = key_group_ratios(s_k);
  for (double s : s_k) clip.c_int.push_back(cint_from_alpha(params.c, s, params.cint_rounding));
  clip.rule = rule;
  clip.offset_scale = key_group_offset_scale(1.0, *std::max_element(s_k.begin(), s_k.end()), 1.0, params.bits, params.c);
  std::vector<std::int32_t> p(a.size());
  index_softmax_grouped_row(a.data(), nullptr, static_cast<Eigen::Index>(a.size()), clip, params,
                            index_lut(params.bits, params.c, params.lut_rounding), p.data());
  return p;
}

}  // namespace

TEST_CASE("k-group with equal block scales is the per-tensor pipeline, bit for bit", "[pipelines][groups]") {
  std::mt19937_64 g(1601);
  for (const std::string preset : {"intattention", "intattention@paper", "intattention@upstream-sim",
                                   "intattention@upstream-neon", "intattention:p=s8,index=round"}) {
    for (const Eigen::Index block : {1, 16, 24, 64}) {
      const Eigen::Index lq = 37, lk = 96, d = 32;
      const RowMatrixXd q = random_matrix(lq, d, 1.0, g), v = random_matrix(lk, 24, 1.0, g);
      const RowMatrixXd k = equal_block_maxima(lk, d, block, g);
      AttentionMask causal;
      causal.causal = true;
      AttentionMask padding;
      padding.valid = RowMatrixXb::Constant(lq, lk, true);
      padding.valid.rightCols(29).setConstant(false);  // whole blocks and a partial one masked
      for (const AttentionMask& mask : {AttentionMask{}, causal, padding}) {
        const std::string grouped = preset + (preset.find(':') == std::string::npos ? ":" : ",") +
                                    "k-group=" + std::to_string(block);
        INFO(grouped << " causal " << mask.causal << " padding " << mask.valid.size());
        const AttentionResult a = run(preset, q, k, v, mask), b = run(grouped, q, k, v, mask);
        CHECK(a.p_int == b.p_int);
        CHECK(a.o == b.o);
        // and with a Q scale per 8 rows on both sides
        const AttentionResult c = run(preset + (preset.find(':') == std::string::npos ? ":" : ",") + "q-group=8", q, k, v, mask);
        const AttentionResult e = run(grouped + ",q-group=8", q, k, v, mask);
        CHECK(c.p_int == e.p_int);
        CHECK(c.o == e.o);
      }
    }
  }
}

TEST_CASE("a two-block row gives its largest P to the block with the larger real logit", "[pipelines][groups]") {
  // alpha_1 = 0.01 with m_1 = 500 (real 5.0) and alpha_2 = 0.05 with m_2 = 120 (real 6.0). Read with each block's own
  // maximum, both maxima would get E = 255; here only block 2's maximum has distance 0.
  const std::vector<std::int32_t> a = {500, 400, 300, 120, 100, 60};
  for (const GroupMax rule : {GroupMax::global, GroupMax::offset}) {
    INFO(to_string(rule));
    const std::vector<std::int32_t> p = grouped_row(a, 3, {0.01, 0.05}, rule);
    CHECK(p[3] == *std::max_element(p.begin(), p.end()));
    CHECK(p[3] > p[0]);
    CHECK(p[0] > 0);
    // Against the exact softmax of the real logits 5, 4, 3, 6, 5, 3: P / 255 within a few table steps.
    const double x[] = {5.0, 4.0, 3.0, 6.0, 5.0, 3.0};
    double s = 0;
    for (double v : x) s += std::exp(v);
    for (std::size_t j = 0; j < a.size(); ++j) CHECK(std::fabs(p[j] / 255.0 - std::exp(x[j]) / s) < 0.06);
  }
  // The global reading's integers, by hand: rho = (2^30 / 5, 2^30) rounded, mu = 2^30 120 (block 2),
  // M_1 = round(120 * 5) = 600, so the 500 entry has distance 100 of c_int^(1) = round(6.6 / 0.01) = 660: floor index
  // 100 * 31 / 660 = 4, E = floor(255 exp(-6.6 * 4 / 31)) = 108; 400 and 300: indices 9 and 14, E = 37 and 12.
  // Block 2 (c_int^(2) = 132): 100 and 60 at indices 4 and 14. Row E = 108, 37, 12 | 255, 108, 12: S = 532.
  const std::vector<std::int32_t> p = grouped_row(a, 3, {0.01, 0.05}, GroupMax::global);
  const std::vector<std::int32_t> expected = {255 * 108 / 532, 255 * 37 / 532, 255 * 12 / 532,
                                              255 * 255 / 532, 255 * 108 / 532, 255 * 12 / 532};
  CHECK(p == expected);
}

TEST_CASE("global anchor and offset: the fixed-point steps", "[pipelines][groups]") {
  CHECK(key_group_anchor(7, 2) == 4);    // 3.5 rounds up
  CHECK(key_group_anchor(-7, 2) == -3);  // -3.5 rounds up
  CHECK(key_group_anchor(-8, 3) == -3);  // -2.67
  CHECK(key_group_anchor(std::int64_t{120} << 30, std::int64_t{1} << 30) == 120);
  const std::vector<double> s = {0.01, 0.05, 0.05};
  const std::vector<std::int64_t> rho = key_group_ratios(s);
  CHECK(rho[0] == std::llround(std::ldexp(0.2, 30)));
  CHECK(rho[1] == std::int64_t{1} << 30);
  CHECK_THROWS_WITH(key_group_ratios(std::vector<double>{1.0, 1e-10}), Catch::Contains("key block 1"));
  CHECK_THROWS_WITH(key_group_ratios(std::vector<double>{1.0, 0.0}), Catch::Contains("key block 1"));
  CHECK(key_group_offset(0, 1.0, 5) == 0);
  CHECK(key_group_offset(std::int64_t{1} << 40, 1.0, 5) == 31);  // clamped to the last entry
}

TEST_CASE("k-group: keys permute with their scales, masks, refusals", "[pipelines][groups]") {
  std::mt19937_64 g(1602);
  const Eigen::Index lq = 9, lk = 64, d = 16, block = 16;
  const RowMatrixXd q = random_matrix(lq, d, 1.0, g), v = random_matrix(lk, 8, 1.0, g);
  RowMatrixXd k = random_matrix(lk, d, 1.0, g);
  for (Eigen::Index j = 0; j < lk; ++j) k.row(j) *= 1 + 3 * ((j / block) % 3);  // block scales 1x, 4x, 7x, 1x
  // Whole blocks reordered (with their keys' values), and keys shuffled inside each block.
  std::vector<Eigen::Index> perm(lk);
  const Eigen::Index block_order[] = {2, 0, 3, 1};
  for (Eigen::Index b = 0; b < 4; ++b)
    for (Eigen::Index t = 0; t < block; ++t) perm[b * block + t] = block_order[b] * block + t;
  for (Eigen::Index b = 0; b < 4; ++b) std::shuffle(perm.begin() + b * block, perm.begin() + (b + 1) * block, g);
  RowMatrixXd kp(lk, d), vp(lk, v.cols());
  for (Eigen::Index j = 0; j < lk; ++j) kp.row(j) = k.row(perm[j]), vp.row(j) = v.row(perm[j]);
  for (const std::string spec : {"intattention:k-group=16", "intattention:k-group=16,group-max=offset",
                                 "intattention@upstream-neon:k-group=16,q-group=1"}) {
    INFO(spec);
    const AttentionResult a = run(spec, q, k, v), b = run(spec, q, kp, vp);
    CHECK(a.o == b.o);
    for (Eigen::Index j = 0; j < lk; ++j) CHECK(b.p_int.col(j) == a.p_int.col(perm[j]));
  }
  // V per key block: exact under shuffles inside each block (integer sums per block, the same double sum order).
  RowMatrixXd ks = k, vs = v;
  for (Eigen::Index j = 0; j < lk; ++j) {
    const Eigen::Index src = (j / block) * block + (perm[j] % block);
    ks.row(j) = k.row(src), vs.row(j) = v.row(src);
  }
  const std::string vblock = "intattention:k-group=16,v-group=key-block";
  CHECK(run(vblock, q, k, v).o == run(vblock, q, ks, vs).o);
  // Masked keys take no part: a fully masked block, a fully masked row.
  AttentionMask mask;
  mask.valid = RowMatrixXb::Constant(lq, lk, true);
  mask.valid.block(0, 16, lq, 16).setConstant(false);
  mask.valid.row(4).setConstant(false);
  const AttentionResult m = run("intattention:k-group=16", q, k, v, mask);
  CHECK((m.p_int.block(0, 16, lq, 16).array() == 0).all());
  CHECK((m.p_int.row(4).array() == 0).all());
  CHECK((m.o.row(4).array() == 0).all());
  CHECK((m.p_int.row(0).array() > 0).any());
  // v-group=key-block needs key blocks.
  CHECK_THROWS_AS(run("intattention:v-group=key-block", q, k, v), SpecError);
}

TEST_CASE("v-group=key-block: O is the sum over blocks of each block's dequantised P V", "[pipelines][groups]") {
  std::mt19937_64 g(1603);
  const Eigen::Index lq = 5, lk = 40, d = 8, block = 16;
  const RowMatrixXd q = random_matrix(lq, d, 1.0, g), k = random_matrix(lk, d, 1.0, g);
  RowMatrixXd v = random_matrix(lk, 6, 1.0, g);
  v.middleRows(16, 16) *= 20;  // one block of large values: its own V scale
  const AttentionResult r = run("intattention:k-group=16,v-group=key-block", q, k, v);
  for (Eigen::Index i = 0; i < lq; ++i)
    for (Eigen::Index c = 0; c < v.cols(); ++c) {
      double acc = 0;
      for (Eigen::Index j0 = 0; j0 < lk; j0 += block) {
        const Eigen::Index n = std::min(block, lk - j0);
        const double s = v.middleRows(j0, n).cwiseAbs().maxCoeff() / 127;
        long pv = 0;
        for (Eigen::Index j = j0; j < j0 + n; ++j) pv += long{r.p_int(i, j)} * std::lrint(v(j, c) / s);
        acc += static_cast<double>(pv) * s;
      }
      CHECK(r.o(i, c) == static_cast<double>(static_cast<float>(acc / 255)));
    }
}
