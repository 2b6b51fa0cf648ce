// TurboAttention (FlashQ + SAS): the FlashQ primitives against hand-computed goldens, and the prefill and decode
// pipelines against a straightforward formulation written here from docs/pipelines/turbo.md (INT8 tiles, SAS online
// softmax, per-tile P~ quantisation), bit for bit. Plus: causality of the decode cache, SAS sparsity inside the
// pipeline, the reported P against O, and head-wise precision.
#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>

#include "support/random_matrix.h"
#include "support/symmetric_goldens.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/turbo.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::random_matrix;

namespace {

// The key side as the test assembles it: INT8 rows and, per block [begin[b], begin[b+1]), its scales.
struct TestBlocks {
  std::vector<Eigen::Index> begin;
  std::vector<double> sk, sv;
  RowMatrixXi32 k8, v8;
};

// Steps (2)-(5) of the doc for one tile of query rows (q8, one scale), written as plain loops.
RowMatrixXd tile_formulation(const RowMatrixXi32& q8, double sq, const TestBlocks& kb, double scale,
                             const RowMatrixXb& visible, const SasParams& sas) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const Eigen::Index rows = q8.rows(), dv = kb.v8.cols();
  std::vector<float> m(rows, ninf), l(rows, 0.0f);
  std::vector<std::vector<float>> o(rows, std::vector<float>(dv, 0.0f));
  for (std::size_t b = 0; b + 1 < kb.begin.size(); ++b) {
    const Eigen::Index b0 = kb.begin[b], b1 = kb.begin[b + 1];
    std::vector<std::vector<float>> s(rows, std::vector<float>(b1 - b0, ninf)), e = s;
    float tile_max = 0;
    std::vector<float> r(rows, 0.0f), mn(rows);
    for (Eigen::Index i = 0; i < rows; ++i) {
      mn[i] = m[i];
      for (Eigen::Index j = b0; j < b1; ++j) {
        if (!visible(i, j)) continue;
        long long a = 0;
        for (Eigen::Index t = 0; t < q8.cols(); ++t) a += static_cast<long long>(q8(i, t)) * kb.k8(j, t);
        s[i][j - b0] = static_cast<float>(a) * static_cast<float>(sq * kb.sk[b] * scale);
        mn[i] = std::max(mn[i], s[i][j - b0]);
      }
      if (mn[i] == ninf) continue;
      r[i] = m[i] == ninf ? 0.0f : static_cast<float>(sas_exp(static_cast<double>(mn[i] - m[i]), sas));
      float sum = 0;
      for (Eigen::Index j = 0; j < b1 - b0; ++j) {
        if (s[i][j] == ninf) continue;
        e[i][j] = static_cast<float>(sas_exp(static_cast<double>(mn[i] - s[i][j]), sas));
        sum += e[i][j];
        tile_max = std::max(tile_max, e[i][j]);
      }
      l[i] = l[i] * r[i] + sum;
    }
    const double sp = tile_max / 119.0;
    for (Eigen::Index i = 0; i < rows; ++i) {
      if (mn[i] == ninf) continue;
      for (Eigen::Index c = 0; c < dv; ++c) {
        long long acc = 0;
        for (Eigen::Index j = 0; j < b1 - b0; ++j)
          if (e[i][j] != ninf && tile_max > 0) acc += static_cast<long long>(std::nearbyint(e[i][j] / sp)) * kb.v8(b0 + j, c);
        o[i][c] = o[i][c] * r[i] + static_cast<float>(static_cast<double>(acc) * (sp * kb.sv[b]));
      }
      m[i] = mn[i];
    }
  }
  RowMatrixXd out = RowMatrixXd::Zero(rows, dv);
  for (Eigen::Index i = 0; i < rows; ++i)
    if (l[i] != 0)
      for (Eigen::Index c = 0; c < dv; ++c) out(i, c) = o[i][c] / l[i];
  return out;
}

