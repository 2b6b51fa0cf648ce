// Quantization primitives, packing, the KV-cache quantizers and the weight quantizers (docs/quantizers.md).
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "qattn/error.h"
#include "qattn/quantize.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/quant.h"
#include "qattn/reference/random.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/weight_quant.h"

using namespace qattn;
using namespace qattn::ref;

namespace {

RowMatrixXd normals(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double sigma = 1) {
  Normals g(seed);
  RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = sigma * g();
  return m;
}

}  // namespace

TEST_CASE("asymmetric INT8 golden: [-1, 0, 1, 3] -> scale 4/255, zero -64, codes [-128, -64, 0, 127]") {
  RowMatrixXd x(1, 4);
  x << -1, 0, 1, 3;
  const QuantizedMatrix q = quantize(x, QuantGrid{-128, 127, QuantMode::asymmetric}, Tiling{});
  CHECK(q.scale(0, 0) == 4.0 / 255);
  CHECK(q.zero(0, 0) == -64);
  CHECK(q.codes(0, 0) == -128);
  CHECK(q.codes(0, 1) == -64);
  CHECK(q.codes(0, 2) == 0);
  CHECK(q.codes(0, 3) == 127);
  const RowMatrixXd r = q.dequantize();
  CHECK(r(0, 0) == Approx(-1.0039).margin(5e-5));
  CHECK(r(0, 1) == 0.0);
  CHECK(r(0, 2) == Approx(1.0039).margin(5e-5));
  CHECK(r(0, 3) == Approx(2.9961).margin(5e-5));
}

TEST_CASE("symmetric INT8 golden: [-1, 0, 1, 3] -> scale 3/127, codes [-42, 0, 42, 127]") {
  RowMatrixXd x(1, 4);
  x << -1, 0, 1, 3;
  const QuantizedMatrix q = quantize(x, QuantGrid::symmetric_bits(8), Tiling{});
  CHECK(q.scale(0, 0) == 3.0 / 127);
  CHECK(q.codes(0, 0) == -42);
  CHECK(q.codes(0, 1) == 0);
  CHECK(q.codes(0, 2) == 42);
  CHECK(q.codes(0, 3) == 127);
}

TEST_CASE("rounding modes differ exactly at the half: 2.5 -> 2 (even) or 3 (away)") {
  CHECK(quant_round(2.5, QuantRounding::half_even) == 2);
  CHECK(quant_round(2.5, QuantRounding::half_away) == 3);
  CHECK(quant_round(-2.5, QuantRounding::half_away) == -3);
  CHECK(quant_round(-3.5, QuantRounding::half_even) == -4);
}

TEST_CASE("granularities: each tile's scale comes from its own entries only, error within half a step") {
  const RowMatrixXd x = normals(10, 12, 7);
  struct Case {
    Granularity gran;
    Eigen::Index g, tiles_r, tiles_c;
  };
  for (const Case& c : {Case{Granularity::tensor, 0, 1, 1}, Case{Granularity::channel, 0, 1, 12},
                        Case{Granularity::token, 0, 10, 1}, Case{Granularity::group, 5, 10, 3},
                        Case{Granularity::block, 4, 3, 1}}) {
    INFO(static_cast<int>(c.gran));
    const Tiling t = tiling_for(c.gran, c.g);
    for (const QuantGrid& grid : {QuantGrid::symmetric_bits(4), QuantGrid::unsigned_bits(4, QuantMode::asymmetric),
                                  QuantGrid::unsigned_bits(3, QuantMode::min_offset)}) {
      const QuantizedMatrix q = quantize(x, grid, t);
      REQUIRE(q.scale.rows() == c.tiles_r);
      REQUIRE(q.scale.cols() == c.tiles_c);
      const RowMatrixXd r = q.dequantize();
      const Eigen::Index tr = t.tile_rows ? t.tile_rows : x.rows(), tc = t.tile_cols ? t.tile_cols : x.cols();
      for (Eigen::Index i = 0; i < x.rows(); ++i)
        for (Eigen::Index j = 0; j < x.cols(); ++j) {
          const double s = q.scale(i / tr, j / tc);
          REQUIRE(std::fabs(r(i, j) - x(i, j)) <= 0.5 * s * (1 + 1e-12));
          // the tile's scale from its own entries: the symmetric one is max |x| over exactly that tile / q_max
          if (grid.mode == QuantMode::symmetric) {
            const Eigen::Index r0 = i / tr * tr, c0 = j / tc * tc;
            const auto tile = x.block(r0, c0, std::min(tr, x.rows() - r0), std::min(tc, x.cols() - c0));
            REQUIRE(s == tile.cwiseAbs().maxCoeff() / grid.q_max);
          }
        }
    }
  }
  CHECK_THROWS_AS(tiling_for(Granularity::group, 0), std::invalid_argument);
  CHECK_THROWS_AS(tiling_for(Granularity::block, 0), std::invalid_argument);
  CHECK(choice_names(kGranularities) == std::vector<std::string>{"tensor", "channel", "token", "group", "block"});
}

