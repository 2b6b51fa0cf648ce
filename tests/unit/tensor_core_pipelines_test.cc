// The pipelines built on the H100 MMA models (docs/mma.md): fa3-fp8 (docs/pipelines/fa3-fp8.md) and sage1
// (docs/pipelines/sage1.md). Each equals a loop formulation of its documented steps through the generic model
// (mma_dot) bit for bit; the vectorised HMMA f16-accumulator step equals mma_dot of h100-hmma-f16-acc16; and the
// claims the papers make about these methods are measured. Masks, streaming and key order are covered for every
// registered method in tests/property/registry_property_test.cc.
#include <catch2/catch.hpp>
#include <array>
#include <bit>
#include <cmath>
#include <numbers>
#include <random>

#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/fa3_fp8.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/sage1.h"
#include "qattn/reference/sage2.h"
#include "support/matrix_stats.h"
#include "support/random_matrix.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::matrix_rel_l1;
using qattn::test::random_matrix;

namespace {

std::uint16_t f16_code(double x) { return static_cast<std::uint16_t>(lowp_encode(x, fp16_binary16())); }
std::uint16_t e4m3_code(double x) { return static_cast<std::uint16_t>(lowp_encode(x, fp8_e4m3fn())); }
float exp2_f32(float x) { return static_cast<float>(std::exp2(static_cast<double>(x))); }

// sage1's documented steps, written out one output at a time, with P V through mma_dot.
float sage1_loop_o(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, double scale, int i, int c,
                   bool f16_acc, bool pad_upstream) {
  const int lk = static_cast<int>(k.rows()), d = static_cast<int>(k.cols());
  RowMatrixXd ks = k;
  ks.rowwise() -= k.colwise().mean();
  auto codes = [](const std::vector<float>& x, float& s) {  // one block's INT8 codes and scale
    float amax = 0;
    for (float e : x) amax = std::max(amax, std::fabs(e));
    s = amax / 127.0f;
    std::vector<int> out;
    for (float e : x) out.push_back(static_cast<int>(e / s + (e / s >= 0 ? 0.5f : -0.5f)));
    return out;
  };
  const float factor = static_cast<float>(scale * 1.44269504);
  std::vector<float> qb;  // Q's block of 128 rows holding row i
  const int q0 = i / 128 * 128, q1 = std::min<int>(static_cast<int>(q.rows()), q0 + 128);
  for (int r = q0; r < q1; ++r)
    for (int t = 0; t < d; ++t) qb.push_back(static_cast<float>(q(r, t)) * factor);
  float sq;
  const std::vector<int> qc = codes(qb, sq);
  const int lk_pad = pad_upstream ? (lk + 63) / 64 * 64 : lk;
  std::vector<float> s(lk_pad, 0.0f);
  for (int b0 = 0; b0 < lk; b0 += 64) {
    std::vector<float> kb;
    for (int j = b0; j < std::min(lk, b0 + 64); ++j)
      for (int t = 0; t < d; ++t) kb.push_back(static_cast<float>(ks(j, t)));
    float sk;
    const std::vector<int> kc = codes(kb, sk);
    for (int j = b0; j < std::min(lk, b0 + 64); ++j) {
      long a = 0;
      for (int t = 0; t < d; ++t) a += long{qc[(i - q0) * d + t]} * kc[(j - b0) * d + t];
      s[j] = static_cast<float>(a) * sq * sk;
    }
  }
  const MmaModel& hmma = mma_preset("h100-hmma-f16-acc16");
  float m = -INFINITY, l = 1.0f, acc = 0;
  for (int b0 = 0; b0 < lk_pad; b0 += 64) {
    const int b1 = std::min(lk_pad, b0 + 64);
    float mn = m;
    for (int j = b0; j < b1; ++j) mn = std::max(mn, s[j]);
    float lb = 0;
    std::vector<std::uint16_t> pc, vc;
    for (int j = b0; j < b1; ++j) {
      const float pt = exp2_f32(s[j] - mn);
      lb += pt;
      if (j >= lk) continue;  // padded keys: V = 0
      const double p16 = round_to_format(pt, kBinary16), v16 = round_to_format(v(j, c), kBinary16);
      pc.push_back(f16_code(p16)), vc.push_back(f16_code(v16));
    }
    const float alpha = exp2_f32(m - mn);
    l = l * alpha + lb;
    float block = 0;  // a fresh FP16 accumulator, 16 keys per HMMA step
    for (std::size_t s0 = 0; s0 < pc.size(); s0 += 16) {
      const std::size_t n = std::min<std::size_t>(16, pc.size() - s0);
      block = mma_dot(hmma, std::span(pc).subspan(s0, n), std::span(vc).subspan(s0, n), block);
    }
    if (f16_acc) {
      acc = acc * alpha + block;
    } else {  // float32 adds, one product after the other onto the rescaled output
      acc *= alpha;
      for (std::size_t j = 0; j < pc.size(); ++j)
        acc += static_cast<float>(lowp_decode(pc[j], fp16_binary16()) * lowp_decode(vc[j], fp16_binary16()));
    }
    m = mn;
  }
  return acc / l;
}

// fa3-fp8's documented steps, written out one output at a time, with S and P V through mma_dot.
float fa3_loop_o(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, double scale, bool causal, int i,
                 int c) {
  const int lq = static_cast<int>(q.rows()), lk = static_cast<int>(k.rows()), d = static_cast<int>(q.cols());
  const MmaModel& wgmma = mma_preset("h100-wgmma-e4m3");
  auto descale = [](const RowMatrixXd& x) {
    return static_cast<float>(x.cwiseAbs().maxCoeff()) / 448.0f;
  };
  const float dq = descale(q), dk = descale(k), dv = descale(v);
  auto code = [](double x, float ds) { return e4m3_code(e4m3_round_saturate(static_cast<float>(x) / ds)); };
  const float s2 = static_cast<float>(static_cast<double>(static_cast<float>(scale)) * std::numbers::log2e) * (dq * dk);
  const int kb = fa3_fp8_key_block(d), tile = fa3_fp8_query_tile(d);
  // bottom-right causal: row r sees keys j <= r + lk - lq
  auto sees = [&](int r, int j) { return !causal || j <= r + lk - lq; };
  std::vector<float> s(lk);
  for (int j = 0; j < lk; ++j) {
    std::vector<std::uint16_t> a(d), b(d);
    for (int t = 0; t < d; ++t) a[t] = code(q(i, t), dq), b[t] = code(k(j, t), dk);
    s[j] = sees(i, j) ? mma_dot(wgmma, a, b, 0.0f) : -INFINITY;
  }
  // the key blocks of row i's query tile: from the first to the last holding a key some row of the tile sees
  const int t0 = i / tile * tile, t1 = std::min(lq, t0 + tile), blocks = (lk + kb - 1) / kb;
  int lo = blocks, hi = 0;
  for (int b = 0; b < blocks; ++b)
    for (int r = t0; r < t1; ++r)
      for (int j = b * kb; j < std::min(lk, (b + 1) * kb); ++j)
        if (sees(r, j)) lo = std::min(lo, b), hi = b + 1;
  float m = -INFINITY, o = 0;
  std::array<float, 4> l{};
  bool first = true;
  for (int b = hi - 1; b >= lo; --b) {
    const int k0 = b * kb, k1 = std::min(lk, k0 + kb);
    const float mp = m;
    for (int j = k0; j < k1; ++j) m = std::max(m, s[j]);
    if (!first) {
      const float r = exp2_f32((mp - (m == -INFINITY ? 0.0f : m)) * s2);
      for (float& x : l) x *= r;
      o *= r;
    }
    const float ms = m == -INFINITY ? 0.0f : m * s2 - 8.0f;
    std::array<float, 4> part{};
    std::array<bool, 4> seen{};
    std::vector<std::uint16_t> pc, vc;
    for (int j = k0; j < k1; ++j) {
      const float pt = exp2_f32(std::fma(s[j], s2, -ms));
      const int t = (j - k0) % 8 / 2;
      part[t] = seen[t] ? part[t] + pt : pt, seen[t] = true;
      pc.push_back(e4m3_code(e4m3_round_saturate(pt))), vc.push_back(code(v(j, c), dv));
    }
    for (int t = 0; t < 4; ++t) l[t] = first ? part[t] : l[t] + part[t];
    o = mma_dot(wgmma, pc, vc, o);  // the block's steps of 32 keys onto the one accumulator
    first = false;
  }
  const float sum = (l[0] + l[2]) + (l[1] + l[3]);
  return o * ((1.0f / sum) * dv);
}

}  // namespace

