// FlashAttention-4's FP8 forward (fa4-fp8): the flash loop's run of the description equals an independent loop of the
// steps docs/pipelines/fa4-fp8.md lists, bit for bit, with S and P V through mma_dot of b200-tcgen05-e4m3; the
// software exp2's properties (exact at integers, 2^n scaling, its polynomial's error); the rescale threshold's and
// the emulation's effect on O.
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
#include "qattn/reference/fa4_fp8.h"
#include "qattn/reference/flash_kernel.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "support/matrix_stats.h"
#include "support/random_matrix.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::random_matrix;

namespace {

std::uint16_t e4m3_code(float x) { return static_cast<std::uint16_t>(lowp_encode(x, fp8_e4m3fn())); }

struct LoopCounts {
  int kept = 0, moved = 0, emulated = 0;
};

// O (float32, before the bf16 store) of fa4-fp8 with threshold t and emulation frequency F, row i, written from the
// documented steps with per-tensor E4M3 descales, mma_dot for S (d in one call, steps of 32) and for P V (32 keys per
// call, the last chunk padded with zeros).
std::vector<float> loop_o(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, double scale, int i,
                          double t, int freq, LoopCounts& counts) {
  const MmaModel& unit = mma_preset("b200-tcgen05-e4m3");
  const Eigen::Index lk = k.rows(), d = q.cols(), dv = v.cols();
  auto descale = [](const RowMatrixXd& x) { return static_cast<float>(x.cwiseAbs().maxCoeff()) / 448.0f; };
  const float qd = descale(q), kd = descale(k), vd = descale(v);
  auto code = [](double x, float ds) {
    return e4m3_code(lowp_round(static_cast<float>(x) / ds, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate));
  };
  std::vector<std::uint16_t> qc(static_cast<std::size_t>(d));
  for (Eigen::Index c = 0; c < d; ++c) qc[static_cast<std::size_t>(c)] = code(q(i, c), qd);
  std::vector<float> s(static_cast<std::size_t>(lk));
  for (Eigen::Index j = 0; j < lk; ++j) {
    std::vector<std::uint16_t> kc(static_cast<std::size_t>(d));
    for (Eigen::Index c = 0; c < d; ++c) kc[static_cast<std::size_t>(c)] = code(k(j, c), kd);
    s[static_cast<std::size_t>(j)] = mma_dot(unit, qc, kc, 0.0f);
  }
  const float s2 = (static_cast<float>(scale) * static_cast<float>(std::numbers::log2e)) * (qd * kd);
  std::vector<float> o(static_cast<std::size_t>(dv), 0.0f);
  float m = -INFINITY, l = 0;
  const Eigen::Index blocks = (lk + 127) / 128;
  for (Eigen::Index b = blocks - 1; b >= 0; --b) {
    const Eigen::Index b0 = b * 128, b1 = std::min(lk, b0 + 128);
    float mn = m;
    for (Eigen::Index j = b0; j < b1; ++j) mn = std::max(mn, s[static_cast<std::size_t>(j)]);
    float r = 0;
    if (m != -INFINITY) {
      if ((mn - m) * s2 <= static_cast<float>(t)) {
        if (mn != m) ++counts.kept;
        mn = m;
      } else {
        ++counts.moved;
      }
      r = mn == m ? 1.0f : static_cast<float>(std::exp2(static_cast<double>((m - mn) * s2)));
    }
    const float bias = -(mn * s2 - 8.0f);
    std::vector<float> p;
    for (Eigen::Index j = b0; j < b1; ++j) {
      const float x = std::fma(s[static_cast<std::size_t>(j)], s2, bias);
      const Eigen::Index fragment = (j - b0) / 32, pair = (j - b0) % 32 / 2 * 2;
      const bool emulate = freq > 0 && b1 - b0 == 128 && fragment >= 1 && fragment < 3 && pair % freq >= freq - 4;
      counts.emulated += emulate;
      p.push_back(emulate ? fa4_ex2_emulation(x) : static_cast<float>(std::exp2(static_cast<double>(x))));
    }
    std::array<float, 8> lane{};
    lane[0] = l * r;
    for (std::size_t j = 0; j < p.size(); ++j) lane[j % 8] += p[j];
    l = ((lane[0] + lane[2]) + (lane[4] + lane[6])) + ((lane[1] + lane[3]) + (lane[5] + lane[7]));
    std::vector<std::uint16_t> pc;
    for (float x : p) pc.push_back(e4m3_code(lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate)));
    pc.resize((pc.size() + 31) / 32 * 32, 0);
    for (Eigen::Index c = 0; c < dv; ++c) {
      std::vector<std::uint16_t> vc(pc.size(), 0);
      for (Eigen::Index j = b0; j < b1; ++j) vc[static_cast<std::size_t>(j - b0)] = code(v(j, c), vd);
      float acc = o[static_cast<std::size_t>(c)] * r;
      for (std::size_t s0 = 0; s0 < pc.size(); s0 += 32)
        acc = mma_dot(unit, std::span(pc).subspan(s0, 32), std::span(vc).subspan(s0, 32), acc);
      o[static_cast<std::size_t>(c)] = acc;
    }
    m = mn;
  }
  const float os = (1.0f / l) * vd;
  for (float& x : o) x *= os;
  return o;
}

}  // namespace