// Prefill key blocks of bc rows, each quantised by flashq_quantize_block.
TestBlocks prefill_key_blocks(const RowMatrixXd& k, const RowMatrixXd& v, Eigen::Index bc) {
  TestBlocks kb;
  kb.k8.resize(k.rows(), k.cols());
  kb.v8.resize(v.rows(), v.cols());
  for (Eigen::Index b0 = 0; b0 < k.rows(); b0 += bc) {
    const Eigen::Index n = std::min(bc, k.rows() - b0);
    const FlashQBlock kq = flashq_quantize_block(k.middleRows(b0, n)), vq = flashq_quantize_block(v.middleRows(b0, n));
    kb.k8.middleRows(b0, n) = kq.values;
    kb.v8.middleRows(b0, n) = vq.values;
    kb.begin.push_back(b0);
    kb.sk.push_back(kq.scale);
    kb.sv.push_back(vq.scale);
  }
  kb.begin.push_back(k.rows());
  return kb;
}

RowMatrixXi32 compressed(const RowMatrixXi32& q8, int bits) {
  return bits == 8 ? q8 : flashq_decompress(flashq_compress(q8, bits, IntScaleRounding::round));
}

}  // namespace

TEST_CASE("FlashQ INT8 block: s = max|x|/119, half-even, all-zero block", "[turbo]") {
  // -1 / s = -39.67 rounds to -40
  test::check_symmetric_goldens([](const RowMatrixXd& x) { return flashq_quantize_block(x); }, 119, {-40, 0, 40, 119});
  RowMatrixXd h(1, 3);
  h << 0.5, 1.5, 2.5;  // exact ties under scale 1
  CHECK(flashq_quantize_with_scale(h, 1.0) == (RowMatrixXi32(1, 3) << 0, 2, 2).finished());
  Eigen::Index clamped = -1;
  RowMatrixXd big(1, 3);
  big << 200, -300, 5;
  CHECK(flashq_quantize_with_scale(big, 1.0, &clamped) == (RowMatrixXi32(1, 3) << 119, -119, 5).finished());
  CHECK(clamped == 2);
  CHECK_THROWS_AS(flashq_quantize_block((RowMatrixXd(1, 1) << NAN).finished()), std::invalid_argument);
  // R = 126, the scale equation after Eq. 3: s = 3/126, -1/s = -42 exactly, 1/s = 42.
  test::check_symmetric_goldens([](const RowMatrixXd& x) { return flashq_quantize_block(x, kFlashQRangeEq); }, 126,
                                {-42, 0, 42, 126});
  CHECK(flashq_quantize_with_scale(big, 1.0, &clamped, kFlashQRangeEq) == (RowMatrixXi32(1, 3) << 126, -126, 5).finished());
  // Through the registry: turbo and the flashq KV quantizer take int8-max; 126 changes the output.
  std::mt19937_64 g(5);
  const RowMatrixXd q = random_matrix(20, 16, 1.0, g), k = random_matrix(20, 16, 1.0, g), v = random_matrix(20, 8, 1.0, g);
  const Registry& reg = reference_registry();
  const AttentionResult r119 = reg.create("turbo")->attention(q, k, v, 0.25, {});
  const AttentionResult r126 = reg.create("turbo:int8-max=126")->attention(q, k, v, 0.25, {});
  CHECK(r119.o != r126.o);
  CHECK(kv_registry().canonical("flashq:int8-max=126").find("int8-max=126") != std::string::npos);
}

