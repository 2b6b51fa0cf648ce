// SageAttention2 reference pipeline: an independent loop formulation (bit for bit), the paper's structural claims
// (K smoothing removes a channel bias; two-level FP22 accumulation beats a single FP22 accumulator on long rows;
// INT4 costs more than INT8), and determinism. Masks are covered for every registered method in
// int_pipelines_test.cc.
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <random>
#include <string>

#include "support/matrix_stats.h"
#include "support/random_matrix.h"
#include "support/test_scale.h"
#include "qattn/reference/flash_kernel.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/sage2.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::matrix_rel_l1;
using qattn::test::random_matrix;

TEST_CASE("sage2 acc=two-level equals a loop formulation of its documented steps", "[sage2]") {
  std::mt19937_64 g(1);
  const RowMatrixXd q = random_matrix(3, 16, 0, 1, g), k = random_matrix(150, 16, 0.5, 1, g), v = random_matrix(150, 4, 0, 1, g);
  Sage2Params p;  // 8b: smooth K, per-thread INT8, E4M3, here with the per-product FP22 bound per 64-key block
  p.accumulation = SageAccumulation::two_level_fp22;
  const double scale = 0.25;
  const AttentionResult r = sage2_attention(q, k, v, scale, {}, p);
  // The same steps, written out: smooth K, quantise, one pass per row over blocks of 64.
  RowMatrixXd ks = k;
  ks.rowwise() -= k.colwise().mean();
  const SageQuantized qq = sage_quantize(q, true, p.granularity, 8, p.rounding), kq = sage_quantize(ks, false, p.granularity, 8, p.rounding);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> s(150);
    for (int j = 0; j < 150; ++j) {
      long a = 0;
      for (int t = 0; t < 16; ++t) a += long{qq.values(i, t)} * kq.values(j, t);
      s[j] = static_cast<float>(a) * static_cast<float>(qq.scales[qq.group[i]] * kq.scales[kq.group[j]] * scale);
    }
    for (int c = 0; c < 4; ++c) {
      const double amax = v.col(c).cwiseAbs().maxCoeff();
      float m = -INFINITY, l = 0, out = 0;
      for (int b0 = 0; b0 < 150; b0 += 64) {
        const int b1 = std::min(150, b0 + 64);
        float mn = m;
        for (int j = b0; j < b1; ++j) mn = std::max(mn, s[j]);
        const float resc = m == -INFINITY ? 0.0f : std::exp(m - mn);
        l *= resc;
        float block = 0;
        for (int j = b0; j < b1; ++j) {
          const float pt = 448.0f * std::exp(s[j] - mn);
          l += pt;
          const double p8 = lowp_round(pt, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate);
          const double v8 = lowp_round(v(j, c) / (amax / 448), fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate);
          block = static_cast<float>(lowp_round(block + p8 * v8, fp22_accumulator(), LowpRounding::rz, LowpOverflow::non_saturating));
        }
        out = out * resc + block;
        m = mn;
      }
      CHECK(r.o(i, c) == static_cast<float>(out * (amax / 448) / l));
    }
  }
}

TEST_CASE("K smoothing removes a per-channel K bias (SageAttention2's motivation)", "[sage2]") {
  std::mt19937_64 g(2);
  const RowMatrixXd q = random_matrix(64, 64, 0, 1, g), v = random_matrix(256, 64, 0, 1, g);
  const RowMatrixXd k0 = random_matrix(256, 64, 0, 1, g);
  Sage2Params on, off;
  off.smooth_k = false;
  double e_on[2], e_off[2];
  int i = 0;
  for (double bias : {0.0, 50.0}) {
    RowMatrixXd k = k0;
    for (int c = 0; c < 64; ++c) k.col(c).array() += bias * std::sin(c);  // channel-wise offsets, as in real K
    const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
    e_on[i] = matrix_rel_l1(sage2_attention(q, k, v, 0.125, {}, on).o, ref);
    e_off[i++] = matrix_rel_l1(sage2_attention(q, k, v, 0.125, {}, off).o, ref);
  }
  INFO("rel L1 with smoothing " << e_on[0] << " / " << e_on[1] << ", without " << e_off[0] << " / " << e_off[1]);
  CHECK(e_on[1] == Approx(e_on[0]).epsilon(0.02));  // smoothing removes the bias: the error does not depend on it
  CHECK(e_on[1] * 3 < e_off[1]);                    // without smoothing the bias eats the INT8 range
}

