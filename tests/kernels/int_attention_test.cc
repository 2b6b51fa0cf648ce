// The bit-exact ladder of the fused IntAttention pipeline: every ISA variant this CPU can run == the scalar spec
// (per kernel family, with the builder-style testers below) == the reference model (reference/int_pipelines.h).
// Sizes sit around the tiles (equal, smaller, larger, not a multiple); variants the CPU lacks are reported and
// skipped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "support/random_matrix.h"
#include "support/test_scale.h"
#include "qattn/exp_f32.h"
#include "qattn/int_attention.h"
#include "qattn/kernel_variants.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/registry.h"

using namespace qattn;
using qattn::test::random_matrix;

namespace {

// Builder-style tester of the GEMM families: random A (s8 for qk, u8 for pv, extremes included), random B packed,
// every variant against the plain triple loop over the unpacked operands.
class GemmTester {
 public:
  GemmTester& rows(Eigen::Index r) { rows_ = r; return *this; }
  GemmTester& k(Eigen::Index k) { k_ = k; return *this; }
  GemmTester& n(Eigen::Index n) { n_ = n; return *this; }
  GemmTester& seed(unsigned s) { seed_ = s; return *this; }

  void Test(bool pv) const {
    std::mt19937 g(seed_);
    std::uniform_int_distribution<int> s8(-128, 127), u8(0, 255);
    const Eigen::Index k4 = (k_ + 3) / 4 * 4, n16 = (n_ + 15) / 16 * 16;
    std::vector<std::uint8_t> a(rows_ * k4, 0);
    std::vector<std::int8_t> src(pv ? k_ * n_ : n_ * k_);  // pv: V [k, n]; qk: K [n, k]
    for (Eigen::Index i = 0; i < rows_; ++i)
      for (Eigen::Index t = 0; t < k_; ++t) a[i * k4 + t] = static_cast<std::uint8_t>(pv ? u8(g) : s8(g));
    for (auto& x : src) x = static_cast<std::int8_t>(s8(g));
    if (rows_ > 0 && k_ > 0) a[0] = pv ? 255 : 0x80, src[0] = -128;  // the extremes
    // Garbage where the packers must write: every padding byte and sum is theirs to set.
    std::vector<std::int8_t> packed(k4 * n16, std::int8_t{0x55});
    std::vector<std::int32_t> sum(n16, 12345);
    if (pv) kernels::pack_v(src.data(), k_, n_, k4, n16, packed.data(), sum.data());
    else kernels::pack_k_transposed(src.data(), n_, k_, k4, n16, packed.data(), sum.data());
    std::vector<std::int32_t> expect(rows_ * n16, 0);
    for (Eigen::Index i = 0; i < rows_; ++i)
      for (Eigen::Index c = 0; c < n_; ++c) {
        std::int64_t acc = 0;
        for (Eigen::Index t = 0; t < k_; ++t) {
          const int av = pv ? int{a[i * k4 + t]} : int{static_cast<std::int8_t>(a[i * k4 + t])};
          acc += av * (pv ? src[t * n_ + c] : src[c * k_ + t]);
        }
        expect[i * n16 + c] = static_cast<std::int32_t>(acc);
      }
    for (const kernels::KernelVariant& v : kernels::kernel_variants()) {  // every row of the one table
      if (!isa_available(v.isa)) {
        WARN("skipped: " << (pv ? v.pv_name : v.qk_name) << " (this CPU lacks " << isa_name(v.isa) << ")");
        continue;
      }
      std::vector<std::int32_t> c(rows_ * n16, -1);
      (pv ? v.pv : v.qk)({a.data(), rows_, k4, packed.data(), sum.data(), n16, c.data()});
      INFO((pv ? v.pv_name : v.qk_name) << " rows " << rows_ << " k " << k_ << " n " << n_);
      CHECK(c == expect);
      if (pv || !v.qk_row_max) continue;
      // The row maxima of the epilogue: every row sees the true columns (n_, not the padding), or a causal staircase
      // that starts before the first column, inside the tiles, or past the last.
      for (const Eigen::Index first : {n_, Eigen::Index{-3}, Eigen::Index{5}, n_ / 2, n_ + 7})
        for (const Eigen::Index step : {0, 1}) {
          kernels::GemmArgs args{a.data(), rows_, k4, packed.data(), sum.data(), n16, c.data()};
          std::vector<std::int32_t> lanes(rows_ * 16, 0x5A5A5A5A);
          args.row_max = lanes.data();
          args.visible = first, args.visible_step = step, args.visible_cap = n_;
          std::fill(c.begin(), c.end(), -1);
          v.qk(args);
          CHECK(c == expect);
          for (Eigen::Index i = 0; i < rows_; ++i) {
            const Eigen::Index limit = args.limit(i);
            std::int32_t want = std::numeric_limits<std::int32_t>::min();
            for (Eigen::Index j = 0; j < limit; ++j) want = std::max(want, expect[i * n16 + j]);
            INFO("row " << i << " visible " << first << " step " << step << " limit " << limit);
            CHECK(*std::max_element(lanes.begin() + i * 16, lanes.begin() + (i + 1) * 16) == want);
          }
        }
    }
  }