TEST_CASE("FlashQ progressive INT4/INT2: integer scale and zero point, saturation back to INT8", "[turbo]") {
  RowMatrixXi32 q8(5, 1);
  q8 << -119, -40, 0, 40, 119;
  const auto column = [](const std::array<int, 5>& v) {
    return (RowMatrixXi32(5, 1) << v[0], v[1], v[2], v[3], v[4]).finished();
  };
  // The block q8 compressed to `bits` under `rounding`: the integer scale s and zero point z, the codes, the INT8
  // values decompressed from them ((code - z) s) and how many of those saturated to [-128, 127].
  struct Golden {
    int bits;
    IntScaleRounding rounding;
    int scale, zero;
    std::array<int, 5> codes, decompressed;
    Eigen::Index saturated;
  };
  const Golden goldens[] = {
      // INT4, round: s = round(238/15 = 15.87) = 16, z = round(119/16 = 7.44) = 7; -2.5 and 2.5 round half to even
      {4, IntScaleRounding::round, 16, 7, {0, 5, 7, 9, 14}, {-112, -32, 0, 32, 112}, 0},
      // INT2, round: s = round(79.33) = 79, z = round(1.506) = 2; code 4 clamps to 3; (0 - 2) 79 = -158 saturates
      {2, IntScaleRounding::round, 79, 2, {0, 1, 2, 3, 3}, {-128, -79, 0, 79, 79}, 1},
      // INT2, ceil: s = 80, z = round(1.49) = 1, no code clamps
      {2, IntScaleRounding::ceil, 80, 1, {0, 1, 1, 1, 2}, {-80, 0, 0, 0, 80}, 0},
  };
  for (const Golden& e : goldens) {
    INFO("INT" << e.bits << (e.rounding == IntScaleRounding::ceil ? ", ceil" : ", round"));
    const ProgressiveBlock b = flashq_compress(q8, e.bits, e.rounding);
    CHECK(b.scale[0] == e.scale);
    CHECK(b.zero[0] == e.zero);
    CHECK(b.codes == column(e.codes));
    Eigen::Index sat = -1;
    CHECK(flashq_decompress(b, &sat) == column(e.decompressed));
    CHECK(sat == e.saturated);
  }
  // A constant channel: scale 1, the value exactly recovered.
  const RowMatrixXi32 flat = RowMatrixXi32::Constant(3, 1, -7);
  CHECK(flashq_decompress(flashq_compress(flat, 2, IntScaleRounding::round)) == flat);
  CHECK_THROWS_AS(flashq_compress(q8, 0, IntScaleRounding::round), std::invalid_argument);
}

TEST_CASE("FlashQ head priority gap x std and the n_h lowest heads at 2 bits", "[turbo]") {
  RowMatrixXd k(2, 2);
  k << 0, 2, 2, 0;  // gap 2; entries' std 1; channel gaps {2, 2}, their std 0
  const auto entries = HeadPriority::entries;
  CHECK(flashq_head_priority(k, RowMatrixXd::Zero(2, 2), entries) == 2.0);
  CHECK(flashq_head_priority(k, (3.0 * k).eval(), entries) == 2.0 + 18.0);
  CHECK(flashq_head_priority(k, (3.0 * k).eval()) == 0.0);  // equal channel gaps: no spread (Eq. 11 as defined)
  // Eq. 11 by the text: channel gaps {1, 5, 0}, gap 5 (max 5, min 0), std of {1, 5, 0} = sqrt(14/3).
  RowMatrixXd k3(2, 3);
  k3 << 0, 0, 3, 1, 5, 3;
  CHECK(flashq_head_priority(k3, RowMatrixXd::Zero(2, 3)) == Approx(5.0 * std::sqrt(14.0 / 3)).epsilon(1e-15));
  // entries: mean 2, variance (4 + 4 + 1 + 1 + 9 + 1) / 6 = 10/3.
  CHECK(flashq_head_priority(k3, RowMatrixXd::Zero(2, 3), entries) == Approx(5.0 * std::sqrt(10.0 / 3)).epsilon(1e-15));
  CHECK(flashq_head_bits({3, 1, 2, 1}, 2, 2, 4) == std::vector<int>{4, 2, 4, 2});
  CHECK(flashq_head_bits({3, 1, 2, 1}, 0, 2, 4) == std::vector<int>{4, 4, 4, 4});
  CHECK(flashq_head_bits({3, 1, 2, 1}, 9, 2, 8) == std::vector<int>{2, 2, 2, 2});
}