TEST_CASE("an all-zero tile quantizes to exact zeros, non-finite input is refused") {
  const RowMatrixXd z = RowMatrixXd::Zero(3, 4);
  for (const QuantGrid& g : {QuantGrid::symmetric_bits(8), QuantGrid::unsigned_bits(4, QuantMode::asymmetric),
                             QuantGrid::unsigned_bits(2, QuantMode::min_offset)})
    CHECK(quantize(z, g, Tiling{1, 0}).dequantize() == z);
  RowMatrixXd bad = z;
  bad(1, 2) = NAN;
  CHECK_THROWS_AS(quantize(bad, QuantGrid::symmetric_bits(8), Tiling{}), std::invalid_argument);
}

// max_abs works on bit patterns with 16 running maxima: the largest magnitude wherever it sits (each position of
// lengths around the lanes), -0 and subnormals included, and NaN or +-inf anywhere make it non-finite.
template <class T>
void check_max_abs() {
  std::mt19937_64 g(31);
  std::uniform_real_distribution<T> u(-1, 1);
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{40}}) {
    std::vector<T> x(n);
    for (T& v : x) v = u(g) * std::numeric_limits<T>::denorm_min() * 1000;  // subnormal magnitudes
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<T> y = x;
      y[i] = i % 2 ? T(-3) : T(2.5);
      double want = 0;
      for (const T v : y) want = std::max(want, std::abs(static_cast<double>(v)));
      INFO("n " << n << " at " << i);
      CHECK(max_abs(std::span<const T>(y)) == want);
      y[(i + 5) % n] = std::numeric_limits<T>::quiet_NaN();
      CHECK(std::isnan(max_abs(std::span<const T>(y))));
      y[(i + 5) % n] = -std::numeric_limits<T>::infinity();
      CHECK(max_abs(std::span<const T>(y)) == std::numeric_limits<double>::infinity());
    }
    if (n) CHECK(max_abs(std::span<const T>(std::vector<T>(n, -T(0)))) == 0.0);
  }
}

TEST_CASE("max_abs: the largest magnitude from the bit patterns and a non-finite one for NaN or +-inf") {
  check_max_abs<float>();
  check_max_abs<double>();
  // NaN is refused by the quantiser too (a floating-point max would have skipped it).
  const std::vector<float> nan = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  std::vector<std::int8_t> q(3);
  CHECK_THROWS_AS(quantize_int8_symmetric(std::span<const float>(nan), std::span<std::int8_t>(q)), std::invalid_argument);
}

TEST_CASE("quantize_int8_symmetric with a subnormal or zero s (float64 inputs below 127 2^-1022): codes clamped in double") {
  const double tiny = std::numeric_limits<double>::denorm_min();
  // s = amax / 127 underflows to 0: x / s is +-inf, and the codes are the clamp of it, +-127 (not an integer overflow).
  const std::vector<double> zero_s = {tiny, -tiny, 0.0};
  std::vector<std::int8_t> q(3);
  CHECK(quantize_int8_symmetric(std::span<const double>(zero_s), std::span<std::int8_t>(q)) == 0.0);
  CHECK(q == std::vector<std::int8_t>{127, -127, 0});
  // A subnormal s, inexact: every code is clamp(round-half-even(x / s)) in double, in both rounding modes.
  const std::vector<double> sub = {1e-310, -1e-310, 3.3e-311, -7.7e-312, 4e-313};
  for (const Int8Rounding r : {Int8Rounding::rne, Int8Rounding::floor}) {
    std::vector<std::int8_t> codes(sub.size());
    const double s = quantize_int8_symmetric(std::span<const double>(sub), std::span<std::int8_t>(codes), r);
    CHECK(s < std::numeric_limits<double>::min());
    for (std::size_t i = 0; i < sub.size(); ++i) {
      const double t = sub[i] / s;
      CHECK(codes[i] == static_cast<std::int8_t>(std::clamp(r == Int8Rounding::rne ? std::nearbyint(t) : std::floor(t), -127.0, 127.0)));
    }
  }
}