TEST_CASE("two-level FP22 accumulation beats one FP22 accumulator on long rows", "[sage2]") {
  std::mt19937_64 g(3);
  const RowMatrixXd q = random_matrix(8, 64, 0, 0.3, g), k = random_matrix(8192, 64, 0, 0.3, g);
  const RowMatrixXd v = random_matrix(8192, 16, 1.0, 0.2, g);  // positive values: truncation errors add up
  const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
  Sage2Params p;
  double err[3];
  int i = 0;
  for (SageAccumulation a : {SageAccumulation::fp32, SageAccumulation::two_level_fp22, SageAccumulation::fp22}) {
    p.accumulation = a;
    err[i++] = matrix_rel_l1(sage2_attention(q, k, v, 0.125, {}, p).o, ref);
  }
  INFO("rel L1: fp32 " << err[0] << ", two-level FP22 " << err[1] << ", single FP22 " << err[2]);
  CHECK(err[0] <= err[1]);
  CHECK(err[1] * 2 < err[2]);
}

TEST_CASE("INT4 Q/K costs more than INT8, E5M2 P~ more than E4M3, every variant is deterministic", "[sage2]") {
  std::mt19937_64 g(4);
  const RowMatrixXd q = random_matrix(64, 64, 0, 1, g), k = random_matrix(128, 64, 0, 1, g), v = random_matrix(128, 32, 0, 1, g);
  const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
  const auto m8 = reference_registry().create("sage2@paper-8b"), m4 = reference_registry().create("sage2@paper-4b");
  CHECK(matrix_rel_l1(m8->attention(q, k, v, 0.125, {}).o, ref) * 3 <
        matrix_rel_l1(m4->attention(q, k, v, 0.125, {}).o, ref));
  CHECK(matrix_rel_l1(m8->attention(q, k, v, 0.125, {}).o, ref) <
        matrix_rel_l1(reference_registry().create("sage2:p=e5m2")->attention(q, k, v, 0.125, {}).o, ref));
  for (const char* spec : {"sage2@paper-8b", "sage2@paper-4b", "sage2:p=e5m2", "sage2:p=int8,acc=fp32", "sage2:p=fp16,smooth-v=true"}) {
    const auto m = reference_registry().create(spec);
    CHECK(m->attention(q, k, v, 0.125, {}).o == m->attention(q, k, v, 0.125, {}).o);
  }
}

namespace {

std::uint16_t sage2_e4m3_code(double v) { return static_cast<std::uint16_t>(lowp_encode(v, fp8_e4m3fn())); }

// O of sage2 (8b quantisation, E4M3 P~ and V) written out with the hardware accumulators through the generic MMA
// model (mma_dot on E4M3 codes, 32 keys per instruction), one output column at a time.
float loop_o(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, double scale, int i, int c,
             SageAccumulation acc, const char* mma_unit = "h100-mma-e4m3") {
  const Eigen::Index lk = k.rows(), d = q.cols();
  RowMatrixXd ks = k;
  ks.rowwise() -= k.colwise().mean();
  Sage2Params p;
  const SageQuantized qq = sage_quantize(q, true, p.granularity, 8, p.rounding), kq = sage_quantize(ks, false, p.granularity, 8, p.rounding);
  std::vector<float> s(lk);
  for (Eigen::Index j = 0; j < lk; ++j) {
    long a = 0;
    for (Eigen::Index t = 0; t < d; ++t) a += long{qq.values(i, t)} * kq.values(j, t);
    s[j] = static_cast<float>(a) * static_cast<float>(qq.scales[qq.group[i]] * kq.scales[kq.group[j]] * scale);
  }
  const double amax = v.col(c).cwiseAbs().maxCoeff();
  const MmaModel& wgmma = mma_preset("h100-wgmma-e4m3");
  const MmaModel& mma = mma_preset(mma_unit);
  const Eigen::Index block = acc == SageAccumulation::mma ? 64 : 128;
  float m = -INFINITY, l = 0, out = 0;
  for (Eigen::Index b0 = 0; b0 < lk; b0 += block) {
    const Eigen::Index b1 = std::min(lk, b0 + block);
    float mn = m;
    for (Eigen::Index j = b0; j < b1; ++j) mn = std::max(mn, s[j]);
    const float resc = m == -INFINITY ? 0.0f : std::exp(m - mn);
    l *= resc;
    std::vector<std::uint16_t> pc, vc;
    for (Eigen::Index j = b0; j < b1; ++j) {
      const float pt = 448.0f * std::exp(s[j] - mn);
      l += pt;
      pc.push_back(sage2_e4m3_code(lowp_round(pt, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate)));
      vc.push_back(sage2_e4m3_code(lowp_round(v(j, c) / (amax / 448), fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate)));
    }
    pc.resize((pc.size() + 31) / 32 * 32, 0), vc.resize(pc.size(), 0);  // the last instruction's keys padded with 0
    float buffer = acc == SageAccumulation::wgmma_single ? out * resc : 0.0f;
    for (std::size_t s0 = 0; s0 < pc.size(); s0 += 32)
      buffer = mma_dot(acc == SageAccumulation::mma ? mma : wgmma, std::span(pc).subspan(s0, 32),
                       std::span(vc).subspan(s0, 32), buffer);
    out = acc == SageAccumulation::wgmma_single ? buffer : out * resc + buffer;
    m = mn;
  }
  return static_cast<float>(out * (amax / 448) / l);
}

}  // namespace

