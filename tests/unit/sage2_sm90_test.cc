// sage2@sm90 and sage2@sm89 (kernel=sm90 / sm89): the official Hopper and Ada kernels' arithmetic as
// docs/pipelines/sage2.md states it, written out one output at a time (the groups, the float32 quantiser, s2 per
// group pair, the max of fma(S, s2, -8.807), the mma row-sum layout, E4M3 P and V, P V on the H100 FP8 wgmma per 128
// keys or on Ada's FP8 mma.sync per 64 keys into an f16 accumulator (V scaled to 2.25) or an f32 buffer, O times
// 1 / l then the V scale), equals the flash loop's description of it bit for bit.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "qattn/float_format.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/registry.h"
#include "support/random_matrix.h"

using namespace qattn;
using namespace qattn::ref;

namespace {

std::uint16_t sm90_e4m3_code(float x) { return static_cast<std::uint16_t>(lowp_encode(e4m3_round_saturate(x), fp8_e4m3fn())); }
float sm90_exp2(float x) { return static_cast<float>(std::exp2(static_cast<double>(x))); }

// One official kernel: its warps' groups, key block, P V unit and V's range.
struct Official {
  int warp_q, warp_k, block;
  int qmax;           // 127 (INT8) or 7 (the sm89 template's INT4 branch)
  const char* unit;   // the MMA preset of P V
  bool single;        // one accumulator onto the rescaled output (sm89's pv_accum_dtype fp32)
  float v_max;        // 448, or 2.25 (sm89's fp32+fp16)
};
constexpr Official kSm90{16, 128, 128, 127, "h100-wgmma-e4m3", false, 448.0f};

// Per-thread codes (Triton quant_per_thread.py), float32: scale max|x| / qmax + 1e-7 per group, half away.
std::vector<std::vector<int>> sm90_quantise(const RowMatrixXd& x, bool query, std::vector<float>& scale, std::vector<int>& group,
                                            const Official& k = kSm90) {
  const int n = static_cast<int>(x.rows()), d = static_cast<int>(x.cols());
  group.resize(n);
  int groups = 0;
  for (int t = 0; t < n; ++t) {
    group[t] = query ? (t / k.warp_q) * 8 + t % 8 : (t / k.warp_k) * 4 + (t % 8) / 2;
    groups = std::max(groups, group[t] + 1);
  }
  std::vector<float> amax(groups, 0.0f);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) amax[group[t]] = std::max(amax[group[t]], std::fabs(static_cast<float>(x(t, c))));
  scale.resize(groups);
  for (int g = 0; g < groups; ++g) scale[g] = amax[g] / static_cast<float>(k.qmax) + 1e-7f;
  std::vector<std::vector<int>> codes(n, std::vector<int>(d));
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      const float y = static_cast<float>(x(t, c)) / scale[group[t]];
      codes[t][c] = static_cast<int>(std::trunc(y + (y >= 0 ? 0.5f : -0.5f)));
    }
  return codes;
}