 private:
  Eigen::Index rows_ = 1, k_ = 4, n_ = 16;
  unsigned seed_ = 1;
};

// Builder-style tester of the IndexSoftmax row family: one row of int32 logits (a spread around the clip, ties at
// the maximum, the int32 extremes of the documented range), every rule combination, each variant against the scalar
// spec, the bytes past `limit` included. `alias` passes the logits row itself as the scratch (allowed by kernels.h).
class SoftmaxRowTester {
 public:
  SoftmaxRowTester& keys(Eigen::Index n) { keys_ = n; return *this; }
  SoftmaxRowTester& limit(Eigen::Index n) { limit_ = n; return *this; }
  SoftmaxRowTester& c_int(std::int64_t c) { c_int_ = c; return *this; }
  SoftmaxRowTester& spread(std::int64_t s) { spread_ = s; return *this; }
  SoftmaxRowTester& offset(std::int64_t o) { offset_ = o; return *this; }
  SoftmaxRowTester& padding(bool p) { padding_ = p; return *this; }

  void Test() const {
    std::mt19937_64 g(static_cast<std::uint64_t>(keys_ * 7919 + limit_ * 31 + c_int_));
    std::uniform_int_distribution<std::int64_t> logit(-spread_, spread_);
    std::vector<std::int32_t> row(keys_);
    for (auto& x : row) x = static_cast<std::int32_t>(offset_ + logit(g));
    if (keys_ > 2) row[keys_ - 1] = row[0];  // a tie, wherever the maximum is
    std::bernoulli_distribution keep(0.7);
    std::unique_ptr<bool[]> valid(new bool[std::max<Eigen::Index>(keys_, 1)]);
    for (Eigen::Index j = 0; j < keys_; ++j) valid[j] = keep(g);
    const bool* mask = padding_ ? valid.get() : nullptr;
    for (const int bits : {1, 2, 3, 5, 6, 7, 8})
      for (const IndexRule rule : {IndexRule::floor, IndexRule::round, IndexRule::floor_f32, IndexRule::q26_round, IndexRule::q26_floor})
        for (const Normalization norm : {Normalization::floor, Normalization::f32_rne, Normalization::q8_reciprocal})
          for (const PFormat format : {PFormat::u8, PFormat::s8}) {
            if (norm == Normalization::q8_reciprocal && format != PFormat::u8) continue;  // undefined: validate() refuses it
            IndexSoftmaxParams params;
            params.bits = bits;
            params.index_rule = rule;
            params.normalization = norm;
            params.p_format = format;
            params.lut_rounding = bits % 2 ? LutRounding::floor : LutRounding::round;
            const kernels::IndexSoftmaxTables t = kernels::IndexSoftmaxTables::make(params, c_int_);
            std::vector<std::uint8_t> expect(keys_, 0xAB);
            kernels::index_softmax_s32_u8__scalar(row.data(), mask, limit_, keys_, t, expect.data());
            for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
              if (!isa_available(v.isa)) {
                WARN("skipped: " << v.softmax_name << " (this CPU lacks " << isa_name(v.isa) << ")");
                continue;
              }
              std::vector<std::uint8_t> p(keys_, 0xCD);
              v.softmax(row.data(), mask, limit_, keys_, t, p.data());
              INFO(v.softmax_name << " keys " << keys_ << " limit " << limit_ << " c_int " << c_int_ << " spread " << spread_
                          << " padding " << padding_ << " b " << bits << " rule " << static_cast<int>(rule) << " norm "
                          << static_cast<int>(norm) << " p " << static_cast<int>(format));
              CHECK(p == expect);
              if (!v.softmax_given_max || mask) continue;
              // The same row with its maximum handed over (from Q.K^T's epilogue in the fused driver).
              std::int32_t m = std::numeric_limits<std::int32_t>::min();
              for (Eigen::Index j = 0; j < std::clamp<Eigen::Index>(limit_, 0, keys_); ++j) m = std::max(m, row[j]);
              std::fill(p.begin(), p.end(), std::uint8_t{0xCD});
              v.softmax_given_max(row.data(), limit_, keys_, t, m, p.data());
              INFO("given the maximum " << m);
              CHECK(p == expect);
            }
          }
  }

 private:
  Eigen::Index keys_ = 16, limit_ = 16;
  std::int64_t c_int_ = 1000, spread_ = 2000, offset_ = 0;
  bool padding_ = false;
};

// Builder-style tester of the whole fused pipeline: every available ISA, 1 and 2 threads, against the reference
// model int_attention (and so against each other).
class IntAttentionTester {
 public:
  IntAttentionTester& lq(Eigen::Index n) { lq_ = n; return *this; }
  IntAttentionTester& lk(Eigen::Index n) { lk_ = n; return *this; }
  IntAttentionTester& d(Eigen::Index n) { d_ = n; return *this; }
  IntAttentionTester& dv(Eigen::Index n) { dv_ = n; return *this; }
  IntAttentionTester& preset(const std::string& spec) { spec_ = spec; return *this; }
  IntAttentionTester& causal(bool c) { causal_ = c; return *this; }
  IntAttentionTester& padding(bool p) { padding_ = p; return *this; }
  IntAttentionTester& block_rows(Eigen::Index b) { block_rows_ = b; return *this; }
  IntAttentionTester& s_rows(Eigen::Index n) { s_rows_ = n; return *this; }
  IntAttentionTester& sigma(double s) { sigma_ = s; return *this; }
  IntAttentionTester& quant_only(bool b) { quant_only_ = b; return *this; }