TEST_CASE("INT4 and INT2 packing: byte layout, round trip over every code, out-of-range codes refused") {
  // layout: element 0 in the low bits
  const std::vector<std::int32_t> four = {1, 15, 0, 7, 3};
  const std::vector<std::uint8_t> b4 = pack_codes(four, 4, false);
  REQUIRE(b4.size() == 3);
  CHECK(b4[0] == 0xF1);
  CHECK(b4[1] == 0x70);
  CHECK(b4[2] == 0x03);
  const std::vector<std::int32_t> two = {0, 1, 2, 3, 3};
  const std::vector<std::uint8_t> b2 = pack_codes(two, 2, false);
  REQUIRE(b2.size() == 2);
  CHECK(b2[0] == 0xE4);  // 3 2 1 0 from the top
  CHECK(b2[1] == 0x03);
  for (int bits : {1, 2, 4, 8})
    for (bool sgn : {false, true}) {
      const int lo = sgn ? -(1 << (bits - 1)) : 0, hi = sgn ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
      std::vector<std::int32_t> codes;
      for (int rep = 0; rep < 3; ++rep)
        for (int c = lo; c <= hi; ++c) codes.push_back(c);
      codes.push_back(lo);  // an odd count leaves a partial byte
      const auto packed = pack_codes(codes, bits, sgn);
      CHECK(packed.size() == (codes.size() * bits + 7) / 8);
      CHECK(unpack_codes(packed, codes.size(), bits, sgn) == codes);
      CHECK_THROWS_AS(pack_codes(std::vector<std::int32_t>{hi + 1}, bits, sgn), std::invalid_argument);
      CHECK_THROWS_AS(pack_codes(std::vector<std::int32_t>{lo - 1}, bits, sgn), std::invalid_argument);
    }
  CHECK_THROWS_AS(pack_codes(four, 3, false), std::invalid_argument);
  CHECK_THROWS_AS(unpack_codes(b4, 7, 4, false), std::invalid_argument);
}

TEST_CASE("bits per element count the codes and each tile's scale and zero point") {
  const RowMatrixXd x = normals(64, 8, 3);
  // per channel asymmetric INT4: 8 tiles x (32 + 4) bits over 512 entries
  CHECK(bits_per_element(quantize(x, QuantGrid::unsigned_bits(4, QuantMode::asymmetric), Tiling{0, 1}), 4) ==
        4 + 8 * 36.0 / 512);
  CHECK(bits_per_element(quantize(x, QuantGrid::symmetric_bits(8), Tiling{}), 8) == 8 + 32.0 / 512);
  CHECK(bits_per_element(quantize(x, QuantGrid::unsigned_bits(2, QuantMode::min_offset), Tiling{1, 0}), 2) ==
        2 + 64 * 64.0 / 512);
}

TEST_CASE("Hadamard: Sylvester order n has H H^T = n I, the block-diagonal normalized one is exactly orthonormal") {
  for (Eigen::Index n : {1, 2, 16, 64}) {
    const RowMatrixXd h = hadamard(n);
    CHECK(h * h.transpose() == static_cast<double>(n) * RowMatrixXd::Identity(n, n));
  }
  const RowMatrixXd b = block_hadamard(64, 16);  // entries +-1/4: every product and sum is exact
  CHECK(b * b.transpose() == RowMatrixXd::Identity(64, 64));
  CHECK(b == b.transpose());
  CHECK((b.block(0, 16, 16, 48).array() == 0).all());
  CHECK_THROWS_AS(block_hadamard(48, 32), SpecError);
  const RowMatrixXd r = randomized_hadamard(128, 5);
  CHECK((r * r.transpose() - RowMatrixXd::Identity(128, 128)).cwiseAbs().maxCoeff() < 1e-14);
  CHECK(r != randomized_hadamard(128, 6));
}

TEST_CASE("SAW: attention with rotated Q and K equals unrotated attention exactly") {
  // Integer Q and K and a block Hadamard with entries +-1/4: Q H (K H)^T is computed without rounding, so equal
  // logits in double means equal in exact arithmetic.
  RowMatrixXd q(8, 32), k(8, 32);
  for (Eigen::Index i = 0; i < q.size(); ++i) {
    q.data()[i] = static_cast<double>((i * 7) % 11) - 5;
    k.data()[i] = static_cast<double>((i * 5) % 13) - 6;
  }
  const RowMatrixXd h = block_hadamard(32, 16);
  CHECK((q * h) * (k * h).transpose() == q * k.transpose());
  // and through the quantizer: with V rotated too, O comes back to the original basis
  const RowMatrixXd v = normals(8, 32, 11);
  const auto fp64 = reference_registry().create("fp64");
  KvQuantized used;
  const auto saw = kv_registry().create("saw:rotate-v=true");
  const auto r = attention_with_kv(*fp64, *saw, {q}, {k}, {v}, 0.05, {}, &used);
  REQUIRE(used.v_rotated);
  const auto direct = fp64->attention(q, k, v, 0.05, {});
  // INT4 error only: O within a few quantization steps of the exact output, not rotated away from it
  CHECK((r[0].o - direct.o).cwiseAbs().maxCoeff() < 0.25 * v.cwiseAbs().maxCoeff());
  CHECK(std::fabs((r[0].o - direct.o).mean()) < 0.05);
}