// Output (i, c) of the official kernel on q, k, v (causal: bottom-right), before the fp16 store.
float sm90_loop_o(const RowMatrixXd& q, const RowMatrixXd& k_in, const RowMatrixXd& v, double scale, bool causal, int i,
                  int c, const Official& kernel = kSm90) {
  const int lq = static_cast<int>(q.rows()), lk = static_cast<int>(k_in.rows()), d = static_cast<int>(q.cols());
  RowMatrixXd k = k_in;
  k.rowwise() -= k_in.colwise().mean();
  std::vector<float> sq, sk;
  std::vector<int> gq, gk;
  const auto qc = sm90_quantise(q, true, sq, gq, kernel), kc = sm90_quantise(k, false, sk, gk, kernel);
  const float sm_scale = static_cast<float>(scale) * 1.44269504088896340736f;
  const auto sees = [&](int j) { return !causal || j <= i + lk - lq; };
  std::vector<float> s(lk), s2(lk);
  for (int j = 0; j < lk; ++j) {
    int a = 0;
    for (int t = 0; t < d; ++t) a += qc[i][t] * kc[j][t];
    s[j] = static_cast<float>(a);
    s2[j] = sm_scale * (sq[gq[i]] * sk[gk[j]]);
  }
  // V channel c: v_scale = amax / max, v8 = E4M3(v (max / amax)), float32
  float amax = 0;
  for (int j = 0; j < lk; ++j) amax = std::max(amax, std::fabs(static_cast<float>(v(j, c))));
  const float v_scale = amax / kernel.v_max, recip = kernel.v_max / amax;
  const MmaModel& unit = mma_preset(kernel.unit);
  const int block = kernel.block;
  float m = -INFINITY, o = 0;
  std::array<float, 4> l{};
  for (int k0 = 0; k0 < lk; k0 += block) {
    const int k1 = std::min(lk, k0 + block);
    float m_new = m;
    for (int j = k0; j < k1; ++j)
      if (sees(j)) m_new = std::max(m_new, std::fma(s[j], s2[j], -8.807f));
    if (m_new == -INFINITY) continue;
    const float r = m == -INFINITY ? 0.0f : sm90_exp2(m - m_new);
    for (float& x : l) x *= r;
    std::vector<float> p(block, 0.0f);  // the block's P~, zero past its end
    for (int j = k0; j < k1; ++j) p[j - k0] = sees(j) ? sm90_exp2(std::fma(s[j], s2[j], -m_new)) : 0.0f;
    for (int j0 = 0; j0 < block; j0 += 16)
      for (int t = 0; t < 4; ++t) l[t] += ((p[j0 + 2 * t] + p[j0 + 2 * t + 1]) + p[j0 + 8 + 2 * t]) + p[j0 + 9 + 2 * t];
    std::vector<std::uint16_t> pc, vc;
    for (int j = k0; j < k1; ++j)
      pc.push_back(sm90_e4m3_code(p[j - k0])), vc.push_back(sm90_e4m3_code(static_cast<float>(v(j, c)) * recip));
    if (kernel.single)
      o = mma_dot(unit, pc, vc, o * r);  // in place onto the rescaled output
    else
      o = o * r + mma_dot(unit, pc, vc, 0.0f);  // a fresh accumulator per block, promoted to float32
    m = m_new;
  }
  const float sum = (l[0] + l[1]) + (l[2] + l[3]);
  return (o * (1.0f / sum)) * v_scale;
}

}  // namespace

TEST_CASE("sage2@sm90 equals a loop formulation of the official Hopper kernel's steps", "[sage2][sm90]") {
  std::mt19937_64 g(90);
  const int l = 300, d = 64;  // three key blocks, the last partial; several Q and K groups
  RowMatrixXd q = test::random_matrix(l, d, 1.0, g), k = test::random_matrix(l, d, 1.0, g), v = test::random_matrix(l, d, 1.0, g);
  k.col(5).array() += 6.0;  // a channel bias for smoothing to remove
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  for (bool causal : {false, true}) {
    AttentionMask mask;
    mask.causal = causal;
    const AttentionResult r = reference_registry().create("sage2@sm90:out=fp32")->attention(q, k, v, scale, mask);
    const AttentionResult r16 = reference_registry().create("sage2@sm90")->attention(q, k, v, scale, mask);
    for (int i : {0, 7, 63, 64, 150, 299})
      for (int c : {0, 5, 33, 63}) {
        INFO("causal " << causal << ", row " << i << ", column " << c);
        const float want = sm90_loop_o(q, k, v, scale, causal, i, c);
        CHECK(r.o(i, c) == want);
        CHECK(r16.o(i, c) == round_to_binary16(want));  // the kernel's output dtype
      }
  }
  // the parts the official code takes are the only ones kernel=sm90 takes
  CHECK_THROWS_WITH(reference_registry().create("sage2@sm90:qk=4"), Catch::Contains("kernel=sm90"));
  CHECK_THROWS_WITH(reference_registry().create("sage2:kernel=sm90,acc=mma"), Catch::Contains("kernel=sm90"));
}

