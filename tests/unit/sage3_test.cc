// SageAttention3 (sage3): the block-scaled FP4 step equals mma_dot of b200-nvf4; the flash loop's run of the
// description equals an independent loop of the steps docs/pipelines/sage3.md lists, bit for bit, through mma_dot and
// lowp_encode_f32's conversions, ties of E2M1 and masked blocks included; FP4's cost against FP8.
#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numbers>
#include <random>
#include <span>
#include <vector>

#include "qattn/float_format.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/lowp_convert.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/sage3.h"
#include "support/matrix_stats.h"
#include "support/random_matrix.h"
#include "support/test_scale.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::random_matrix;

namespace {

std::uint8_t e2m1(float x) { return lowp_encode_f32(x, LowpCode::e2m1, LowpCodeRounding::rn, true); }
std::uint8_t ue4m3(float x) { return lowp_encode_f32(x, LowpCode::ue4m3, LowpCodeRounding::rn, true); }
float ue4m3_value(std::uint8_t c) { return static_cast<float>(lowp_decode_code(c, LowpCode::ue4m3)); }

// NVFP4 codes of n values (a block of 16 at most): SF = E4M3(fl32(amax / 6)), codes E2M1(fl32(x fl32(1 / SF))).
std::uint8_t quantize_block(const std::vector<float>& x, std::vector<std::uint16_t>& codes) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const std::uint8_t sc = ue4m3(amax / 6.0f);
  const float sf = ue4m3_value(sc), inv = sf == 0 ? 0.0f : 1.0f / sf;
  for (float v : x) codes.push_back(e2m1(v * inv));
  return sc;
}