  void Test() const {
    std::mt19937_64 g(lq_ * 131 + lk_ * 7 + d_);
    const RowMatrixXd q = random_matrix(lq_, d_, sigma_, g), k = random_matrix(lk_, d_, sigma_, g),
                      v = random_matrix(lk_, dv_, 1.0, g);
    const IndexSoftmaxParams params =
        ref::index_softmax_params(ref::reference_registry().resolve(parse_method_spec("index" + spec_)));
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_));
    AttentionMask mask;
    mask.causal = causal_;
    RowMatrixXb valid;
    if (padding_) {
      std::bernoulli_distribution keep(0.8);
      valid.resize(lq_, lk_);
      for (Eigen::Index i = 0; i < valid.size(); ++i) valid.data()[i] = keep(g);
      if (lq_ > 1) valid.row(1).setConstant(false);  // a fully masked row
      mask.valid = valid;
    }
    const RowMatrixXd expect =
        quant_only_ ? ref::quant_only_attention(q, k, v, scale, mask, ref::QuantOnlySoftmax::lanes16).o
                    : ref::int_attention(q, k, v, scale, mask, params, ref::CintEvaluation::f64).o;
    std::ostringstream what;
    what << (quant_only_ ? "quant-only" : "index" + spec_) << " lq " << lq_ << " lk " << lk_ << " d " << d_ << " dv "
         << dv_ << " causal " << causal_ << " padding " << padding_ << " B_r " << block_rows_ << " S rows " << s_rows_;
    for (const Isa isa : available_isas())
      for (const int threads : {1, 2})
        for (const bool materialise : {false, true}) {
          IntAttentionConfig cfg;
          cfg.materialise = materialise;
          cfg.pipeline = quant_only_ ? IntPipeline::quant_only : IntPipeline::intattention;
          cfg.softmax = params;
          cfg.isa = isa;
          cfg.threads = threads;
          cfg.block_rows = block_rows_;
          cfg.s_rows = s_rows_;
          cfg.causal = causal_;
          cfg.valid = padding_ ? valid.data() : nullptr;
          INFO(what.str() << " isa " << isa_name(isa) << " threads " << threads << " materialise " << materialise);
          CHECK(int_attention_fused(q, k, v, scale, cfg) == expect);
        }
  }

 private:
  Eigen::Index lq_ = 8, lk_ = 8, d_ = 64, dv_ = 64, block_rows_ = 0, s_rows_ = 0;  // 0: the library's choice
  std::string spec_ = "@upstream-neon";
  bool causal_ = false, padding_ = false, quant_only_ = false;
  double sigma_ = 1.0;
};

}  // namespace

TEST_CASE("qk and pv GEMM variants equal the triple loop around their tiles", "[kernels]") {
  for (const bool pv : {false, true})
    for (const Eigen::Index rows : {1, 2, 3, 4, 5, 8, 9, 12, 17})
      for (const Eigen::Index k : {0, 1, 3, 4, 5, 64, 67, 128})
        for (const Eigen::Index n : {1, 15, 16, 17, 32, 33, 48, 70, 100})
          GemmTester().rows(rows).k(k).n(n).seed(static_cast<unsigned>(rows * 1000 + k * 10 + n)).Test(pv);
  // The AVX-512 tiles' k blocks (256) and their biased Q copy (a per-thread buffer that grows to any block):
  // k across several blocks with a tail, under the 8-, 4- and 1-row tiles and the 48-, 32- and 16-column panels
  // (P.V's 8-row tiles add each block's products to C's partial sums in their own loop), and Q blocks at and past
  // 2^16 bytes.
  for (const bool pv : {false, true}) {
    GemmTester().rows(5).k(2052).n(33).seed(7).Test(pv);
    GemmTester().rows(17).k(1028).n(100).seed(10).Test(pv);  // 8 + 8 + 1 rows; panels 48, 48, 16
    GemmTester().rows(16).k(260).n(32).seed(11).Test(pv);
    GemmTester().rows(12).k(516).n(16).seed(12).Test(pv);  // 8 + 4 rows
    GemmTester().rows(70).k(1024).n(48).seed(8).Test(pv);
    GemmTester().rows(64).k(1024).n(17).seed(9).Test(pv);  // exactly 2^16 bytes of Q: the copy
    // AMX: pairs of 16-row tiles and a single one, the rows past the last 16 under their own tile configuration,
    // 32- and 16-column panels, k in chunks of 64 with a tail read from zero-padded copies.
    GemmTester().rows(48).k(100).n(48).seed(13).Test(pv);
    GemmTester().rows(47).k(192).n(80).seed(14).Test(pv);
    GemmTester().rows(33).k(4116).n(129).seed(15).Test(pv);
  }
}