TEST_CASE("turbo prefill equals the tile formulation bit for bit", "[turbo]") {
  std::mt19937_64 g(41);
  const RowMatrixXd q = random_matrix(37, 16, 1.0, g), k = random_matrix(45, 16, 1.5, g), v = random_matrix(45, 5, 1.0, g);
  AttentionMask causal;
  causal.causal = true;
  for (const bool half : {false, true})
    for (const Eigen::Index br : {Eigen::Index{1}, Eigen::Index{8}, Eigen::Index{64}})
      for (const Eigen::Index bc : {Eigen::Index{7}, Eigen::Index{64}})
        for (const AttentionMask& mask : {AttentionMask{}, causal}) {
          INFO("half " << half << " br " << br << " bc " << bc << " causal " << mask.causal);
          TurboParams p;
          p.block_r = br;
          p.block_c = bc;
          p.sas.half = half;
          const AttentionResult r = turbo_attention(q, k, v, 0.25, mask, p, 8);
          const TestBlocks kb = prefill_key_blocks(k, v, bc);
          const RowMatrixXb vis = mask.empty() ? RowMatrixXb::Constant(37, 45, true) : mask.visible(37, 45);
          RowMatrixXd expect(37, 5);
          for (Eigen::Index r0 = 0; r0 < 37; r0 += br) {
            const Eigen::Index n = std::min<Eigen::Index>(br, 37 - r0);
            const FlashQBlock qb = flashq_quantize_block(q.middleRows(r0, n));
            expect.middleRows(r0, n) = tile_formulation(qb.values, qb.scale, kb, 0.25, vis.middleRows(r0, n), p.sas);
          }
          INFO("maxdiff " << (r.o - expect).cwiseAbs().maxCoeff());
          CHECK(r.o == expect);
        }
}

TEST_CASE("turbo decode equals the cache assembled here from FlashQ steps, per query", "[turbo]") {
  std::mt19937_64 g(42);
  const Eigen::Index lk = 50, bc = 8, nb = 6, pl = 20;
  const RowMatrixXd q = random_matrix(lk, 16, 1.0, g), v = random_matrix(lk, 4, 1.0, g);
  RowMatrixXd k = random_matrix(lk, 16, 1.0, g);
  k.row(40) *= 3;  // a buffer token beyond the universal scale: clamped
  AttentionMask causal;
  causal.causal = true;
  for (const int bits : {8, 4, 2})
    for (const AttentionMask& mask : {AttentionMask{}, causal}) {
      INFO("bits " << bits << " causal " << mask.causal);
      TurboParams p;
      p.mode = TurboMode::decode;
      p.block_c = bc;
      p.buffer = nb;
      p.prefill_len = pl;
      TurboStats st;
      const AttentionResult r = turbo_attention(q, k, v, 0.25, mask, p, bits, &st);
      CHECK(st.buffer_clamped > 0);
      // The prefill part: INT8 blocks of bc, then compressed.
      TestBlocks pre = prefill_key_blocks(k.topRows(pl), v.topRows(pl), bc);
      const double su_k = *std::max_element(pre.sk.begin(), pre.sk.end());
      const double su_v = *std::max_element(pre.sv.begin(), pre.sv.end());
      const RowMatrixXb vis = mask.empty() ? RowMatrixXb::Constant(lk, lk, true) : mask.visible(lk, lk);
      for (Eigen::Index i = 0; i < lk; ++i) {
        const Eigen::Index seen = mask.empty() ? lk : i + 1;
        TestBlocks kb;
        kb.k8.resize(lk, 16);
        kb.v8.resize(lk, 4);
        for (std::size_t b = 0; b + 1 < pre.begin.size(); ++b) {
          const Eigen::Index b0 = pre.begin[b], n = pre.begin[b + 1] - b0;
          kb.k8.middleRows(b0, n) = compressed(pre.k8.middleRows(b0, n), bits);
          kb.v8.middleRows(b0, n) = compressed(pre.v8.middleRows(b0, n), bits);
          kb.begin.push_back(b0);
          kb.sk.push_back(pre.sk[b]);
          kb.sv.push_back(pre.sv[b]);
        }
        for (Eigen::Index c0 = pl; c0 < lk; c0 += nb) {
          const Eigen::Index n = std::min(nb, lk - c0);
          RowMatrixXi32 kc = flashq_quantize_with_scale(k.middleRows(c0, n), su_k);
          RowMatrixXi32 vc = flashq_quantize_with_scale(v.middleRows(c0, n), su_v);
          if (c0 + nb <= seen) kc = compressed(kc, bits), vc = compressed(vc, bits);  // flushed before query i
          kb.k8.middleRows(c0, n) = kc;
          kb.v8.middleRows(c0, n) = vc;
          kb.begin.push_back(c0);
          kb.sk.push_back(su_k);
          kb.sv.push_back(su_v);
        }
        kb.begin.push_back(lk);
        const FlashQBlock qb = flashq_quantize_block(q.row(i));
        const RowMatrixXd expect = tile_formulation(qb.values, qb.scale, kb, 0.25, vis.row(i), p.sas);
        INFO("query " << i);
        CHECK(r.o.row(i) == expect);
      }
    }
}