// O (float32) of sage3 for row i, from the documented steps; mx: Q and K through mx_quantize (OCP MX, E2M1 per 32)
// and S on b200-mxf4.
std::vector<float> loop_o(const RowMatrixXd& q_in, const RowMatrixXd& k_in, const RowMatrixXd& v, double scale, int i,
                          bool mx = false) {
  const MmaModel& unit = mma_preset("b200-nvf4");
  const MmaModel& s_unit = mma_preset(mx ? "b200-mxf4" : "b200-nvf4");
  const Eigen::Index lq = q_in.rows(), lk = k_in.rows(), d = q_in.cols(), dv = v.cols();
  RowMatrixXd k = k_in;
  k.rowwise() -= Eigen::RowVectorXd(k_in.colwise().mean());
  const Eigen::Index b0q = i / 128 * 128, nq = std::min<Eigen::Index>(128, lq - b0q);
  const Eigen::RowVectorXd mean = q_in.middleRows(b0q, nq).colwise().mean();
  const Eigen::RowVectorXd q = q_in.row(i) - mean;
  auto codes_of = [&](const Eigen::RowVectorXd& x, std::vector<std::uint16_t>& c, std::vector<std::uint8_t>& s) {
    if (mx) {
      std::vector<float> xf(static_cast<std::size_t>(d));
      for (Eigen::Index t = 0; t < d; ++t) xf[static_cast<std::size_t>(t)] = static_cast<float>(x(t));
      const MxQuantized m = mx_quantize(xf, 1, static_cast<std::size_t>(d), LowpCode::e2m1, 32);
      c.assign(m.codes.begin(), m.codes.end());
      s = m.scales;
      return;
    }
    for (Eigen::Index g = 0; g < d; g += 16) {
      std::vector<float> blk;
      for (Eigen::Index t = g; t < g + 16; ++t) blk.push_back(static_cast<float>(x(t)));
      s.push_back(quantize_block(blk, c));
    }
  };
  std::vector<std::uint16_t> qc;
  std::vector<std::uint8_t> qs;
  codes_of(q, qc, qs);
  std::vector<float> s(static_cast<std::size_t>(lk));
  for (Eigen::Index j = 0; j < lk; ++j) {
    std::vector<std::uint16_t> kc;
    std::vector<std::uint8_t> ks;
    codes_of(k.row(j), kc, ks);
    s[static_cast<std::size_t>(j)] = mma_dot(s_unit, qc, kc, static_cast<float>(mean.dot(k.row(j))), qs, ks);
  }
  // V: codes per 16 keys of each channel, transposed
  std::vector<std::vector<std::uint16_t>> vc(static_cast<std::size_t>(dv));
  std::vector<std::vector<std::uint8_t>> vs(static_cast<std::size_t>(dv));
  for (Eigen::Index c = 0; c < dv; ++c)
    for (Eigen::Index g = 0; g < lk; g += 16) {
      std::vector<float> blk;
      for (Eigen::Index j = g; j < std::min(lk, g + 16); ++j) blk.push_back(static_cast<float>(v(j, c)));
      vs[static_cast<std::size_t>(c)].push_back(quantize_block(blk, vc[static_cast<std::size_t>(c)]));
    }
  const float cl2 = static_cast<float>(static_cast<double>(static_cast<float>(scale)) * std::numbers::log2e);
  const float top = static_cast<float>(11.392317422778762), sixth = -2.584962500721156f;
  auto ex2 = [](float x) { return static_cast<float>(std::exp2(static_cast<double>(x))); };
  std::vector<float> o(static_cast<std::size_t>(dv), 0.0f);
  std::array<float, 4> l{};
  float m = -INFINITY;
  for (Eigen::Index b0 = (lk - 1) / 128 * 128; b0 >= 0; b0 -= 128) {
    const Eigen::Index b1 = std::min(lk, b0 + 128);
    float mn = m;
    for (Eigen::Index j = b0; j < b1; ++j) mn = std::max(mn, s[static_cast<std::size_t>(j)]);
    const float max_scaled = std::fma(mn, cl2, -top);
    const float r = m == -INFINITY ? 0.0f : ex2((m - mn) * cl2);
    std::vector<float> p;
    for (Eigen::Index j = b0; j < b1; ++j) p.push_back(ex2(std::fma(s[static_cast<std::size_t>(j)], cl2, -max_scaled)));
    for (float& x : l) x *= r;
    for (std::size_t j = 0; j < p.size(); ++j) l[j % 32 / 8] += p[j];
    std::vector<std::uint16_t> pc;
    std::vector<std::uint8_t> ps;
    for (std::size_t g = 0; g < p.size(); g += 16) {
      float bmax = -INFINITY;
      for (std::size_t j = g; j < std::min(p.size(), g + 16); ++j) bmax = std::max(bmax, s[static_cast<std::size_t>(b0) + j]);
      const float sc = ex2(std::fma(bmax, cl2, -max_scaled) + sixth);
      ps.push_back(ue4m3(sc));
      for (std::size_t j = g; j < g + 16; ++j) pc.push_back(j < p.size() ? e2m1(p[j] / sc) : 0);
    }
    for (Eigen::Index c = 0; c < dv; ++c) {
      float acc = 0;
      for (std::size_t s0 = 0; s0 < pc.size(); s0 += 64) {  // 64 keys per step, absent groups zero with scale 0
        std::array<std::uint16_t, 64> a{}, b{};
        std::array<std::uint8_t, 4> sa{}, sb{};
        for (std::size_t j = s0; j < std::min(pc.size(), s0 + 64); ++j) {
          a[j - s0] = pc[j];
          const std::size_t key = static_cast<std::size_t>(b0) + j;
          b[j - s0] = key < static_cast<std::size_t>(lk) ? vc[static_cast<std::size_t>(c)][key] : 0;
        }
        for (std::size_t g = s0 / 16; g < std::min(ps.size(), s0 / 16 + 4); ++g)
          sa[g - s0 / 16] = ps[g], sb[g - s0 / 16] = vs[static_cast<std::size_t>(c)][static_cast<std::size_t>(b0) / 16 + g];
        acc = mma_dot(unit, a, b, acc, sa, sb);
      }
      o[static_cast<std::size_t>(c)] = std::fma(o[static_cast<std::size_t>(c)], r, acc);
    }
    m = mn;
  }
  const float inv = 1.0f / ((l[0] + l[1]) + (l[2] + l[3]));
  for (float& x : o) x *= inv;
  return o;
}

}  // namespace

