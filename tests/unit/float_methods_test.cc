// The fp64/fp32/fp16/bf16 methods: rounding points as documented in float_attention.h, checked against
// independent straightforward formulations written here.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "qattn/float_format.h"
#include "support/random_matrix.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/registry.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::random_matrix;

namespace {


bool all_in_format(const RowMatrixXd& m, const FloatFormat& f) {
  for (Eigen::Index i = 0; i < m.size(); ++i)
    if (round_to_format(m.data()[i], f) != m.data()[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("fp64 attention equals a long-double textbook formulation", "[methods]") {
  std::mt19937_64 gen(1);
  const RowMatrixXd q = random_matrix(5, 8, 1.0, gen), k = random_matrix(7, 8, 1.0, gen), v = random_matrix(7, 3, 1.0, gen);
  const double scale = 1.0 / std::sqrt(8.0);
  const AttentionResult r = float_attention(q, k, v, scale, FloatPrecision::fp64);
  for (int i = 0; i < 5; ++i) {
    long double s[7], z = 0;
    for (int j = 0; j < 7; ++j) {
      long double dot = 0;
      for (int t = 0; t < 8; ++t) dot += static_cast<long double>(q(i, t)) * k(j, t);
      s[j] = std::exp(dot * scale);
      z += s[j];
    }
    for (int c = 0; c < 3; ++c) {
      long double o = 0;
      for (int j = 0; j < 7; ++j) o += s[j] / z * v(j, c);
      CHECK(std::fabs(static_cast<double>(o) - r.o(i, c)) <= 1e-14 * (1 + std::fabs(static_cast<double>(o))));
    }
    for (int j = 0; j < 7; ++j) CHECK(std::fabs(static_cast<double>(s[j] / z) - r.p(i, j)) <= 1e-15);
  }
}

TEST_CASE("fp16 and bf16 round exactly at R1-R4 and nowhere else", "[methods]") {
  std::mt19937_64 gen(2);
  const RowMatrixXd q = random_matrix(6, 16, 1.5, gen), k = random_matrix(9, 16, 1.5, gen), v = random_matrix(9, 4, 2.0, gen);
  for (auto [p, f] : {std::pair{FloatPrecision::fp16, kBinary16}, std::pair{FloatPrecision::bf16, kBfloat16}}) {
    INFO(precision_name(p));
    const AttentionResult r = float_attention(q, k, v, 0.25, p);
    CHECK(all_in_format(r.o, f));  // R4
    CHECK(all_in_format(r.p, f));  // R3
    // R1: rounding the inputs first changes nothing.
    const AttentionResult r1 = float_attention(round_to_storage(q, p), round_to_storage(k, p), round_to_storage(v, p), 0.25, p);
    CHECK(r1.o == r.o);
    // R2/R3 against a loop written here: S in float, rounded; softmax in float; P rounded.
    const RowMatrixXd qs = round_to_storage(q, p), ks = round_to_storage(k, p);
    for (int i = 0; i < 6; ++i) {
      float s[9];
      for (int j = 0; j < 9; ++j) {
        double exact = 0;  // products of 16-bit values are exact in double; the float GEMM order differs, so
        for (int t = 0; t < 16; ++t) exact += qs(i, t) * ks(j, t);  // compare after rounding with a 1-ulp slack
        s[j] = static_cast<float>(round_to_format(static_cast<float>(exact) * 0.25f, f));
      }
      float m = s[0];
      for (float x : s) m = std::max(m, x);
      float z = 0, e[9];
      for (int j = 0; j < 9; ++j) z += (e[j] = std::exp(s[j] - m));
      for (int j = 0; j < 9; ++j) {
        const double expected = round_to_format(e[j] / z, f);
        const double ulp = std::ldexp(1.0, std::ilogb(expected) - (f.precision - 1));
        CHECK(std::fabs(r.p(i, j) - expected) <= 2 * ulp);
      }
    }
  }
}

TEST_CASE("fp32 softmax output is float and close to fp64", "[methods]") {
  std::mt19937_64 gen(3);
  const RowMatrixXd x = random_matrix(4, 100, 5.0, gen);
  const RowMatrixXd p32 = float_softmax_rows(x, FloatPrecision::fp32);
  const RowMatrixXd p64 = float_softmax_rows(x, FloatPrecision::fp64);
  CHECK(all_in_format(p32, kBinary32));
  CHECK((p32 - p64).cwiseAbs().maxCoeff() < 1e-6);
  CHECK((p32 - p64).cwiseAbs().maxCoeff() > 0);  // it really is float arithmetic
}

TEST_CASE("every FP method: masked rows, fully masked rows, shift invariance of fp64", "[methods]") {
  const double inf = std::numeric_limits<double>::infinity();
  RowMatrixXd x(3, 4);
  x << 1, -inf, 2, 0.5, -inf, -inf, -inf, -inf, 3, 3, 3, 3;
  for (const char* name : {"fp64", "fp32", "fp16", "bf16"}) {
    INFO(name);
    const RowMatrixXd p = reference_registry().create(name)->softmax_rows(x);
    CHECK(p(0, 1) == 0.0);
    CHECK(p.row(1).isZero());
    CHECK(p(2, 0) == 0.25);
    CHECK(std::fabs(p.row(0).sum() - 1.0) < 1e-2);
  }
  const RowMatrixXd p = float_softmax_rows(x.topRows(1), FloatPrecision::fp64);
  const RowMatrixXd ps = float_softmax_rows((x.topRows(1).array() + 1024.0).matrix(), FloatPrecision::fp64);
  CHECK(p == ps);  // x + 1024 is exact for these inputs and so is the max subtraction
}

TEST_CASE("attention refuses mismatched shapes", "[methods]") {
  const RowMatrixXd a = RowMatrixXd::Zero(2, 3), b = RowMatrixXd::Zero(2, 4);
  CHECK_THROWS_AS(float_attention(a, b, b, 1.0, FloatPrecision::fp32), std::invalid_argument);
  CHECK_THROWS_AS(float_attention(a, a, RowMatrixXd::Zero(3, 1), 1.0, FloatPrecision::fp32), std::invalid_argument);
}