TEST_CASE("turbo decode: a query never sees later tokens, even through the cache", "[turbo]") {
  std::mt19937_64 g(43);
  const RowMatrixXd q = random_matrix(60, 8, 1.0, g), k = random_matrix(60, 8, 1.0, g), v = random_matrix(60, 3, 1.0, g);
  AttentionMask causal;
  causal.causal = true;
  const auto m = reference_registry().create("turbo@decode:bc=8,nb=5,prefill-len=16,kv=2");
  const RowMatrixXd o = m->attention(q, k, v, 0.3, causal).o;
  for (const Eigen::Index t : {Eigen::Index{16}, Eigen::Index{23}, Eigen::Index{24}, Eigen::Index{40}}) {
    RowMatrixXd k2 = k, v2 = v;
    k2.bottomRows(59 - t) *= -2;  // change every token after t
    v2.bottomRows(59 - t).setConstant(9);
    const RowMatrixXd o2 = m->attention(q, k2, v2, 0.3, causal).o;
    INFO("t " << t);
    CHECK(o2.topRows(t + 1) == o.topRows(t + 1));
    CHECK(o2.bottomRows(59 - t) != o.bottomRows(59 - t));
  }
}

TEST_CASE("turbo: decode with the whole cache INT8 equals prefill with one-row query blocks", "[turbo]") {
  std::mt19937_64 g(44);
  const RowMatrixXd q = random_matrix(20, 8, 1.0, g), k = random_matrix(70, 8, 1.0, g), v = random_matrix(70, 3, 1.0, g);
  const auto dec = reference_registry().create("turbo:mode=decode,kv=8,prefill-len=70,bc=16");
  const auto pre = reference_registry().create("turbo:br=1,bc=16");
  CHECK(dec->attention(q, k, v, 0.3, {}).o == pre->attention(q, k, v, 0.3, {}).o);
}