TEST_CASE("scaled_group_step is mma_dot of b200-nvf4 and b200-mxf4, output by output", "[sage3][mma]") {
  std::mt19937_64 g(71);
  const int trials = qattn::test::scaled(3000, 50);
  qattn::test::announce_scale("scaled_group_step against mma_dot, per preset", trials);
  for (const char* preset : {"b200-nvf4", "b200-mxf4"}) {
    const MmaModel& model = mma_preset(preset);
    const std::size_t block = static_cast<std::size_t>(model.scale_block);
    for (int trial = 0; trial < trials; ++trial) {
      const std::size_t cols = 1 + g() % 40;
      std::vector<std::uint16_t> a(64);
      std::vector<std::uint8_t> sa(64 / block);
      for (auto& x : a) x = static_cast<std::uint16_t>(g() % 16);
      // scales: zero, subnormal, and spread over a wide range (a scale 2^30 below another truncates whole groups)
      // UE8M0 at the ends of its range in one trial of 4: results below float32's normals (truncated toward zero)
      // and beyond its largest value (the largest float, as IEEE RZ)
      const int extreme = model.scale == MmaScale::ue8m0 && trial % 4 == 3 ? (trial % 8 == 3 ? -1 : 1) : 0;
      auto scale_code = [&](bool a_side) -> std::uint8_t {
        if (model.scale == MmaScale::ue4m3) return static_cast<std::uint8_t>(g() % 8 == 0 ? 0 : g() % 0x7f);
        if (extreme != 0 && a_side) return static_cast<std::uint8_t>(extreme < 0 ? g() % 6 : 249 + g() % 6);
        if (extreme != 0) return static_cast<std::uint8_t>(122 + g() % 12);  // b near 1: the product at the end
        return static_cast<std::uint8_t>(g() % 8 == 0 ? 127 - 40 + g() % 80 : 127 - 3 + g() % 7);
      };
      for (auto& x : sa) x = scale_code(true);
      std::vector<std::vector<std::uint16_t>> b(cols, std::vector<std::uint16_t>(64));
      std::vector<std::vector<std::uint8_t>> sb(cols, std::vector<std::uint8_t>(64 / block));
      std::vector<float> acc(cols), fast(cols);
      for (std::size_t c = 0; c < cols; ++c) {
        for (auto& x : b[c]) x = static_cast<std::uint16_t>(g() % 16);
        for (auto& x : sb[c]) x = scale_code(false);
        acc[c] = g() % 4 == 0 || extreme != 0
                     ? 0.0f
                     : std::ldexp(static_cast<float>((g() % 8388608) + 8388608) * (g() % 2 ? 1 : -1),
                                  static_cast<int>(g() % 60) - 50);
      }
      std::vector<double> term(4 * cols);
      std::vector<std::int32_t> term_e(4 * cols);
      for (std::size_t grp = 0; grp < 4; ++grp)
        for (std::size_t c = 0; c < cols; ++c) {
          double sum = 0;
          for (std::size_t j = grp * 16; j < grp * 16 + 16; ++j)
            sum += lowp_decode_code(static_cast<std::uint8_t>(a[j]), LowpCode::e2m1) *
                   lowp_decode_code(static_cast<std::uint8_t>(b[c][j]), LowpCode::e2m1);
          const double s_a = mma_scale_value(model.scale, sa[grp * 16 / block]);
          const double s_b = mma_scale_value(model.scale, sb[c][grp * 16 / block]);
          term[grp * cols + c] = sum * s_a * s_b;
          term_e[grp * cols + c] = s_a == 0 || s_b == 0 ? -126 : std::ilogb(s_a) + std::ilogb(s_b);
        }
      fast = acc;
      scaled_group_step(fast.data(), term.data(), term_e.data(), 4, cols, cols);
      for (std::size_t c = 0; c < cols; ++c) {
        INFO(preset << ", trial " << trial << ", column " << c << ", acc " << acc[c]);
        REQUIRE(std::bit_cast<std::uint32_t>(fast[c]) ==
                std::bit_cast<std::uint32_t>(mma_dot(model, a, b[c], acc[c], sa, sb[c])));
      }
    }
  }
}

