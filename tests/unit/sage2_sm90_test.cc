// sage2@sm90 (kernel=sm90): the official Hopper kernel's arithmetic as docs/pipelines/sage2.md states it, written
// out one output at a time (the groups, the float32 quantiser, s2 per group pair, the max of fma(S, s2, -8.807), the
// mma row-sum layout, E4M3 P and V, P V on the H100 FP8 wgmma per 128 keys, O times 1 / l then the V scale), equals
// the flash loop's description of it bit for bit.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <random>
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

// Per-thread INT8 codes (Triton quant_per_thread.py), float32: scale max|x| / 127 + 1e-7 per group, half away.
std::vector<std::vector<int>> sm90_quantise(const RowMatrixXd& x, bool query, std::vector<float>& scale, std::vector<int>& group) {
  const int n = static_cast<int>(x.rows()), d = static_cast<int>(x.cols());
  group.resize(n);
  int groups = 0;
  for (int t = 0; t < n; ++t) {
    group[t] = query ? (t / 16) * 8 + t % 8 : (t / 128) * 4 + (t % 8) / 2;  // WARPQ 16, WARPK 128
    groups = std::max(groups, group[t] + 1);
  }
  std::vector<float> amax(groups, 0.0f);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) amax[group[t]] = std::max(amax[group[t]], std::fabs(static_cast<float>(x(t, c))));
  scale.resize(groups);
  for (int g = 0; g < groups; ++g) scale[g] = amax[g] / 127.0f + 1e-7f;
  std::vector<std::vector<int>> codes(n, std::vector<int>(d));
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      const float y = static_cast<float>(x(t, c)) / scale[group[t]];
      codes[t][c] = static_cast<int>(std::trunc(y + (y >= 0 ? 0.5f : -0.5f)));
    }
  return codes;
}

// Output (i, c) of sage2@sm90 on q, k, v (causal: bottom-right), before the fp16 store.
float sm90_loop_o(const RowMatrixXd& q, const RowMatrixXd& k_in, const RowMatrixXd& v, double scale, bool causal, int i,
                  int c) {
  const int lq = static_cast<int>(q.rows()), lk = static_cast<int>(k_in.rows()), d = static_cast<int>(q.cols());
  RowMatrixXd k = k_in;
  k.rowwise() -= k_in.colwise().mean();
  std::vector<float> sq, sk;
  std::vector<int> gq, gk;
  const auto qc = sm90_quantise(q, true, sq, gq), kc = sm90_quantise(k, false, sk, gk);
  const float sm_scale = static_cast<float>(scale) * 1.44269504088896340736f;
  const auto sees = [&](int j) { return !causal || j <= i + lk - lq; };
  std::vector<float> s(lk), s2(lk);
  for (int j = 0; j < lk; ++j) {
    int a = 0;
    for (int t = 0; t < d; ++t) a += qc[i][t] * kc[j][t];
    s[j] = static_cast<float>(a);
    s2[j] = sm_scale * (sq[gq[i]] * sk[gk[j]]);
  }
  // V channel c: v_scale = amax / 448, v8 = E4M3(v (448 / amax)), float32
  float amax = 0;
  for (int j = 0; j < lk; ++j) amax = std::max(amax, std::fabs(static_cast<float>(v(j, c))));
  const float v_scale = amax / 448.0f, recip = 448.0f / amax;
  const MmaModel& wgmma = mma_preset("h100-wgmma-e4m3");
  float m = -INFINITY, o = 0;
  std::array<float, 4> l{};
  for (int k0 = 0; k0 < lk; k0 += 128) {
    const int k1 = std::min(lk, k0 + 128);
    float m_new = m;
    for (int j = k0; j < k1; ++j)
      if (sees(j)) m_new = std::max(m_new, std::fma(s[j], s2[j], -8.807f));
    if (m_new == -INFINITY) continue;
    const float r = m == -INFINITY ? 0.0f : sm90_exp2(m - m_new);
    for (float& x : l) x *= r;
    std::vector<float> p(128, 0.0f);  // the block's P~, zero past its end
    for (int j = k0; j < k1; ++j) p[j - k0] = sees(j) ? sm90_exp2(std::fma(s[j], s2[j], -m_new)) : 0.0f;
    for (int j0 = 0; j0 < 128; j0 += 16)
      for (int t = 0; t < 4; ++t) l[t] += ((p[j0 + 2 * t] + p[j0 + 2 * t + 1]) + p[j0 + 8 + 2 * t]) + p[j0 + 9 + 2 * t];
    std::vector<std::uint16_t> pc, vc;
    for (int j = k0; j < k1; ++j)
      pc.push_back(sm90_e4m3_code(p[j - k0])), vc.push_back(sm90_e4m3_code(static_cast<float>(v(j, c)) * recip));
    o = o * r + mma_dot(wgmma, pc, vc, 0.0f);  // a fresh accumulator per 128 keys, promoted to float32
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