TEST_CASE("packing in key ranges writes the bytes and sums of packing whole", "[kernels]") {
  // The fused driver packs K^T and V in ranges on its workers (pipeline.cc): ranges of 4, 8 and 64 keys (the last
  // one with a partial group of 4 keys where keys % 4 != 0), d with and without a tail of d % 4 bytes, into buffers
  // full of garbage; whole and in ranges, each against the layout written from its definition.
  std::mt19937 g(21);
  std::uniform_int_distribution<int> s8(-128, 127);
  for (const Eigen::Index keys : {1, 5, 8, 67, 130})
    for (const Eigen::Index d : {1, 3, 16, 37}) {
      const Eigen::Index d4 = (d + 3) / 4 * 4, keys16 = (keys + 15) / 16 * 16 + 16, d16 = (d + 15) / 16 * 16;
      std::vector<std::int8_t> src(static_cast<std::size_t>(keys * d));
      for (auto& x : src) x = static_cast<std::int8_t>(s8(g));
      // The layout of kernels.h from its definition: byte t % 4 of group t / 4 of key j, zeros everywhere else.
      std::vector<std::int8_t> expect_k(d4 * keys16, 0), expect_v(keys16 * d16, 0);
      std::vector<std::int32_t> expect_ks(keys16, 0), expect_vs(d16, 0);
      for (Eigen::Index j = 0; j < keys; ++j)
        for (Eigen::Index t = 0; t < d; ++t) {
          const std::int8_t x = src[j * d + t];
          expect_k[((t / 4) * keys16 + j) * 4 + t % 4] = x;  // K [keys, d]: K^T's groups along d
          expect_v[((j / 4) * d16 + t) * 4 + j % 4] = x;     // V [keys, d]: groups along the keys
          expect_ks[j] += x, expect_vs[t] += x;
        }
      std::vector<std::int8_t> whole_k(d4 * keys16, 0x55), whole_v(keys16 * d16, 0x55);
      std::vector<std::int32_t> whole_ks(keys16, 7), whole_vs(d16, 7);
      kernels::pack_k_transposed(src.data(), keys, d, d4, keys16, whole_k.data(), whole_ks.data());
      kernels::pack_v(src.data(), keys, d, keys16, d16, whole_v.data(), whole_vs.data());
      INFO("keys " << keys << " d " << d);
      CHECK(whole_k == expect_k);
      CHECK(whole_ks == expect_ks);
      CHECK(whole_v == expect_v);
      CHECK(whole_vs == expect_vs);
      // Ranges first to last and last to first: a range that writes into another's bytes is caught in one order.
      for (const Eigen::Index step : {4, 8, 64})
        for (const bool forward : {true, false}) {
          INFO("ranges of " << step << (forward ? ", first to last" : ", last to first"));
          std::vector<std::int8_t> parts_k(d4 * keys16, 0x55), parts_v(keys16 * d16, 0x55);
          std::vector<std::int32_t> parts_ks(keys16, 7), parts_vs(d16, 0);
          kernels::pack_k_padding(keys, d4, keys16, parts_k.data(), parts_ks.data());
          kernels::pack_v_padding(keys, keys16, d16, parts_v.data());
          const Eigen::Index count = (keys + step - 1) / step;
          for (Eigen::Index r = 0; r < count; ++r) {
            const Eigen::Index b = (forward ? r : count - 1 - r) * step, e = std::min(keys, b + step);
            kernels::pack_k_keys(src.data(), b, e, d, keys16, parts_k.data(), parts_ks.data());
            std::vector<std::int32_t> part(static_cast<std::size_t>(d16), 0);
            kernels::pack_v_keys(src.data(), b, e, d, d16, parts_v.data(), part.data());
            for (Eigen::Index c = 0; c < d16; ++c) parts_vs[c] += part[c];
          }
          CHECK(parts_k == expect_k);
          CHECK(parts_ks == expect_ks);
          CHECK(parts_v == expect_v);
          CHECK(parts_vs == expect_vs);
        }
    }
}

TEST_CASE("fused IntAttention packs its key ranges on any number of threads with the bits of one", "[kernels]") {
  // 10241 keys: on 3 threads ranges of 3456, 3456 and 3329 keys, on 20 threads 17 ranges of 576 and a last of 449,
  // then two empty ones; a partial last group of 4 keys, d and d_v with tails. 9 queries are one block, so only
  // the packing runs on several threads.
  std::mt19937 g(5);
  std::uniform_int_distribution<int> s8(-127, 127);
  const Eigen::Index lq = 9, lk = 10241, d = 37, dv = 33;
  std::vector<std::int8_t> q(lq * d), k(lk * d), v(lk * dv);
  for (std::vector<std::int8_t>* x : {&q, &k, &v})
    for (std::int8_t& e : *x) e = static_cast<std::int8_t>(s8(g));
  // Each query meets its own copy among the keys, so that its row of P is peaked there: keys at the edges of the
  // ranges (575 | 576, 3455 | 3456, 6911 | 6912) and the last one, in the partial group.
  const Eigen::Index peaks[lq] = {0, 575, 576, 3455, 3456, 6911, 6912, 10239, 10240};
  for (Eigen::Index i = 0; i < lq; ++i) std::copy_n(q.data() + i * d, d, k.data() + peaks[i] * d);
  for (const Isa isa : available_isas()) {
    IntAttentionConfig cfg;
    cfg.isa = isa;
    std::vector<std::uint8_t> p(lq * lk);
    cfg.p_out = p.data();
    const auto run = [&](int threads) {
      cfg.threads = threads;
      std::vector<float> o(lq * dv);
      int_attention_fused({q.data(), lq, d, 0.02}, {k.data(), lk, d, 0.02}, {v.data(), lk, dv, 0.01}, 0.16, cfg, o.data());
      return std::make_pair(o, p);
    };
    const auto one = run(1);
    for (Eigen::Index i = 0; i < lq; ++i) CHECK(one.second[i * lk + peaks[i]] > 128);  // the peaks hold the rows
    for (const int threads : {3, 20}) {
      INFO(isa_name(isa) << " threads " << threads);
      CHECK(run(threads) == one);
    }
  }
}