TEST_CASE("hmma_f16_acc16_step is mma_dot of h100-hmma-f16-acc16, column by column", "[sage1][mma]") {
  std::mt19937_64 g(21);
  const MmaModel& hmma = mma_preset("h100-hmma-f16-acc16");
  std::uniform_int_distribution<int> code(0, 0xffff);
  auto f16 = [&] {  // every finite code: zeros and subnormals included
    int c;
    do c = code(g); while ((c & 0x7c00) == 0x7c00);
    return static_cast<std::uint16_t>(c);
  };
  int overflows = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t n = 1 + static_cast<std::size_t>(g() % 16), cols = 1 + static_cast<std::size_t>(g() % 80);
    std::vector<std::uint16_t> pc(n), vc(n * cols);
    for (auto& x : pc) x = f16();
    for (auto& x : vc) x = f16();
    if (trial % 3 == 0)  // P as sage1 holds it: in [0, 1]
      for (auto& x : pc) x = static_cast<std::uint16_t>(x & 0x3fff);
    std::vector<float> p(n), v(n * cols), acc(cols);
    for (std::size_t j = 0; j < n; ++j) p[j] = static_cast<float>(lowp_decode(pc[j], fp16_binary16()));
    for (std::size_t i = 0; i < vc.size(); ++i) v[i] = static_cast<float>(lowp_decode(vc[i], fp16_binary16()));
    for (auto& a : acc) {  // zero, any finite binary16, or +-inf
      const auto kind = g() % 10;
      a = kind == 0 ? 0.0f : kind == 1 ? (g() % 2 ? INFINITY : -INFINITY)
                                       : static_cast<float>(lowp_decode(f16(), fp16_binary16()));
    }
    std::vector<std::int8_t> ve(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) ve[i] = hmma_f16_exponent(v[i]);
    std::vector<float> fast = acc;
    hmma_f16_acc16_step(fast.data(), p.data(), n, v.data(), ve.data(), cols, cols);
    for (std::size_t c = 0; c < cols; ++c) {
      std::vector<std::uint16_t> column(n);
      for (std::size_t j = 0; j < n; ++j) column[j] = vc[j * cols + c];
      const float want = mma_dot(hmma, pc, column, acc[c]);
      overflows += std::isfinite(acc[c]) && !std::isfinite(want);
      INFO("trial " << trial << ", column " << c << ", acc " << acc[c]);
      REQUIRE(std::bit_cast<std::uint32_t>(fast[c]) == std::bit_cast<std::uint32_t>(want));
    }
  }
  CHECK(overflows > 100);  // sums beyond binary16 were among the cases
}