TEST_CASE("SAW: per-token INT4 with scale (max - min) / 15 and float zero -min / scale") {
  const RowMatrixXd k = normals(20, 32, 4, 3.0);
  KvQuantized c = kv_registry().create("saw")->apply({k}, {k});
  const RowMatrixXd rotated = k * block_hadamard(32, 16);
  for (Eigen::Index t = 0; t < k.rows(); ++t) {
    const double scale = (rotated.row(t).maxCoeff() - rotated.row(t).minCoeff()) / 15;
    CHECK((c.k[0].row(t) - rotated.row(t)).cwiseAbs().maxCoeff() <= 0.5 * scale * (1 + 1e-9));
    CHECK(c.k[0].row(t).minCoeff() == Approx(rotated.row(t).minCoeff()).margin(1e-12));  // code 0 is the min
  }
  CHECK(c.k_bits == 4 + 64.0 / 32);
  // The primer's store_kv: V in INT4 too, per token, not rotated unless rotate-v; @fp16-v keeps it in fp16.
  CHECK(c.v_bits == 4 + 64.0 / 32);
  for (Eigen::Index t = 0; t < k.rows(); ++t) {
    const double scale = (k.row(t).maxCoeff() - k.row(t).minCoeff()) / 15;
    CHECK((c.v[0].row(t) - k.row(t)).cwiseAbs().maxCoeff() <= 0.5 * scale * (1 + 1e-9));
  }
  CHECK_FALSE(c.v_rotated);
  const KvQuantized f = kv_registry().create("saw@fp16-v")->apply({k}, {k});
  CHECK(f.v_bits == 16);
  CHECK(f.k[0] == c.k[0]);
  CHECK_THROWS_AS(kv_registry().create("saw:v=fp16,rotate-v=true"), SpecError);
}

TEST_CASE("Lloyd-Max codebook of the rotated coordinate: symmetric, Gaussian limit, centroid condition") {
  // For large d the coordinate is ~ N(0, 1/d): the codebook times sqrt(d) approaches the Gaussian Lloyd-Max
  // quantizer (1 bit: +-0.7979; 2 bits: +-0.4528, +-1.5104).
  const auto& c1 = lloyd_max_codebook(4096, 1);
  const auto& c2 = lloyd_max_codebook(4096, 2);
  CHECK(c1[1] * 64 == Approx(0.7979).margin(2e-3));
  CHECK(c2[2] * 64 == Approx(0.4528).margin(2e-3));
  CHECK(c2[3] * 64 == Approx(1.5104).margin(3e-3));
  for (int bits : {1, 2, 3, 4}) {
    const auto& c = lloyd_max_codebook(64, bits);
    REQUIRE(c.size() == (1u << bits));
    for (std::size_t j = 0; j < c.size(); ++j) CHECK(c[j] == Approx(-c[c.size() - 1 - j]).margin(1e-9));
    // centroid condition, checked by an independent Simpson integration of the density over each cell
    auto f = [](double t) { return std::pow(std::max(0.0, 1 - t * t), 61.0 / 2); };
    for (std::size_t j = 0; j < c.size(); ++j) {
      const double a = j ? 0.5 * (c[j - 1] + c[j]) : -1, b = j + 1 < c.size() ? 0.5 * (c[j] + c[j + 1]) : 1;
      const int n = 20000;
      double m0 = 0, m1 = 0;
      for (int i = 0; i <= n; ++i) {
        const double t = a + (b - a) * i / n, w = (i == 0 || i == n) ? 1 : (i % 2 ? 4 : 2);
        m0 += w * f(t);
        m1 += w * t * f(t);
      }
      CHECK(m1 / m0 == Approx(c[j]).margin(1e-6));
    }
  }
}

TEST_CASE("TurboQuant mse: error falls with bits, the norm is kept") {
  const RowMatrixXd rot = randomized_hadamard(64, 9);
  const RowMatrixXd x = normals(50, 64, 12, 2.0);
  double prev = INFINITY;
  for (int bits : {1, 2, 3, 4}) {
    double err = 0;
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      const Eigen::VectorXd v = x.row(t).transpose();
      err += (turboquant_mse(v, rot, bits) - v).squaredNorm() / v.squaredNorm();
    }
    err /= x.rows();
    INFO(bits << " bits: relative MSE " << err);
    CHECK(err < prev);
    prev = err;
  }
  // the paper's bound for b = 4: D_mse ~ 0.009 per unit vector
  CHECK(prev < 0.012);
}