TEST_CASE("IndexSoftmax row variants equal the scalar spec for every rule, length and clip", "[kernels]") {
  for (const Eigen::Index keys : {1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 128, 129, 200})
    SoftmaxRowTester().keys(keys).limit(keys).Test();
  SoftmaxRowTester().keys(200).limit(150).Test();           // the 64-logit steps with a causal limit
  SoftmaxRowTester().keys(48).limit(37).Test();             // a causal limit inside the row
  SoftmaxRowTester().keys(48).limit(0).Test();              // nothing visible
  SoftmaxRowTester().keys(40).limit(40).padding(true).Test();
  SoftmaxRowTester().keys(40).limit(40).c_int(1).Test();    // every non-maximum clips to the last entry
  SoftmaxRowTester().keys(40).limit(40).c_int(std::int64_t{1} << 30).spread((std::int64_t{1} << 30) - 1).Test();  // c_int 2^30, |m - a| < 2^31
  SoftmaxRowTester().keys(40).limit(40).c_int(2048383).spread(2048383).Test();  // 127^2 d at d = 127
  // Logits near INT32_MIN with c_int 2^30: m - c_int is below INT32_MIN (the AVX-512 Q26 path's lower bound saturates).
  SoftmaxRowTester().keys(70).limit(70).c_int(std::int64_t{1} << 30).spread(std::int64_t{1} << 28)
      .offset(std::numeric_limits<std::int32_t>::min() + (std::int64_t{1} << 28) + 2).Test();
  SoftmaxRowTester().keys(33).limit(33).c_int(5).spread(0).Test();  // all ties: E = 255 everywhere
  // The edges of the AVX-512 integer index paths (index_softmax_avx512.cc): the quotient path holds for c_int < 2^22
  // (2 c_int (T-1) + c_int < 2^31 at b = 8), the Q26 path while c_int q26 + 2^25 < 2^32 (at b = 6 until c_int ~ 2^26).
  for (const std::int64_t c : {(std::int64_t{1} << 22) - 1, std::int64_t{1} << 22, (std::int64_t{1} << 26) - 1,
                               std::int64_t{1} << 26, std::int64_t{1} << 27})
    SoftmaxRowTester().keys(40).limit(40).c_int(c).spread(c).Test();
}

TEST_CASE("group-wise index_exp variants equal the scalar spec for every rule, anchor and shifted table", "[kernels]") {
  // One key block: logits up to `spread` below the block maximum, an anchor at or above it (the global reading's
  // M_j), tables with the LUT shifted by an offset (the offset reading), lengths around every vector width.
  std::mt19937_64 g(1604);
  for (const Eigen::Index n : {1, 7, 8, 9, 16, 17, 33, 64, 100})
    for (const std::int64_t c_int : {std::int64_t{1}, std::int64_t{37}, std::int64_t{5000}, std::int64_t{1} << 23})
      for (const bool padding : {false, true}) {
        std::uniform_int_distribution<std::int32_t> logit(-3 * static_cast<std::int32_t>(std::min<std::int64_t>(c_int, 1 << 20)), 0);
        std::vector<std::int32_t> s(n);
        for (auto& x : s) x = logit(g) + 1000;
        const std::int32_t m = *std::max_element(s.begin(), s.end());
        std::unique_ptr<bool[]> valid(new bool[n]);
        for (Eigen::Index j = 0; j < n; ++j) valid[j] = j % 4 != 2;
        for (const int bits : {1, 3, 5, 8})
          for (const IndexRule rule : {IndexRule::floor, IndexRule::round, IndexRule::floor_f32, IndexRule::q26_round, IndexRule::q26_floor})
            for (const std::int64_t lift : {std::int64_t{0}, std::int64_t{1}, c_int / 3, c_int}) {
              IndexSoftmaxParams params;
              params.bits = bits;
              params.index_rule = rule;
              kernels::IndexSoftmaxTables t = kernels::IndexSoftmaxTables::make(params, c_int);
              const int last = (1 << bits) - 1, shift = static_cast<int>(lift % (last + 1));
              for (int i = 0; i <= last; ++i) t.lut[i] = t.lut[std::min(i + shift, last)];
              const std::int32_t anchor = static_cast<std::int32_t>(m + lift);
              std::vector<std::uint8_t> expect(n, 0xAB);
              const std::int64_t sum = kernels::index_exp_s32_u8__scalar(s.data(), padding ? valid.get() : nullptr, n,
                                                                         anchor, t, expect.data());
              std::int64_t check = 0;
              for (Eigen::Index j = 0; j < n; ++j) check += expect[j];
              REQUIRE(sum == check);
              for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
                if (!isa_available(v.isa)) continue;
                std::vector<std::uint8_t> e(n, 0xCD);
                INFO(v.index_exp_name << " n " << n << " c_int " << c_int << " b " << bits << " rule "
                                      << to_string(rule) << " lift " << lift << " padding " << padding);
                CHECK(v.index_exp(s.data(), padding ? valid.get() : nullptr, n, anchor, t, e.data()) == sum);
                CHECK(e == expect);
              }
            }
      }
}