TEST_CASE("sage1 equals a loop formulation of its documented steps", "[sage1]") {
  std::mt19937_64 g(22);
  const RowMatrixXd q = random_matrix(3, 16, 0, 1, g), k = random_matrix(150, 16, 0.5, 1, g), v = random_matrix(150, 5, 0, 1, g);
  for (const bool f16 : {true, false})
    for (const bool pad : {false, true}) {
      Sage1Params p;
      p.accumulation = f16 ? Sage1Accumulation::f16 : Sage1Accumulation::fp32;
      p.pad_upstream = pad;
      p.output_fp16 = false;
      const AttentionResult r = sage1_attention(q, k, v, 0.25, {}, p);
      p.output_fp16 = true;
      const AttentionResult r16 = sage1_attention(q, k, v, 0.25, {}, p);
      for (int i = 0; i < 3; ++i)
        for (int c = 0; c < 5; ++c) {
          INFO("acc " << (f16 ? "f16" : "fp32") << ", pad " << (pad ? "upstream" : "masked") << ", O[" << i << ", " << c << "]");
          const float want = sage1_loop_o(q, k, v, 0.25, i, c, f16, pad);
          CHECK(r.o(i, c) == want);
          CHECK(r16.o(i, c) == round_to_format(want, kBinary16));
        }
    }
}

TEST_CASE("sage1: pad=upstream is pad=masked where L_k is a multiple of 64, and biased where it is not", "[sage1]") {
  std::mt19937_64 g(23);
  Sage1Params masked, upstream;
  upstream.pad_upstream = true;
  const RowMatrixXd q = random_matrix(32, 64, 0, 1, g);
  const RowMatrixXd k = random_matrix(128, 64, 0, 1, g), v = random_matrix(128, 16, 0, 1, g);
  CHECK(sage1_attention(q, k, v, 0.125, {}, masked).o == sage1_attention(q, k, v, 0.125, {}, upstream).o);
  const RowMatrixXd k2 = k.topRows(100), v2 = v.topRows(100);
  const RowMatrixXd ref = float_attention(q, k2, v2, 0.125, FloatPrecision::fp64).o;
  const AttentionResult a = sage1_attention(q, k2, v2, 0.125, {}, masked), b = sage1_attention(q, k2, v2, 0.125, {}, upstream);
  // 28 phantom keys with logit 0 take their share of every row's sum: P no longer sums to 1, O shrinks toward 0.
  const double pa = a.p.rowwise().sum().minCoeff(), pb = b.p.rowwise().sum().maxCoeff();
  INFO("row sums of P: masked >= " << pa << ", upstream <= " << pb << "; rel L1 " << matrix_rel_l1(a.o, ref) << " vs "
                                  << matrix_rel_l1(b.o, ref));
  CHECK(pa > 0.99);
  CHECK(pb < 0.95);
  CHECK(matrix_rel_l1(b.o, ref) > 10 * matrix_rel_l1(a.o, ref));
}