TEST_CASE("sage2 acc=wgmma, wgmma-single and mma equal a loop through the generic MMA model", "[sage2][mma]") {
  std::mt19937_64 g(5);
  const RowMatrixXd q = random_matrix(3, 16, 0, 1, g), k = random_matrix(300, 16, 0.5, 1, g), v = random_matrix(300, 5, 0.2, 1, g);
  for (SageAccumulation acc : {SageAccumulation::wgmma, SageAccumulation::wgmma_single, SageAccumulation::mma}) {
    Sage2Params p;
    p.accumulation = acc;
    const AttentionResult r = sage2_attention(q, k, v, 0.25, {}, p);
    for (int i = 0; i < 3; ++i)
      for (int c = 0; c < 5; ++c) {
        INFO("acc " << static_cast<int>(acc) << ", row " << i << ", column " << c);
        CHECK(r.o(i, c) == loop_o(q, k, v, 0.25, i, c, acc));
      }
  }
}

TEST_CASE("pv.unit ada-mma-e4m3 and b200-tcgen05-e4m3 run P V through their MMA-Sim presets, 32 keys per call", "[sage2][mma]") {
  std::mt19937_64 g(6);
  const RowMatrixXd q = random_matrix(3, 16, 0, 1, g), k = random_matrix(300, 16, 0.5, 1, g), v = random_matrix(300, 5, 0.2, 1, g);
  Sage2Params p;
  p.accumulation = SageAccumulation::mma;
  RowMatrixXd h100_o;
  for (const auto& [unit, name] : {std::pair{PvUnit::h100_mma_e4m3, "h100-mma-e4m3"},
                                   std::pair{PvUnit::ada_mma_e4m3, "ada-mma-e4m3"},
                                   std::pair{PvUnit::b200_tcgen05_e4m3, "b200-tcgen05-e4m3"}}) {
    FlashKernel f = sage2_kernel(p);
    f.pv.unit = unit;
    const AttentionResult r = flash_attention(q, k, v, 0.25, {}, f);
    for (int i = 0; i < 3; ++i)
      for (int c = 0; c < 5; ++c) {
        INFO(name << ", row " << i << ", column " << c);
        CHECK(r.o(i, c) == loop_o(q, k, v, 0.25, i, c, SageAccumulation::mma, name));
      }
    if (unit == PvUnit::h100_mma_e4m3) h100_o = r.o;
    if (unit == PvUnit::ada_mma_e4m3) CHECK(r.o != h100_o);  // Ada's 13 fraction bits reach O; F = 25 units may agree
  }
}