TEST_CASE("float softmax row variants equal the scalar spec byte for byte", "[kernels]") {
  std::mt19937_64 g(31);
  for (const Eigen::Index keys : {1, 7, 15, 16, 17, 33, 100, 257}) {
    std::uniform_int_distribution<std::int32_t> logit(-40000, 40000);
    std::vector<std::int32_t> row(keys);
    for (auto& x : row) x = logit(g);
    std::unique_ptr<bool[]> valid(new bool[keys]);
    for (Eigen::Index j = 0; j < keys; ++j) valid[j] = j % 3 != 1;
    for (const bool padding : {false, true})
      for (const Eigen::Index limit : {keys, keys / 2}) {
        const bool* mask = padding ? valid.get() : nullptr;
        std::vector<float> scratch(keys);
        std::vector<std::uint8_t> expect(keys, 0xAB);
        kernels::softmax_s32_f32_u8__scalar(row.data(), mask, limit, keys, 2.5e-4f, scratch.data(), expect.data());
        for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
          if (!isa_available(v.isa)) continue;
          std::vector<std::uint8_t> p(keys, 0xCD);
          v.softmax_f32(row.data(), mask, limit, keys, 2.5e-4f, scratch.data(), p.data());
          INFO(v.softmax_f32_name << " keys " << keys << " limit " << limit << " padding " << padding);
          CHECK(p == expect);
        }
      }
  }
  // The order of the sum shows in P only where 127 e / total lands within a rounding of a half. Rows of six entries
  // with e in [0.05, 1] among many with e near 2^-23, about half an ulp of a running sum near 3 but not of the lanes
  // that hold only them: the 16 partial sums then differ from other orders by a few ulps, and over 40000 rows some
  // bytes flip under another order (the count of those against one running sum is checked, so the test can see it).
  std::size_t differ = 0;
  for (const Eigen::Index keys : {64, 100}) {
    std::uniform_int_distribution<std::int32_t> near(-10000, 0), far(-53500, -53000);
    std::uniform_int_distribution<Eigen::Index> where(0, keys - 1);
    std::vector<std::int32_t> row(keys);
    std::vector<float> scratch(keys);
    std::vector<std::uint8_t> expect(keys), p(keys);
    const float alpha = 3.0e-4f;
    std::map<std::string, int> mismatched_rows;
    for (int trial = 0; trial < 20000; ++trial) {
      for (auto& x : row) x = far(g);
      for (int t = 0; t < 6; ++t) row[where(g)] = near(g);
      kernels::softmax_s32_f32_u8__scalar(row.data(), nullptr, keys, keys, alpha, scratch.data(), expect.data());
      for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
        if (!isa_available(v.isa)) continue;
        v.softmax_f32(row.data(), nullptr, keys, keys, alpha, scratch.data(), p.data());
        mismatched_rows[std::string(v.softmax_f32_name)] += p != expect;
      }
      float m = -std::numeric_limits<float>::infinity(), total = 0;
      for (const std::int32_t x : row) m = std::max(m, static_cast<float>(x) * alpha);
      for (const std::int32_t x : row) total += exp_f32_poly(static_cast<float>(x) * alpha - m);
      for (Eigen::Index j = 0; j < keys; ++j)
        differ += static_cast<std::uint8_t>(std::nearbyint(127.0f * (exp_f32_poly(static_cast<float>(row[j]) * alpha - m) / total))) != expect[j];
    }
    for (const auto& [name, n] : mismatched_rows) {
      INFO(name << " keys " << keys << ": rows whose P differs from the spec's");
      CHECK(n == 0);
    }
  }
  INFO(differ << " bytes of the 40000 rows differ between the spec's order and one running sum");
  CHECK(differ > 0);
}