TEST_CASE("sage1: the FP16 accumulator costs little next to float32 adds (SageAttention's Sec. 4.4 claim)", "[sage1]") {
  std::mt19937_64 g(24);
  const RowMatrixXd q = random_matrix(64, 64, 0, 1, g), k = random_matrix(2048, 64, 0, 1, g);
  const RowMatrixXd v = random_matrix(2048, 32, 0, 1, g);
  const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
  Sage1Params f16, f32;
  f32.accumulation = Sage1Accumulation::fp32;
  f16.output_fp16 = f32.output_fp16 = false;
  const RowMatrixXd o16 = sage1_attention(q, k, v, 0.125, {}, f16).o, o32 = sage1_attention(q, k, v, 0.125, {}, f32).o;
  const double e16 = matrix_rel_l1(o16, ref), e32 = matrix_rel_l1(o32, ref);
  INFO("rel L1: f16 accumulator " << e16 << ", fp32 " << e32 << "; f16 vs fp32 " << matrix_rel_l1(o16, o32));
  CHECK(o16 != o32);                                // the FP16 accumulator does round
  CHECK(matrix_rel_l1(o16, o32) > 1e-5);
  CHECK(std::fabs(e16 - e32) < 0.02 * e32);         // but INT8 Q/K and FP16 P, V dominate the error
}

TEST_CASE("sage1 refuses V beyond binary16 and a P V block beyond the FP16 accumulator", "[sage1]") {
  std::mt19937_64 g(25);
  const RowMatrixXd q = random_matrix(4, 16, 0, 1, g), k = random_matrix(64, 16, 0, 1, g);
  RowMatrixXd v = RowMatrixXd::Constant(64, 2, 1.0);
  v(7, 1) = 70000;
  try {
    sage1_attention(q, k, v, 0.25, {}, {});
    FAIL("V beyond binary16 was accepted");
  } catch (const InputError& e) {
    CHECK(e.source() == "V");
    CHECK(std::string(e.what()).find("[7, 1]") != std::string::npos);
  }
  // 64 keys of equal logits (P~ = 1 each): a block sums 64 V, beyond 65504 for V = 60000, within it for V = 1000
  const RowMatrixXd q0 = RowMatrixXd::Zero(2, 16), k0 = RowMatrixXd::Zero(64, 16);
  const RowMatrixXd big = RowMatrixXd::Constant(64, 1, 60000.0);
  CHECK_THROWS_AS(sage1_attention(q0, k0, big, 0.25, {}, {}), InputError);
  CHECK_NOTHROW(sage1_attention(q0, k0, RowMatrixXd::Constant(64, 1, 1000.0), 0.25, {}, {}));
}

TEST_CASE("fa3-fp8 equals a loop formulation of its documented steps", "[fa3]") {
  std::mt19937_64 g(31);
  // d = 40: a short last wgmma step over d; L_k = 300: two key blocks of 160, the partial one first
  const RowMatrixXd q = random_matrix(300, 40, 0, 1, g), k = random_matrix(300, 40, 0.5, 1, g), v = random_matrix(300, 3, 0, 1, g);
  for (const bool causal : {false, true}) {
    AttentionMask mask;
    mask.causal = causal;
    Fa3Fp8Params p;
    p.output_bf16 = false;
    const AttentionResult r = fa3_fp8_attention(q, k, v, 0.2, mask, p);
    p.output_bf16 = true;
    const AttentionResult rb = fa3_fp8_attention(q, k, v, 0.2, mask, p);
    for (const int i : {0, 5, 150, 191, 192, 299})
      for (int c = 0; c < 3; ++c) {
        INFO((causal ? "causal" : "unmasked") << ", O[" << i << ", " << c << "]");
        const float want = fa3_loop_o(q, k, v, 0.2, causal, i, c);
        CHECK(r.o(i, c) == want);
        CHECK(rb.o(i, c) == round_to_format(want, kBfloat16));
      }
  }
}