namespace {

// A vectorised FP8 step (wgmma_e4m3_step, tcgen05_e4m3_step) against mma_dot of its preset, column by column, on
// every non-NaN E4M3 code and accumulators of 14 significant bits (wide ones for F = 25).
template <typename Step>
void check_fp8_step(const char* preset, Step step, bool wide_acc) {
  std::mt19937_64 g(6);
  const MmaModel& model = mma_preset(preset);
  const int trials = qattn::test::scaled(2000, 50);
  qattn::test::announce_scale(std::string(preset) + " step against mma_dot", trials);
  std::uniform_int_distribution<int> code(0, 255);
  auto e4m3 = [&] {
    int c;
    do c = code(g); while ((c & 0x7f) == 0x7f);  // every non-NaN code: zeros and subnormals included
    return static_cast<std::uint16_t>(c);
  };
  for (int trial = 0; trial < trials; ++trial) {
    const std::size_t n = 1 + static_cast<std::size_t>(g() % 32), cols = 1 + static_cast<std::size_t>(g() % 80);
    std::vector<std::uint16_t> pc(n), vc(n * cols);
    for (auto& x : pc) x = e4m3();
    for (auto& x : vc) x = e4m3();
    std::vector<float> p(n), v(n * cols), acc(cols);
    for (std::size_t j = 0; j < n; ++j) p[j] = static_cast<float>(lowp_decode(pc[j], fp8_e4m3fn()));
    for (std::size_t i = 0; i < vc.size(); ++i) v[i] = static_cast<float>(lowp_decode(vc[i], fp8_e4m3fn()));
    for (auto& a : acc)  // zero, or an accumulator of 14 (24) significant bits from 2^-12 (2^-30) to 2^24
      a = g() % 4 == 0 ? 0.0f
          : wide_acc ? std::ldexp(static_cast<float>((g() % 8388608) + 8388608) * (g() % 2 ? 1 : -1),
                                  static_cast<int>(g() % 55) - 53)
                     : std::ldexp(static_cast<float>((g() % 8192) + 8192) * (g() % 2 ? 1 : -1),
                                  static_cast<int>(g() % 37) - 26);
    std::vector<std::int8_t> ve(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      ve[i] = static_cast<std::int8_t>(v[i] == 0 ? -6 : std::max(std::ilogb(v[i]), -6));
    std::vector<float> fast = acc;
    step(fast.data(), p.data(), n, v.data(), ve.data(), cols, cols);
    for (std::size_t c = 0; c < cols; ++c) {
      std::vector<std::uint16_t> column(n);
      for (std::size_t j = 0; j < n; ++j) column[j] = vc[j * cols + c];
      INFO(preset << ", trial " << trial << ", column " << c << ", acc " << acc[c]);
      REQUIRE(std::bit_cast<std::uint32_t>(fast[c]) == std::bit_cast<std::uint32_t>(mma_dot(model, pc, column, acc[c])));
    }
  }
}

}  // namespace

TEST_CASE("wgmma_e4m3_step is mma_dot of h100-wgmma-e4m3, column by column", "[sage2][mma]") {
  check_fp8_step("h100-wgmma-e4m3", wgmma_e4m3_step, false);
}

TEST_CASE("tcgen05_e4m3_step is mma_dot of b200-tcgen05-e4m3, column by column", "[sage2][mma]") {
  check_fp8_step("b200-tcgen05-e4m3", tcgen05_e4m3_step, true);
  check_fp8_step("b200-tcgen05-e4m3", tcgen05_e4m3_step, false);
}

TEST_CASE("ada_e4m3_step is one step of mma_dot of ada-mma-e4m3 and ada-mma-e4m3-acc16, column by column", "[sage2][mma]") {
  std::mt19937_64 g(89);
  std::uniform_int_distribution<int> code(0, 255);
  auto e4m3 = [&] {
    int c;
    do c = code(g); while ((c & 0x7f) == 0x7f);  // every non-NaN code: zeros and subnormals included
    return static_cast<std::uint16_t>(c);
  };
  const int trials = qattn::test::scaled(2000, 50);
  qattn::test::announce_scale("ada_e4m3_step against mma_dot", trials);
  std::size_t slow_paths = 0;
  for (bool f16 : {false, true}) {
    const MmaModel& model = mma_preset(f16 ? "ada-mma-e4m3-acc16" : "ada-mma-e4m3");
    for (int trial = 0; trial < trials; ++trial) {
      const std::size_t n = static_cast<std::size_t>(g() % 17), cols = 1 + static_cast<std::size_t>(g() % 80);
      std::vector<std::uint16_t> pc(16, 0), vc(16 * cols, 0);  // the step's 16 codes, zero past n
      for (std::size_t j = 0; j < n; ++j) pc[j] = e4m3();
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t c = 0; c < cols; ++c) vc[j * cols + c] = e4m3();
      std::vector<float> p(16), v(16 * cols), acc(cols);
      for (std::size_t j = 0; j < 16; ++j) p[j] = static_cast<float>(lowp_decode(pc[j], fp8_e4m3fn()));
      for (std::size_t i = 0; i < vc.size(); ++i) v[i] = static_cast<float>(lowp_decode(vc[i], fp8_e4m3fn()));
      for (auto& a : acc) {  // zero, small, f16-representable, wide, near float32's top, or infinite
        const int kind = static_cast<int>(g() % 8);
        const float sign = g() % 2 ? 1.0f : -1.0f;
        a = kind == 0   ? 0.0f * sign
            : kind == 1 ? std::ldexp(sign * static_cast<float>((g() % 1024) + 1), -40 - static_cast<int>(g() % 100))
            : kind == 2 ? static_cast<float>(round_to_binary16(std::ldexp(sign * static_cast<double>(g() % 2048),
                                                                           static_cast<int>(g() % 30) - 24)))
            : kind == 3 ? std::ldexp(sign * static_cast<float>((g() % 8388608) + 8388608), static_cast<int>(g() % 40) - 40)
            : kind == 4 ? std::ldexp(sign * 1.5f, 120 + static_cast<int>(g() % 8))
            : kind == 5 ? sign * INFINITY
                        : std::ldexp(sign * static_cast<float>((g() % 8192) + 8192), static_cast<int>(g() % 37) - 26);
        if (f16) a = static_cast<float>(round_to_binary16(a));  // an f16 accumulator holds binary16 values
      }
      std::vector<std::int8_t> ve(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) ve[i] = wgmma_e4m3_exponent(v[i]);
      std::vector<float> fast = acc;
      ada_e4m3_step(fast.data(), p.data(), n, v.data(), ve.data(), cols, cols, f16);
      for (std::size_t c = 0; c < cols; ++c) {
        std::vector<std::uint16_t> column(16);
        for (std::size_t j = 0; j < 16; ++j) column[j] = vc[j * cols + c];
        const float want = mma_dot(model, pc, column, acc[c]);
        slow_paths += !(std::fabs(acc[c]) < 0x1p100f) || n == 0;
        INFO(model.name << ", trial " << trial << ", n " << n << ", column " << c << ", acc " << acc[c]);
        REQUIRE(std::bit_cast<std::uint32_t>(fast[c]) == std::bit_cast<std::uint32_t>(want));
      }
    }
  }
  CHECK(slow_paths > 0);  // the columns the vectorised chunk leaves to mma_dot were drawn
}