TEST_CASE("sage2@sm89 equals a loop formulation of the official Ada kernel's steps", "[sage2][sm89]") {
  std::mt19937_64 g(89);
  const int l = 200, d = 64;  // four key blocks of 64, the last partial; several Q and K groups
  RowMatrixXd q = test::random_matrix(l, d, 1.0, g), k = test::random_matrix(l, d, 1.0, g), v = test::random_matrix(l, d, 1.0, g);
  k.col(5).array() += 6.0;
  v.col(33).array() *= 40.0;  // a wide channel: its codes still reach 2.25 at most
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  struct Case {
    const char* spec;
    Official kernel;
  };
  const Case cases[] = {
      {"sage2@sm89:out=fp32", {32, 64, 64, 127, "ada-mma-e4m3-acc16", false, 2.25f}},      // fp32+fp16
      {"sage2@sm89:out=fp32,acc=ada", {32, 64, 64, 127, "ada-mma-e4m3", false, 448.0f}},   // fp32+fp32
      {"sage2@sm89:out=fp32,acc=ada-single", {32, 64, 64, 127, "ada-mma-e4m3", true, 448.0f}},  // fp32
      {"sage2@sm89-int4:out=fp32", {32, 64, 64, 7, "ada-mma-e4m3-acc16", false, 2.25f}},
  };
  for (const Case& t : cases)
    for (bool causal : {false, true}) {
      AttentionMask mask;
      mask.causal = causal;
      const AttentionResult r = reference_registry().create(t.spec)->attention(q, k, v, scale, mask);
      for (int i : {0, 7, 63, 64, 150, 199})
        for (int c : {0, 5, 33, 63}) {
          INFO(t.spec << ", causal " << causal << ", row " << i << ", column " << c);
          CHECK(r.o(i, c) == sm90_loop_o(q, k, v, scale, causal, i, c, t.kernel));
        }
    }
  // the f16 accumulator and V's 2.25 are what set @sm89 apart from the f32 buffer: the outputs differ
  AttentionMask none;
  CHECK(reference_registry().create("sage2@sm89")->attention(q, k, v, scale, none).o !=
        reference_registry().create("sage2@sm89:acc=ada")->attention(q, k, v, scale, none).o);
  // the parts the official code takes are the only ones kernel=sm89 takes
  CHECK_THROWS_WITH(reference_registry().create("sage2@sm89:acc=wgmma"), Catch::Contains("kernel=sm89"));
  CHECK_THROWS_WITH(reference_registry().create("sage2@sm89:smooth-q=true"), Catch::Contains("kernel=sm89"));
  CHECK_THROWS_WITH(reference_registry().create("sage2@sm90:acc=ada-f16"), Catch::Contains("kernel=sm90"));
}

TEST_CASE("the old sage2 spellings resolve to the presets named after their kernels, and say so", "[sage2][registry]") {
  std::vector<std::string> said;
  set_preset_alias_notice([&](const std::string& text) { said.push_back(text); });
  const Registry& r = reference_registry();
  for (auto [old, now] : {std::pair{"8b", "sm90"}, {"4b", "sm89-int4"}, {"hadmdattn", "sm89-hadmdattn"},
                          {"smoothattn", "sm89-smoothattn"}}) {
    INFO(old);
    said.clear();
    CHECK(r.canonical(parse_method_spec(std::string("sage2@") + old)) ==
          r.canonical(parse_method_spec(std::string("sage2@") + now)));
    REQUIRE(!said.empty());
    CHECK(said.front().find(std::string("sage2@") + old + " now means sage2@" + now) == 0);
  }
  said.clear();
  CHECK(r.canonical(parse_method_spec("sage2@sm90")) != r.canonical(parse_method_spec("sage2@paper-8b")));
  CHECK(said.empty());  // the new names say nothing
  set_preset_alias_notice(nullptr);
}