TEST_CASE("turbo: SAS sparsity drops far keys, the reported P reproduces O", "[turbo]") {
  std::mt19937_64 g(45);
  RowMatrixXd q = random_matrix(6, 8, 1.0, g), k = random_matrix(30, 8, 1.0, g);
  const RowMatrixXd v = random_matrix(30, 3, 1.0, g);
  q.col(0).setConstant(4);
  k(3, 0) = 6;   // every query's maximum
  k(5, 0) = -6;  // logit about 48 * 0.35 below it: beyond n_r = -6
  const AttentionResult sas = reference_registry().create("turbo:bc=8")->attention(q, k, v, 0.35, {});
  const AttentionResult ex = reference_registry().create("turbo:bc=8,exp=exact")->attention(q, k, v, 0.35, {});
  CHECK(sas.p.col(5).isZero());
  CHECK(ex.p.col(5).isZero());  // e^{-17} of the tile max (1) is below 1/238: its P8 code rounds to 0
  CHECK((sas.p.col(3).array() > 0).all());
  // O = sum_j p_j sV(block j) V8_j, the FP32 accumulation aside
  const TestBlocks kb = prefill_key_blocks(k, v, 8);
  RowMatrixXd vd(30, 3);
  for (std::size_t b = 0; b + 1 < kb.begin.size(); ++b)
    for (Eigen::Index j = kb.begin[b]; j < kb.begin[b + 1]; ++j) vd.row(j) = kb.v8.row(j).cast<double>() * kb.sv[b];
  CHECK((sas.p * vd - sas.o).cwiseAbs().maxCoeff() <= 1e-5);
  CHECK((sas.p.rowwise().sum().array() - 1).abs().maxCoeff() <= 30 * 0.5 / 119 * 1.01);
}

TEST_CASE("turbo: head-wise precision gives the n_h lowest-priority heads 2 bits", "[turbo]") {
  std::mt19937_64 g(46);
  std::vector<RowMatrixXd> q, k, v;
  for (int h = 0; h < 3; ++h) {
    q.push_back(random_matrix(70, 8, 1.0, g));
    k.push_back(random_matrix(70, 8, 1.0 + h, g));  // priority grows with h
    v.push_back(random_matrix(70, 3, 1.0, g));
  }
  const auto m = reference_registry().create("turbo@decode:nh=1,bc=16,prefill-len=48");
  const std::vector<AttentionResult> r = m->attention_heads(views(q), views(k), views(v), 0.3, {});
  TurboParams p;
  p.mode = TurboMode::decode;
  p.block_c = 16;
  p.prefill_len = 48;
  p.sas.half = true;
  CHECK(r[0].o == turbo_attention(q[0], k[0], v[0], 0.3, {}, p, 2).o);
  CHECK(r[1].o == turbo_attention(q[1], k[1], v[1], 0.3, {}, p, 4).o);
  CHECK(r[2].o == turbo_attention(q[2], k[2], v[2], 0.3, {}, p, 4).o);
  CHECK(r[0].o != turbo_attention(q[0], k[0], v[0], 0.3, {}, p, 4).o);
}

TEST_CASE("turbo with nh > 0 declares its heads dependent, and they are: a head's O changes with its neighbours",
          "[turbo]") {
  const Registry& r = ref::reference_registry();
  CHECK(r.traits(parse_method_spec("turbo:mode=decode")).heads_independent);
  REQUIRE_FALSE(r.traits(parse_method_spec("turbo:mode=decode,nh=1")).heads_independent);
  // decode at 4 bits: the head of least priority (smallest spread) drops to 2 bits when evaluated with the others
  std::mt19937_64 g(109);
  std::vector<RowMatrixXd> q, k, v;
  for (int h = 0; h < 3; ++h) {
    const double s = 0.25 + h;
    q.push_back(qattn::test::random_matrix(4, 16, s, g)), k.push_back(qattn::test::random_matrix(40, 16, s, g));
    v.push_back(qattn::test::random_matrix(40, 8, s, g));
  }
  const auto m = r.create("turbo:mode=decode,nh=1");
  const std::vector<AttentionResult> together = m->attention_heads(views(q), views(k), views(v), 0.25, {});
  bool some_head_differs = false;
  for (std::size_t h = 0; h < 3; ++h) some_head_differs |= together[h].o != m->attention(q[h], k[h], v[h], 0.25, {}).o;
  CHECK(some_head_differs);
}