TEST_CASE("sage3 equals a loop of its documented steps through b200-nvf4, bit for bit", "[sage3]") {
  std::mt19937_64 g(72);
  // L_q = 200 (a partial block of Q means), L_k = 300 (a partial key block, a partial group of 16), d = 32
  RowMatrixXd q = random_matrix(200, 32, 0.3, 1, g), k = random_matrix(300, 32, 0.5, 1, g),
              v = random_matrix(300, 5, 0.2, 1, g);
  k.topRows(128) *= 1.7;
  // E2M1's ties: a block whose amax is 6 (scale 1) holds every midpoint, both signs
  const double ties[] = {6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 0};
  for (int c = 0; c < 16; ++c) q(7, c) = ties[c], v(40 + c, 2) = ties[c];
  Sage3Params p;
  p.output_bf16 = false;
  const AttentionResult r = flash_attention(q, k, v, 0.17, {}, sage3_kernel(p));
  for (int i : {0, 7, 127, 128, 199}) {
    const std::vector<float> o = loop_o(q, k, v, 0.17, i);
    for (int c = 0; c < 5; ++c) {
      INFO("row " << i << ", column " << c);
      CHECK(std::bit_cast<std::uint32_t>(static_cast<float>(r.o(i, c))) == std::bit_cast<std::uint32_t>(o[static_cast<std::size_t>(c)]));
    }
  }
  // Q and K in MXFP4 (qk=mxfp4): mx_quantize's codes and b200-mxf4 for S, the rest as sage3
  p.qk_mxfp4 = true;
  const AttentionResult rmx = flash_attention(q, k, v, 0.17, {}, sage3_kernel(p));
  for (int i : {0, 7, 199}) {
    const std::vector<float> o = loop_o(q, k, v, 0.17, i, true);
    for (int c = 0; c < 5; ++c) {
      INFO("qk=mxfp4, row " << i << ", column " << c);
      CHECK(std::bit_cast<std::uint32_t>(static_cast<float>(rmx.o(i, c))) == std::bit_cast<std::uint32_t>(o[static_cast<std::size_t>(c)]));
    }
  }
  CHECK(rmx.o != r.o);
  // bf16 stores the float32 O rounded
  const AttentionResult r16 = flash_attention(q, k, v, 0.17, {}, sage3_kernel(Sage3Params{}));
  for (Eigen::Index t = 0; t < r.o.size(); ++t) REQUIRE(r16.o.data()[t] == round_to_bfloat16(r.o.data()[t]));
}

TEST_CASE("sage3 with a causal mask: fully masked blocks of 16 enter with scale 0, and FP4 costs more than FP8", "[sage3]") {
  std::mt19937_64 g(73);
  const RowMatrixXd q = random_matrix(256, 64, 0, 1, g), k = random_matrix(256, 64, 0, 1, g),
                    v = random_matrix(256, 64, 0, 1, g);
  const double scale = 0.125;
  const RowMatrixXd ref = float_attention(q, k, v, scale, FloatPrecision::fp64).o;
  auto cossim = [&](const RowMatrixXd& o) { return test::matrix_stats(o, ref).cossim; };
  const auto sage3 = reference_registry().create("sage3:out=fp32");
  const auto fa3 = reference_registry().create("fa3-fp8:out=fp32");
  const double c3 = cossim(sage3->attention(q, k, v, scale, {}).o), c8 = cossim(fa3->attention(q, k, v, scale, {}).o);
  INFO("O CosSim: sage3 " << c3 << ", fa3-fp8 " << c8);
  CHECK(c3 > 0.97);  // N(0, 1) heads: no outliers for the smoothing to take out
  CHECK(1 - c3 > 2 * (1 - c8));  // E2M1 keeps 2 significant bits against E4M3's 4
  AttentionMask mask;
  mask.causal = true;
  const AttentionResult causal = sage3->attention(q, k, v, scale, mask);
  CHECK(causal.o.allFinite());
  CHECK(causal.p(0, 1) == 0);  // a masked key has no weight
  CHECK(causal.p(0, 0) > 0.99);
}