TEST_CASE("fa3-fp8: the kernel's tile sizes, and scale=none refuses what torch's cast makes NaN", "[fa3]") {
  CHECK(fa3_fp8_key_block(64) == 160);
  CHECK(fa3_fp8_key_block(96) == 128);
  CHECK(fa3_fp8_key_block(128) == 224);
  CHECK(fa3_fp8_key_block(192) == 160);
  CHECK(fa3_fp8_key_block(256) == 128);
  CHECK(fa3_fp8_query_tile(64) == 192);
  CHECK(fa3_fp8_query_tile(128) == 128);
  std::mt19937_64 g(32);
  RowMatrixXd q = random_matrix(4, 16, 0, 1, g);
  const RowMatrixXd k = random_matrix(8, 16, 0, 1, g), v = random_matrix(8, 2, 0, 1, g);
  Fa3Fp8Params none;
  none.scaling = Fa3Scaling::none;
  q(2, 3) = 463.9;  // rounds to 448 in E4M3
  CHECK_NOTHROW(fa3_fp8_attention(q, k, v, 0.25, {}, none));
  q(2, 3) = 464;
  try {
    fa3_fp8_attention(q, k, v, 0.25, {}, none);
    FAIL("464 was accepted with scale=none");
  } catch (const InputError& e) {
    CHECK(e.source() == "Q");
    CHECK(std::string(e.what()).find("[2, 3]") != std::string::npos);
  }
  CHECK_NOTHROW(fa3_fp8_attention(q, k, v, 0.25, {}, {}));  // scale=amax takes it
  CHECK_THROWS_AS(fa3_fp8_attention(RowMatrixXd::Zero(2, 264), RowMatrixXd::Zero(3, 264), v.topRows(3), 0.25, {}, {}),
                  InputError);  // head dims above 256: no such kernel
}

TEST_CASE("fa3-fp8 against sage2: per-tensor FP8 Q/K without smoothing, one accumulator over the key loop", "[fa3]") {
  SECTION("a per-channel K bias costs FP8 Q K^T what K smoothing saves sage2 (SageAttention2's comparison)") {
    std::mt19937_64 g(33);
    const RowMatrixXd q = random_matrix(64, 64, 0, 1, g), v = random_matrix(256, 64, 0, 1, g);
    RowMatrixXd k = random_matrix(256, 64, 0, 1, g);
    for (int c = 0; c < 64; ++c) k.col(c).array() += 20 * std::sin(c);
    const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
    const double fa3 = matrix_rel_l1(fa3_fp8_attention(q, k, v, 0.125, {}, {}).o, ref);
    const double sage2 = matrix_rel_l1(sage2_attention(q, k, v, 0.125, {}, {}).o, ref);
    INFO("rel L1: fa3-fp8 " << fa3 << ", sage2 " << sage2);
    CHECK(fa3 > 3 * sage2);
  }
  SECTION("long rows: one wgmma accumulator for all keys loses to sage2's promotion per 128 keys") {
    std::mt19937_64 g(3);
    const RowMatrixXd q = random_matrix(8, 64, 0, 0.3, g), k = random_matrix(8192, 64, 0, 0.3, g);
    const RowMatrixXd v = random_matrix(8192, 16, 1.0, 0.2, g);  // positive values: truncation errors add up
    const RowMatrixXd ref = float_attention(q, k, v, 0.125, FloatPrecision::fp64).o;
    Fa3Fp8Params fp32_out;
    fp32_out.output_bf16 = false;
    const double fa3 = matrix_rel_l1(fa3_fp8_attention(q, k, v, 0.125, {}, fp32_out).o, ref);
    const double sage2 = matrix_rel_l1(sage2_attention(q, k, v, 0.125, {}, {}).o, ref);
    INFO("rel L1: fa3-fp8 " << fa3 << ", sage2 " << sage2);
    CHECK(fa3 > 10 * sage2);
  }
}

TEST_CASE("flash pipelines' traits are the built description's: parameters create refuses are refused by traits too",
          "[sage2][fa3-fp8][registry]") {
  const Registry& r = reference_registry();
  // kv-block not a multiple of the wgmma's k (32); sm90 with a P format its kernel does not take
  for (const char* spec : {"fa3-fp8:kv-block=48", "sage2@sm90:p=fp16,acc=fp32"}) {
    INFO(spec);
    CHECK_THROWS_AS(r.create(spec), SpecError);
    CHECK_THROWS_AS(r.traits(parse_method_spec(spec)), SpecError);
  }
  // The same parameters where they fit: both build, and the traits are the description's (8-bit K and V for both)
  for (const char* spec : {"fa3-fp8:kv-block=64", "sage2@sm90"}) {
    INFO(spec);
    CHECK(r.create(spec) != nullptr);
    const MethodTraits t = r.traits(parse_method_spec(spec));
    CHECK(t.kv_bits == 8);
    CHECK(t.query_block_rows == 64);
  }
}