TEST_CASE("TurboQuant prod: the inner-product estimator is unbiased over the QJL matrix, and the test can tell") {
  // Fixed x, y and rotation; S drawn with seeds 1..N. Unbiased: mean(<y, x~>) within 4 standard errors of <y, x>
  // (a false alarm has probability ~6e-5, and the seeds are fixed, so the run is deterministic). The same test
  // catches the estimator with the sqrt(pi/2) correction left out.
  const Eigen::Index d = 64;
  const RowMatrixXd rot = randomized_hadamard(d, 3);
  const Eigen::VectorXd x = normals(d, 1, 21).col(0), y = normals(d, 1, 22).col(0);
  const double truth = y.dot(x);
  for (int bits : {1, 2, 3}) {
    const int n = 1500;
    std::vector<double> est, naive;
    const Eigen::VectorXd xm = turboquant_mse(x, rot, bits - 1);
    for (int s = 1; s <= n; ++s) {
      const RowMatrixXd g = gaussian_matrix(d, 1000 + s);
      const Eigen::VectorXd xt = turboquant_prod(x, rot, g, bits);
      est.push_back(y.dot(xt));
      naive.push_back(y.dot(xm + (xt - xm) / std::sqrt(M_PI / 2)));
    }
    auto mean_se = [&](const std::vector<double>& v) {
      const double m = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
      double ss = 0;
      for (double e : v) ss += (e - m) * (e - m);
      return std::pair{m, std::sqrt(ss / (v.size() - 1) / v.size())};
    };
    const auto [m, se] = mean_se(est);
    INFO(bits << " bits: mean " << m << " truth " << truth << " se " << se);
    CHECK(std::fabs(m - truth) < 4 * se);
    const auto [mn, sen] = mean_se(naive);
    if (std::fabs(truth - y.dot(xm)) > 8 * se) CHECK(std::fabs(mn - truth) > 4 * sen);  // the biased one fails
  }
}

TEST_CASE("KIVI: the n_b most recent tokens and a partial group stay fp16, K per channel, V per token groups") {
  const RowMatrixXd k = normals(100, 16, 31, 2.0), v = normals(100, 16, 32, 2.0);
  const KvQuantized c = kv_registry().create("kivi:bits=2,g=16,nb=20")->apply({k}, {v});
  // 100 - 20 = 80 tokens = 5 whole groups quantized; tokens 80..99 in fp16
  const Eigen::Index nq = 80;
  for (Eigen::Index t = nq; t < 100; ++t)
    for (Eigen::Index j = 0; j < 16; ++j) {
      REQUIRE(std::fabs(c.k[0](t, j) - k(t, j)) <= std::ldexp(std::fabs(k(t, j)), -11) + 1e-7);
      REQUIRE(static_cast<float>(c.k[0](t, j)) == c.k[0](t, j));
    }
  for (Eigen::Index t = 0; t < nq; ++t)
    for (Eigen::Index j = 0; j < 16; ++j) {
      const auto kg = k.block(t / 16 * 16, j, 16, 1);  // the channel within its 16-token group
      REQUIRE(std::fabs(c.k[0](t, j) - k(t, j)) <= 0.5 * (kg.maxCoeff() - kg.minCoeff()) / 3 * (1 + 1e-12));
      const auto vg = v.block(t, 0, 1, 16);  // the token's 16 channels
      REQUIRE(std::fabs(c.v[0](t, j) - v(t, j)) <= 0.5 * (vg.maxCoeff() - vg.minCoeff()) / 3 * (1 + 1e-12));
    }
  // bits: 80 x 16 codes at 2 bits + (80/16) x 16 K tiles x 64 + 20 x 16 at 16 bits
  CHECK(c.k_bits == Approx((80 * 16 * 2.0 + 5 * 16 * 64 + 20 * 16 * 16) / 1600).epsilon(1e-12));
}

TEST_CASE("FlashQ cache: blocks through flashq_quantize_block/compress/decompress, n_h heads at 2 bits") {
  const RowMatrixXd k0 = normals(96, 16, 41), k1 = normals(96, 16, 42, 4.0);
  const KvQuantized c = kv_registry().create("flashq:bits=4,bc=64")->apply({k0, k1}, {k0, k1});
  for (Eigen::Index r0 : {0, 64}) {
    const Eigen::Index n = std::min<Eigen::Index>(64, 96 - r0);
    const FlashQBlock b = flashq_quantize_block(k1.middleRows(r0, n));
    const RowMatrixXd want = flashq_decompress(flashq_compress(b.values, 4, IntScaleRounding::round)).cast<double>() * b.scale;
    CHECK(c.k[1].middleRows(r0, n) == want);
  }
  // head 1 has the larger spread, so the higher priority: with n_h = 1, head 0 drops to 2 bits
  const KvQuantized m = kv_registry().create("flashq@mixed:nh=1")->apply({k0, k1}, {k0, k1});
  CHECK(m.k[1] == c.k[1]);
  CHECK((m.k[0] - k0).squaredNorm() > 2 * (c.k[0] - k0).squaredNorm());
  CHECK(c.k_bits == Approx(4 + (2 * 32 + 2 * 16 * 16.0) / (96 * 16)).epsilon(1e-12));
}