TEST_CASE("the H100 wgmma accumulator per 128-key block beats one wgmma accumulator on long rows", "[sage2][mma]") {
  std::mt19937_64 g(3);
  const RowMatrixXd q = random_matrix(8, 64, 0, 0.3, g), k = random_matrix(8192, 64, 0, 0.3, g);
  const RowMatrixXd v = random_matrix(8192, 16, 1.0, 0.2, g);
  const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
  double err[4];
  int i = 0;
  for (SageAccumulation a : {SageAccumulation::fp32, SageAccumulation::wgmma, SageAccumulation::wgmma_single,
                             SageAccumulation::two_level_fp22}) {
    Sage2Params p;
    p.accumulation = a;
    err[i++] = matrix_rel_l1(sage2_attention(q, k, v, 0.125, {}, p).o, ref);
  }
  INFO("rel L1: fp32 " << err[0] << ", wgmma per block " << err[1] << ", one wgmma accumulator " << err[2]
                       << ", per-product FP22 per block " << err[3]);
  CHECK(err[0] <= err[1]);
  CHECK(err[1] * 2 < err[2]);
  CHECK(err[1] < 1.2 * err[0]);  // per-block promotion keeps the wgmma truncation near fp32's error
}

TEST_CASE("qk-transform: each change of basis keeps Q K^T and is the one docs/pipelines/sage2.md defines", "[sage2]") {
  std::mt19937_64 g(31);
  RowMatrixXd q = random_matrix(40, 64, 2.0, g), k = random_matrix(50, 64, 1.0, g);
  k.col(5) *= 30.0;  // a channel outlier of K
  const RowMatrixXd s = q * k.transpose();
  for (const SageQkTransform t : {SageQkTransform::hadamard, SageQkTransform::smoothquant, SageQkTransform::qserve}) {
    Sage2Params p;
    p.qk_transform = t;
    p.hadamard_seed = 5;
    RowMatrixXd qt = q, kt = k;
    sage2_transform_qk(qt, kt, p);
    INFO("transform " << static_cast<int>(t));
    CHECK((qt * kt.transpose() - s).cwiseAbs().maxCoeff() <= 1e-12 * s.cwiseAbs().maxCoeff());
    CHECK((qt - q).cwiseAbs().maxCoeff() > 1e-3);  // it did change them
    if (t == SageQkTransform::hadamard) {
      // (x D) H / sqrt(d) with H(i, j) = (-1)^popcount(i & j) and D's signs from the seed's top bits, built directly
      std::mt19937_64 signs(5);
      RowMatrixXd r(64, 64);
      for (int i = 0; i < 64; ++i) {
        const double sign = (signs() >> 63) != 0 ? -1.0 : 1.0;
        for (int j = 0; j < 64; ++j) r(i, j) = sign * ((std::popcount(static_cast<unsigned>(i & j)) % 2) ? -1.0 : 1.0) / 8.0;
      }
      CHECK((qt - q * r).cwiseAbs().maxCoeff() <= 1e-13);
      CHECK((kt - k * r).cwiseAbs().maxCoeff() <= 1e-12);
      // the rotation spreads K's outlier channel over all channels
      CHECK(kt.cwiseAbs().maxCoeff() < 0.5 * k.cwiseAbs().maxCoeff());
    } else {
      for (Eigen::Index c = 0; c < 64; ++c) {
        const double qmax = q.col(c).cwiseAbs().maxCoeff(), kmax = k.col(c).cwiseAbs().maxCoeff();
        const double qtmax = qt.col(c).cwiseAbs().maxCoeff(), ktmax = kt.col(c).cwiseAbs().maxCoeff();
        if (t == SageQkTransform::smoothquant) {  // alpha = 0.5 balances the two maxima at sqrt(qmax kmax)
          CHECK(qtmax == Approx(std::sqrt(qmax * kmax)).epsilon(1e-12));
          CHECK(ktmax == Approx(std::sqrt(qmax * kmax)).epsilon(1e-12));
        } else {  // qserve: K_c / sqrt(kmax), Q_c * sqrt(kmax)
          CHECK(ktmax == Approx(std::sqrt(kmax)).epsilon(1e-12));
          CHECK(qtmax == Approx(qmax * std::sqrt(kmax)).epsilon(1e-12));
        }
      }
    }
  }
  Sage2Params p;
  p.qk_transform = SageQkTransform::hadamard;
  RowMatrixXd q48 = random_matrix(4, 48, 1.0, g), k48 = random_matrix(4, 48, 1.0, g);
  CHECK_THROWS_WITH(sage2_transform_qk(q48, k48, p), Catch::Contains("not a power of 2"));
}

TEST_CASE("the baselines' presets run sage2 with step (0) alone changed", "[sage2]") {
  std::mt19937_64 g(32);
  RowMatrixXd q = random_matrix(64, 64, 2.0, g), k = random_matrix(96, 64, 1.0, g), v = random_matrix(96, 32, 1.0, g);
  const auto none = reference_registry().create("sage2:qk=4,smooth-q=false,smooth-k=false");
  for (const char* spec : {"sage2@paper-hadmdattn", "sage2@paper-smoothattn"}) {
    INFO(spec);
    const auto m = reference_registry().create(spec);
    // the preset on Q and K already transformed by hand equals the no-transform pipeline on them
    Sage2Params p;
    p.qk_transform = std::string(spec) == "sage2@paper-hadmdattn" ? SageQkTransform::hadamard : SageQkTransform::qserve;
    RowMatrixXd qt = q, kt = k;
    sage2_transform_qk(qt, kt, p);
    const AttentionResult a = m->attention(q, k, v, 0.125, {}), b = none->attention(qt, kt, v, 0.125, {});
    CHECK(a.o == b.o);
    CHECK(a.p == b.p);
  }
}