TEST_CASE("fa4-fp8 equals a loop of its documented steps through b200-tcgen05-e4m3, bit for bit", "[fa4]") {
  std::mt19937_64 g(44);
  const RowMatrixXd q = random_matrix(4, 64, 0, 1, g), v = random_matrix(300, 6, 0.2, 1, g);
  RowMatrixXd k = random_matrix(300, 64, 0, 1, g);
  k.topRows(128) *= 2.5;  // the first block (visited last) raises some maxima well past the threshold
  const double scale = 0.125;
  for (const auto& [t, freq] : {std::pair{4.0, 10}, std::pair{0.0, 16}, std::pair{4.0, 0}}) {
    Fa4Fp8Params p;
    p.output_bf16 = false;
    p.rescale_threshold = t;
    p.ex2_emu_freq = freq;
    const AttentionResult r = flash_attention(q, k, v, scale, {}, fa4_fp8_kernel(p));
    LoopCounts counts;
    for (int i = 0; i < 4; ++i) {
      const std::vector<float> o = loop_o(q, k, v, scale, i, t, freq, counts);
      for (int c = 0; c < 6; ++c) {
        INFO("threshold " << t << ", freq " << freq << ", row " << i << ", column " << c);
        CHECK(std::bit_cast<std::uint32_t>(static_cast<float>(r.o(i, c))) == std::bit_cast<std::uint32_t>(o[static_cast<std::size_t>(c)]));
      }
    }
    INFO("threshold " << t << ", freq " << freq);
    CHECK(counts.moved > 0);
    if (t > 0) CHECK(counts.kept > 0);  // both branches of the threshold ran
    CHECK((counts.emulated > 0) == (freq > 0));
  }
}

TEST_CASE("fa4-fp8: the bf16 store, the H100 units and the emulation each change O", "[fa4]") {
  std::mt19937_64 g(45);
  const RowMatrixXd q = random_matrix(32, 128, 0, 1, g), k = random_matrix(512, 128, 0, 1, g),
                    v = random_matrix(512, 64, 0, 1, g);
  Fa4Fp8Params p;
  p.output_bf16 = false;
  const RowMatrixXd o32 = flash_attention(q, k, v, 0.088, {}, fa4_fp8_kernel(p)).o;
  const RowMatrixXd o16 = flash_attention(q, k, v, 0.088, {}, fa4_fp8_kernel(Fa4Fp8Params{})).o;
  for (Eigen::Index i = 0; i < o32.size(); ++i) REQUIRE(o16.data()[i] == round_to_bfloat16(o32.data()[i]));
  Fa4Fp8Params h = p;
  h.units = Fa4Units::h100;
  CHECK(flash_attention(q, k, v, 0.088, {}, fa4_fp8_kernel(h)).o != o32);  // Hopper's 13 fraction bits reach O
  Fa4Fp8Params hw = p;
  hw.ex2_emu_freq = 0;
  const RowMatrixXd exact = flash_attention(q, k, v, 0.088, {}, fa4_fp8_kernel(hw)).o;
  CHECK(exact != o32);
  // The polynomial's error (below 2^-13) is far inside E4M3's rounding of P: O moves by little
  const RowMatrixXd ref = float_attention(q, k, v, 0.088, FloatPrecision::fp64).o;
  auto cossim = [&](const RowMatrixXd& o) { return test::matrix_stats(o, ref).cossim; };
  CHECK(std::fabs(cossim(exact) - cossim(o32)) < 1e-4);
  // The kept max lets P~ reach 2^(8 + 4) against E4M3's 448 (experiment fa4-p-saturation): without the threshold
  // O is FP8-accurate, with it O loses to the saturation
  Fa4Fp8Params z = p;
  z.rescale_threshold = 0;
  const double no_threshold = cossim(flash_attention(q, k, v, 0.088, {}, fa4_fp8_kernel(z)).o);
  INFO("O CosSim: threshold 4 " << cossim(o32) << ", threshold 0 " << no_threshold);
  CHECK(no_threshold > 0.998);
  CHECK(1 - cossim(o32) > 5 * (1 - no_threshold));
}

TEST_CASE("fa4_ex2_emulation: exact at integers, scales by 2^n, within 9e-5 of 2^x", "[fa4]") {
  for (int n = -126; n <= 30; ++n) REQUIRE(fa4_ex2_emulation(static_cast<float>(n)) == std::ldexp(1.0f, n));
  CHECK(fa4_ex2_emulation(-127.0f) == 0.0f);       // a zero exponent field reads 0 (.ftz)
  CHECK(fa4_ex2_emulation(-1000.0f) == 0.0f);      // clamped at -127
  CHECK(fa4_ex2_emulation(127.0f) == 0x1p127f);
  CHECK(std::isinf(fa4_ex2_emulation(127.5f)));     // beyond FA4's domain: +inf, not a wrapped exponent
  CHECK(fa4_ex2_emulation(std::nanf("")) == 0.0f);  // max(NaN, -127) is -127
  CHECK(fa4_ex2_emulation(0x1p-130f) == 1.0f);     // a subnormal x reads 0
  CHECK(fa4_ex2_emulation(-0x1p-130f) == 1.0f);
  std::mt19937_64 g(46);
  std::uniform_real_distribution<float> frac(0.0f, 1.0f);
  double worst = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    const float f = frac(g);
    const float y = fa4_ex2_emulation(f);
    for (int n : {-100, -7, 3, 11}) {
      const float x = f + static_cast<float>(n);
      if (x - static_cast<float>(n) == f) REQUIRE(fa4_ex2_emulation(x) == std::ldexp(y, n));  // x holds f exactly
    }
    worst = std::max(worst, std::fabs(y / std::exp2(static_cast<double>(f)) - 1));
  }
  INFO("worst relative error on [0, 1): " << worst);
  CHECK(worst < 9e-5);   // fpminimax's degree 3: about 8.8e-5
  CHECK(worst > 5e-5);   // and not a better approximation than the polynomial is
}