TEST_CASE("FlashQ cache at 3 bits (not in the paper): the same progressive step with 8 levels, between 2 and 4 bits") {
  const RowMatrixXd k = normals(96, 16, 44, 2.0);
  const KvQuantized c3 = kv_registry().create("flashq:bits=3,bc=64")->apply({k}, {k});
  for (Eigen::Index r0 : {0, 64}) {
    const Eigen::Index n = std::min<Eigen::Index>(64, 96 - r0);
    const FlashQBlock b = flashq_quantize_block(k.middleRows(r0, n));
    CHECK(c3.k[0].middleRows(r0, n) ==
          flashq_decompress(flashq_compress(b.values, 3, IntScaleRounding::round)).cast<double>() * b.scale);
  }
  const KvQuantized c2 = kv_registry().create("flashq:bits=2,bc=64")->apply({k}, {k});
  const KvQuantized c4 = kv_registry().create("flashq:bits=4,bc=64")->apply({k}, {k});
  CHECK(c3.k_bits == Approx(c4.k_bits - 1).epsilon(1e-12));
  CHECK(c3.k_bits == Approx(c2.k_bits + 1).epsilon(1e-12));
  const double e2 = (c2.k[0] - k).squaredNorm(), e3 = (c3.k[0] - k).squaredNorm(), e4 = (c4.k[0] - k).squaredNorm();
  CHECK(e4 < e3);
  CHECK(e3 < e2);
  CHECK_THROWS_AS(kv_registry().create("flashq:bits=5"), SpecError);
}

TEST_CASE("FlashQ cache with a decode buffer: the last n_b tokens in INT8 under the universal scale, clamped") {
  RowMatrixXd k = normals(100, 8, 43);
  k(97, 3) = 50;  // a new outlier in the buffer: clamps to 119 s_u
  const KvQuantized c = kv_registry().create("flashq:bits=4,bc=32,nb=20")->apply({k}, {k});
  double s_u = 0;
  for (Eigen::Index r0 = 0; r0 < 80; r0 += 32) {
    const FlashQBlock b = flashq_quantize_block(k.middleRows(r0, std::min<Eigen::Index>(32, 80 - r0)));
    s_u = std::max(s_u, b.scale);
  }
  const RowMatrixXd want = flashq_quantize_with_scale(k.bottomRows(20), s_u).cast<double>() * s_u;
  CHECK(c.k[0].bottomRows(20) == want);
  CHECK(c.k[0](97, 3) == 119 * s_u);
  CHECK(c.k[0].topRows(80) == kv_registry().create("flashq:bits=4,bc=32")->apply({k.topRows(80)}, {k.topRows(80)}).k[0]);
  // bits: 3 blocks (32 + 16 x 8 each) + 80 x 8 x 4 codes, and the buffer's 20 x 8 x 8 + its scale
  CHECK(c.k_bits == Approx((3 * (32 + 16 * 8.0) + 80 * 8 * 4 + 20 * 8 * 8 + 32) / 800).epsilon(1e-12));
}

TEST_CASE("KV registry: every quantizer builds from its defaults, bad keys and shapes are refused") {
  for (const auto& e : kv_registry().params().entries()) {
    INFO(e.name);
    const auto q = kv_registry().create(e.name);
    const RowMatrixXd k = normals(40, 64, 51), v = normals(40, 64, 52);
    const KvQuantized c = q->apply({k, k}, {v, v});
    REQUIRE(c.k.size() == 2);
    CHECK(c.k_bits > 0);
    CHECK(c.k[0].rows() == 40);
  }
  CHECK_THROWS_AS(kv_registry().create("kivi:bits=9"), SpecError);
  CHECK_THROWS_AS(kv_registry().create("nope"), SpecError);
  CHECK_THROWS_AS(kv_registry().create("saw")->apply({normals(4, 40, 1)}, {normals(4, 40, 2)}), SpecError);
}

TEST_CASE("TurboQuant with d not a power of two: zero-padded to the next one, D codes counted for d values") {
  const RowMatrixXd k = normals(30, 48, 81, 2.0);
  double prev = INFINITY;
  for (int bits : {2, 3, 4}) {
    const KvQuantized c = kv_registry().create("turboquant:bits=" + std::to_string(bits))->apply({k}, {k});
    REQUIRE(c.k[0].cols() == 48);
    CHECK(c.k_bits == (bits * 64 + 32.0) / 48);
    const double err = (c.k[0] - k).squaredNorm() / k.squaredNorm();
    INFO(bits << " bits: relative MSE " << err);
    CHECK(err < prev);
    CHECK(err < 0.4);
    prev = err;
  }
  // a power-of-two d is not padded: its mse result is the per-vector formula itself
  const RowMatrixXd k64 = normals(5, 64, 82);
  const KvQuantized c = kv_registry().create("turboquant:bits=3")->apply({k64}, {k64});
  const RowMatrixXd rot = randomized_hadamard(64, 1);
  for (Eigen::Index t = 0; t < 5; ++t)
    CHECK(c.k[0].row(t).transpose() == turboquant_mse(k64.row(t).transpose(), rot, 3));
}