TEST_CASE("dequantise variants equal the scalar spec bit for bit", "[kernels]") {
  // Accumulators across int32 (the extremes included), scales whose products round (a ratio of primes, a tiny and a
  // huge one), both P scales, column counts around every vector width, strides wider than the row.
  std::mt19937_64 g(2417);
  std::uniform_int_distribution<std::int32_t> any;
  for (const Eigen::Index cols : {1, 7, 8, 9, 15, 16, 17, 64, 100})
    for (const double out_scale : {1.0 / 3.0, 0.0123456789, 3.7e-300, 1.9e300})
      for (const int p_scale : {127, 255}) {
        const Eigen::Index rows = 3, acc_stride = cols + 5, o_stride = cols + 3;
        std::vector<std::int32_t> acc(static_cast<std::size_t>(rows * acc_stride));
        for (auto& x : acc) x = any(g);
        acc[0] = std::numeric_limits<std::int32_t>::min();
        acc[1 % cols] = std::numeric_limits<std::int32_t>::max();
        std::vector<float> expect(static_cast<std::size_t>(rows * o_stride), -1.0f);
        kernels::dequantise_s32_f32__scalar(acc.data(), rows, cols, acc_stride, out_scale, p_scale, expect.data(), o_stride);
        for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
          if (!isa_available(v.isa)) continue;
          std::vector<float> o(expect.size(), -1.0f);
          v.dequantise(acc.data(), rows, cols, acc_stride, out_scale, p_scale, o.data(), o_stride);
          INFO(v.dequantise_name << " cols " << cols << " out_scale " << out_scale << " p_scale " << p_scale);
          CHECK(std::memcmp(o.data(), expect.data(), o.size() * sizeof(float)) == 0);  // bits, and -1 past each row
        }
      }
  // Quotients within a few double ulps of a float rounding midpoint, where a rounding left out or taken in another
  // order (acc * (out_scale / p_scale), an FMA, float arithmetic) shows in the float result: out_scale =
  // m p_scale / acc for a midpoint m between two floats.
  for (const int p_scale : {127, 255}) {
    const Eigen::Index cols = 64;
    std::vector<std::int32_t> acc(cols);
    std::vector<float> expect(cols), o(cols);
    std::uniform_int_distribution<std::int32_t> magnitude(1, 1 << 24);
    std::uniform_real_distribution<float> value(0.001f, 1000.0f);
    for (int trial = 0; trial < 64; ++trial) {
      for (auto& x : acc) x = magnitude(g) * (any(g) < 0 ? -1 : 1);
      const float f = value(g);
      const double midpoint = (static_cast<double>(f) + std::nextafter(f, 2000.0f)) / 2;
      const double out_scale = midpoint * p_scale / std::abs(static_cast<double>(acc[0]));
      kernels::dequantise_s32_f32__scalar(acc.data(), 1, cols, cols, out_scale, p_scale, expect.data(), cols);
      for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
        if (!isa_available(v.isa)) continue;
        v.dequantise(acc.data(), 1, cols, cols, out_scale, p_scale, o.data(), cols);
        INFO(v.dequantise_name << " near a midpoint, out_scale " << out_scale << " p_scale " << p_scale);
        CHECK(std::memcmp(o.data(), expect.data(), o.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("the kernel variant table: one row per ISA, names by family, MAC loops that run", "[kernels]") {
  std::vector<Isa> seen;
  for (const kernels::KernelVariant& v : kernels::kernel_variants()) {
    INFO(isa_name(v.isa));
    CHECK(std::find(seen.begin(), seen.end(), v.isa) == seen.end());
    seen.push_back(v.isa);
    CHECK(v.qk_name.rfind("qk_s8s8_s32__", 0) == 0);
    CHECK(v.pv_name.rfind("pv_u8s8_s32__", 0) == 0);
    CHECK(v.softmax_name.rfind("index_softmax_s32_u8__", 0) == 0);
    CHECK(v.index_exp_name.rfind("index_exp_s32_u8__", 0) == 0);
    CHECK(v.softmax_f32_name.rfind("softmax_s32_f32_u8__", 0) == 0);
    CHECK(v.dequantise_name.rfind("dequantise_s32_f32__", 0) == 0);
    CHECK(v.mac_loop_name.rfind("mac_loop__", 0) == 0);
    CHECK((v.qk && v.pv && v.softmax && v.index_exp && v.softmax_f32 && v.dequantise && v.mac_loop));
    // The row maximum moves into Q.K^T's epilogue as a pair, or not at all.
    CHECK(v.qk_row_max == (v.softmax_given_max != nullptr));
    CHECK((v.softmax_given_max ? v.softmax_given_max_name.rfind("index_softmax_max_s32_u8__", 0) == 0
                               : v.softmax_given_max_name.empty()));
    CHECK(&kernels::kernel_variant(v.isa) == &v);
    if (!isa_available(v.isa)) continue;
    std::int32_t c1 = -1, c2 = -2;
    const std::int64_t macs = v.mac_loop(3, &c1);
    CHECK(macs > 0);
    CHECK(v.mac_loop(3, &c2) == macs);
    CHECK(c1 == c2);
    CHECK(v.mac_loop(0, &c1) == 0);
  }
  CHECK(seen.front() == Isa::scalar);
  CHECK(available_isas().front() == Isa::scalar);
  if (!std::getenv("QATTN_ISA")) CHECK(default_isa() == available_isas().back());
}

TEST_CASE("fused IntAttention equals the reference model on every ISA, thread count and preset", "[kernels]") {
  std::cout << "ISAs available here:";
  for (Isa isa : available_isas()) std::cout << " " << isa_name(isa);
  std::cout << "\n";
  for (const char* preset : {"@paper", "@upstream-sim", "@upstream-neon", ":p=s8", ":b=2", ":b=8,index=round,norm=f32-rne", "@upstream-neon:b=3,index=q26-floor"})
    for (const Eigen::Index d : {64, 80, 96, 128, 256})
      IntAttentionTester().preset(preset).d(d).dv(d).lq(19).lk(37).Test();
  // 256 and 500: the key stride n (pipeline.cc's key_stride) gets 16 zero columns past round_up(L_k, 16) = 256, 512.
  for (const Eigen::Index lk : {1, 15, 16, 17, 64, 65, 200, 256, 500})
    for (const bool causal : {false, true})
      IntAttentionTester().lq(23).lk(lk).d(80).dv(33).causal(causal).block_rows(8).Test();
  IntAttentionTester().lq(40).lk(31).d(64).dv(16).causal(true).padding(true).block_rows(16).Test();
  // Slices of S within a block (each slice its own Q.K^T call and softmax rows, one P.V per block): slices that do
  // and do not divide the block, causal with padding, and the last block shorter than a slice.
  // Without padding the AVX-512 VNNI rows take each slice's maxima from its Q.K^T epilogue (causal: the slice's
  // first visible key).
  for (const Eigen::Index s_rows : {1, 5, 16}) {
    IntAttentionTester().lq(70).lk(45).d(64).dv(16).causal(true).padding(true).block_rows(32).s_rows(s_rows).Test();
    for (const bool causal : {false, true})
      IntAttentionTester().lq(70).lk(83).d(64).dv(16).causal(causal).block_rows(32).s_rows(s_rows).Test();
  }
  IntAttentionTester().lq(1).lk(1).d(1).dv(1).Test();
  // Block rows chosen from L_k: 16500 keys (16512 rounded up to 16) give 24 rows (S within 2 MiB), so 50 queries are blocks of
  // 24, 24 and 2.
  for (const bool causal : {false, true}) IntAttentionTester().lq(50).lk(16500).d(16).dv(16).causal(causal).Test();
  // K^T and V packed in two key ranges on 2 threads (pipeline.cc): 576 and 451 keys, the last group of 4 keys
  // partial, d and d_v with tails.
  IntAttentionTester().lq(9).lk(1027).d(37).dv(33).Test();
  IntAttentionTester().lq(5).lk(9).d(1).dv(3).sigma(30).Test();  // c_int from large scales: small
  IntAttentionTester().lq(5).lk(9).d(8).dv(3).sigma(1e-9).Test();  // tiny scales: c_int saturates at 2^30
}

TEST_CASE("fused Quant-Only equals the reference model (lanes16 softmax) on every ISA and thread count", "[kernels]") {
  for (const Eigen::Index d : {64, 80, 128})
    IntAttentionTester().quant_only(true).d(d).dv(d).lq(19).lk(37).Test();
  for (const Eigen::Index lk : {1, 15, 16, 17, 65, 300})
    for (const bool causal : {false, true})
      IntAttentionTester().quant_only(true).lq(23).lk(lk).d(80).dv(33).causal(causal).block_rows(8).Test();
  IntAttentionTester().quant_only(true).lq(40).lk(31).d(64).dv(16).causal(true).padding(true).block_rows(16).Test();
  IntAttentionTester().quant_only(true).lq(70).lk(45).d(64).dv(16).causal(true).block_rows(32).s_rows(5).Test();
  IntAttentionTester().quant_only(true).lq(7).lk(50).d(16).dv(4).sigma(8).Test();  // peaked rows: e underflow region
}

TEST_CASE("fused IntAttention at L_k = 70000: row sums beyond 16 bits, no overflow", "[kernels]") {
  const Eigen::Index lk = std::max(2000, qattn::test::scaled(70000, 2000));
  qattn::test::announce_scale("L_k = 70000 case, keys", static_cast<int>(lk));
  std::mt19937_64 g(9);
  const RowMatrixXd q = RowMatrixXd::Zero(3, 16), k = random_matrix(lk, 16, 1.0, g), v = random_matrix(lk, 8, 1.0, g);
  // Q = 0: every logit ties, E = 255 everywhere, S = 255 L_k (> 2^16 from L_k = 258 on).
  const IndexSoftmaxParams params =
      ref::index_softmax_params(ref::reference_registry().resolve(parse_method_spec("index@paper")));
  const RowMatrixXd expect = ref::int_attention(q, k, v, 0.25, {}, params, ref::CintEvaluation::f64).o;
  for (const Isa isa : available_isas()) {
    IntAttentionConfig cfg;
    cfg.softmax = params;
    cfg.isa = isa;
    INFO(isa_name(isa));
    CHECK(int_attention_fused(q, k, v, 0.25, cfg) == expect);
  }
}

TEST_CASE("ISA names, QATTN_ISA parsing and unavailable variants", "[kernels]") {
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avxvnni, Isa::avx512vnni, Isa::amx, Isa::neon_dotprod, Isa::neon_i8mm})
    CHECK(parse_isa(isa_name(isa)) == isa);
  CHECK(parse_isa("avx512") == Isa::avx512vnni);
  CHECK_THROWS_AS(parse_isa("sse2"), std::invalid_argument);
  CHECK(isa_available(Isa::scalar));
  CHECK(available_isas().front() == Isa::scalar);
  for (Isa isa : {Isa::avx2, Isa::avxvnni, Isa::avx512vnni, Isa::amx, Isa::neon_dotprod, Isa::neon_i8mm})
    if (!isa_available(isa)) {
      IntAttentionConfig cfg;
      cfg.isa = isa;
      CHECK_THROWS_AS(int_attention_fused(RowMatrixXd::Ones(2, 4), RowMatrixXd::Ones(3, 4), RowMatrixXd::Ones(3, 2), 0.5, cfg),
                      std::invalid_argument);
    }
}

TEST_CASE("fused IntAttention refuses negative block and slice rows and thread counts below 1", "[kernels]") {
  IntAttentionConfig cfg;
  cfg.block_rows = -1;
  CHECK_THROWS_AS(int_attention_fused(RowMatrixXd::Ones(2, 4), RowMatrixXd::Ones(3, 4), RowMatrixXd::Ones(3, 2), 0.5, cfg),
                  std::invalid_argument);
  cfg.block_rows = 0;  // the library's choice
  cfg.s_rows = -1;
  CHECK_THROWS_AS(int_attention_fused(RowMatrixXd::Ones(2, 4), RowMatrixXd::Ones(3, 4), RowMatrixXd::Ones(3, 2), 0.5, cfg),
                  std::invalid_argument);
  cfg.s_rows = 0;
  cfg.threads = 0;
  CHECK_THROWS_AS(int_attention_fused(RowMatrixXd::Ones(2, 4), RowMatrixXd::Ones(3, 4), RowMatrixXd::Ones(3, 2), 0.5, cfg),
                  std::invalid_argument);
  cfg.threads = 1;
  CHECK(int_attention_fused(RowMatrixXd::Ones(2, 4), RowMatrixXd::Ones(3, 4), RowMatrixXd::Ones(3, 2), 0.5, cfg).rows() == 2);
}

TEST_CASE("the default block rows: 64 up to 8192 keys, S within 2 MiB above, AMX 64, an explicit value kept", "[kernels]") {
  const IntAttentionConfig automatic;
  CHECK(int_attention_block_rows(automatic, 0) == 64);  // no keys (no division by a zero width)
  CHECK(int_attention_block_rows(automatic, 1) == 64);
  CHECK(int_attention_block_rows(automatic, 8192) == 64);  // the key stride's 16 padding columns do not count
  CHECK(int_attention_block_rows(automatic, 8193) == 56);
  CHECK(int_attention_block_rows(automatic, 16384) == 32);
  CHECK(int_attention_block_rows(automatic, 16500) == 24);
  CHECK(int_attention_block_rows(automatic, 32768) == 16);
  CHECK(int_attention_block_rows(automatic, 1 << 20) == 16);  // at least 16
  IntAttentionConfig fixed;
  fixed.block_rows = 8;
  CHECK(int_attention_block_rows(fixed, 16384) == 8);
#if defined(QATTN_HAVE_X86_KERNELS)
  // AMX's own (kernel_variants.cc): blocks of 64 at every L_k, an explicit value still kept.
  IntAttentionConfig amx;
  amx.isa = Isa::amx;
  for (const Eigen::Index lk : {1, 4096, 16384, 1 << 20}) CHECK(int_attention_block_rows(amx, lk) == 64);
  amx.block_rows = 8;
  CHECK(int_attention_block_rows(amx, 16384) == 8);
#endif
}