TEST_CASE("GPTQ equals RTN when the inputs are uncorrelated (diagonal H), and beats it when they are not") {
  const RowMatrixXd w = normals(64, 24, 61, 0.1);
  // X with orthogonal columns: H = 2 X^T X is diagonal, so U is diagonal and no error is fed back
  RowMatrixXd xo = RowMatrixXd::Zero(128, 64);
  for (Eigen::Index i = 0; i < 64; ++i) xo(2 * i, i) = 1.0 + 0.01 * i;
  for (Eigen::Index g : {0, 32}) {
    const WeightQuantConfig c{3, g};
    CHECK(gptq_weights(w, xo, c) == rtn_weights(w, c));
  }
  // correlated inputs: a low-rank mix plus noise
  RowMatrixXd x = normals(256, 8, 62) * normals(8, 64, 63) + 0.1 * normals(256, 64, 64);
  for (int bits : {3, 4}) {
    const WeightQuantConfig c{bits, 32};
    const double e_rtn = relative_output_error(x, w, rtn_weights(w, c));
    const double e_gptq = relative_output_error(x, w, gptq_weights(w, x, c));
    INFO(bits << " bits: rtn " << e_rtn << " gptq " << e_gptq);
    CHECK(e_gptq < 0.8 * e_rtn);
  }
}

TEST_CASE("AWQ: alpha = 0 is RTN, so AWQ never does worse, with salient channels it does better") {
  const RowMatrixXd w = normals(64, 24, 71, 0.1);
  RowMatrixXd x = normals(256, 64, 72);
  for (Eigen::Index j = 0; j < 64; j += 8) x.col(j) *= 20;  // a few channels carry large activations
  const WeightQuantConfig c{3, 32};
  const double e_rtn = relative_output_error(x, w, rtn_weights(w, c));
  const AwqResult a = awq_weights(w, x, c);
  const double e_awq = relative_output_error(x, w, a.w);
  INFO("rtn " << e_rtn << " awq " << e_awq << " alpha " << a.alpha);
  CHECK(e_awq < e_rtn);
  CHECK(a.alpha > 0);
  // a single grid point is alpha = 0 alone, which is RTN exactly
  CHECK(awq_weights(w, x, c, 1).w == rtn_weights(w, c));
  CHECK(awq_weights(w, x, c, 1, AwqGrid::official).w == rtn_weights(w, c));
  // The two alpha grids: with 2 points linspace tries {0, 1}, the official steps {0, 1/2}. Where alpha = 1 is best,
  // only linspace reaches it; the chosen alpha is always on the grid.
  const AwqResult lin = awq_weights(w, x, c, 2), off = awq_weights(w, x, c, 2, AwqGrid::official);
  CHECK((lin.alpha == 0.0 || lin.alpha == 1.0));
  CHECK((off.alpha == 0.0 || off.alpha == 0.5));
  const AwqResult lin20 = awq_weights(w, x, c, 20), off20 = awq_weights(w, x, c, 20, AwqGrid::official);
  CHECK(std::abs(lin20.alpha * 19 - std::round(lin20.alpha * 19)) < 1e-12);
  CHECK(std::abs(off20.alpha * 20 - std::round(off20.alpha * 20)) < 1e-12);
  CHECK(off20.alpha < 1.0);
  CHECK(weight_registry().canonical("awq@official").find("alphas=official") != std::string::npos);
}

TEST_CASE("kv first-chunk (FlashInfer serving path): the first chunk's queries read raw K and V, the rest the cache") {
  const RowMatrixXd q = normals(12, 32, 21, 2.0), k = normals(12, 32, 22), v = normals(12, 32, 23);
  const AttentionMask causal{RowMatrixXb(), true};
  for (const char* spec : {"turboquant:bits=3", "saw:rotate-v=true", "saw@fp16-v"}) {
    for (const char* method : {"fp64", "quant-only"}) {
      INFO(spec << " with " << method);
      const auto m = reference_registry().create(method);
      const auto cache_only = kv_registry().create(spec);
      const auto served = kv_registry().create(std::string(spec) + (std::string(spec).find(':') == std::string::npos
                                                                         ? ":first-chunk=5" : ",first-chunk=5"));
      for (const AttentionMask& mask : {AttentionMask{}, causal}) {
        KvQuantized used;
        const auto r = attention_with_kv(*m, *served, {q}, {k}, {v}, 0.125, mask, &used);
        CHECK(used.raw_query_rows == 5);
        // rows 0-4: one call on the raw tensors (a chunk of 5 queries: a per-tensor Q scale is the chunk's own)
        const AttentionResult first = m->attention(q.topRows(5), k, v, 0.125, mask.rows(0, 5, 12));
        CHECK(r[0].o.topRows(5) == first.o);
        CHECK(r[0].p.topRows(5) == first.p);
        // rows 5-11: the cache, as the quantizer without the option gives for a call of those queries
        const auto rest = attention_with_kv(*m, *cache_only, {RowMatrixXd(q.bottomRows(7))}, {k}, {v}, 0.125,
                                            mask.rows(5, 7, 12));
        CHECK(r[0].o.bottomRows(7) == rest[0].o);
        CHECK(r[0].p.bottomRows(7) == rest[0].p);
        CHECK(r[0].o.bottomRows(7) != m->attention(q.bottomRows(7), k, v, 0.125, mask.rows(5, 7, 12)).o);
        // the stored cache is the same, and costs the same bits
        CHECK(used.k_bits == cache_only->apply({k}, {v}).k_bits);
      }
      // a first chunk of every query: no query reads the cache
      const auto all_raw = kv_registry().create(std::string(spec) + (std::string(spec).find(':') == std::string::npos
                                                                          ? ":first-chunk=100" : ",first-chunk=100"));
      CHECK(attention_with_kv(*m, *all_raw, {q}, {k}, {v}, 0.125, causal)[0].o == m->attention(q, k, v, 0.125, causal).o);
    }
  }
}

TEST_CASE("GEAR-L: backbone plus the rank-r SVD of its residual, rank 0 equal to kivi bit for bit") {
  // Low-rank structure plus noise: 96 tokens, 32 channels
  const RowMatrixXd base = normals(96, 3, 41) * normals(3, 32, 42) + 0.3 * normals(96, 32, 43);
  const RowMatrixXd v = normals(96, 32, 44);
  // rank 0 with the KIVI backbone is KIVI (whole groups of g older than n_b, the rest fp16)
  const KvQuantized kivi = kv_registry().create("kivi:bits=3,g=32,nb=16")->apply({base}, {v});
  const KvQuantized g0 = kv_registry().create("gear:backbone=kivi,bits=3,g=32,nb=16,rank=0")->apply({base}, {v});
  CHECK(g0.k[0] == kivi.k[0]);
  CHECK(g0.v[0] == kivi.v[0]);
  CHECK(g0.k_bits == kivi.k_bits);
  // the error falls with the rank; full rank leaves only the fp16 rounding of the factors
  double previous = INFINITY;
  for (const int r : {0, 1, 3, 8, 32}) {
    INFO("rank " << r);
    const KvQuantized g = kv_registry().create("gear:bits=2,nb=0,rank=" + std::to_string(r))->apply({base}, {v});
    const double err = (g.k[0] - base).norm();
    CHECK(err < previous);
    previous = err;
    // bits: codes + per-channel (K) scale and offset + fp16 factors r (L + d)
    const double expected = (2.0 * 96 * 32 + 64.0 * 32 + 16.0 * r * (96 + 32)) / (96.0 * 32);
    CHECK(g.k_bits == Approx(expected).epsilon(1e-12));
    if (r == 32) CHECK((g.k[0] - base).cwiseAbs().maxCoeff() < 2e-3 * base.cwiseAbs().maxCoeff());
  }
  // KCVT: K per channel over every compressed token, V per token; the n_b most recent tokens are fp16 exactly
  const KvQuantized kcvt = kv_registry().create("gear@kcvt:nb=16,rank=0")->apply({base}, {v});
  for (Eigen::Index c = 0; c < 32; ++c) {
    const auto col = base.col(c).head(80);
    const double step = (col.maxCoeff() - col.minCoeff()) / 15;
    CHECK((kcvt.k[0].col(c).head(80) - col).cwiseAbs().maxCoeff() <= 0.5 * step * (1 + 1e-9));
  }
  for (Eigen::Index t = 80; t < 96; ++t)
    for (Eigen::Index c = 0; c < 32; ++c)
      CHECK(kcvt.k[0](t, c) == lowp_round(base(t, c), fp16_binary16(), LowpRounding::rne, LowpOverflow::saturate));
  for (Eigen::Index t = 0; t < 80; ++t) {
    const double step = (v.row(t).maxCoeff() - v.row(t).minCoeff()) / 15;
    CHECK((kcvt.v[0].row(t) - v.row(t)).cwiseAbs().maxCoeff() <= 0.5 * step * (1 + 1e-9));
  }
}
