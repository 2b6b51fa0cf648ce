// Integer attention pipelines against an independent straightforward formulation written here, plus the
// structural properties: joint key/value permutation, determinism, masks (padding, causal with L_q != L_k, fully
// masked rows), and the symmetric INT8 quantiser.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>

#include "support/random_matrix.h"
#include "support/symmetric_goldens.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"

using namespace qattn;
using namespace qattn::ref;
using qattn::test::random_matrix;

namespace {


// Straightforward Quant-Only: per element loops, exactly the documented steps.
RowMatrixXd quant_only_loops(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, double scale,
                             RowMatrixXi32* p8) {
  auto quant = [](const RowMatrixXd& x, double* s) {
    *s = x.cwiseAbs().maxCoeff() / 127;
    RowMatrixXi32 r(x.rows(), x.cols());
    for (Eigen::Index i = 0; i < x.rows(); ++i)
      for (Eigen::Index j = 0; j < x.cols(); ++j) r(i, j) = static_cast<int>(std::nearbyint(x(i, j) / *s));
    return r;
  };
  double sq, sk, sv;
  const RowMatrixXi32 qi = quant(q, &sq), ki = quant(k, &sk), vi = quant(v, &sv);
  RowMatrixXd o(q.rows(), v.cols());
  p8->resize(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    std::vector<float> s(k.rows());
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      long a = 0;
      for (Eigen::Index t = 0; t < q.cols(); ++t) a += long{qi(i, t)} * ki(j, t);
      s[j] = static_cast<float>(a) * static_cast<float>(sq * sk * scale);
    }
    Eigen::Map<Eigen::RowVectorXf> row(s.data(), k.rows());
    const Eigen::RowVectorXf p = softmax_ref(row);  // the same float softmax: the pipeline's stated step 3
    for (Eigen::Index j = 0; j < k.rows(); ++j) (*p8)(i, j) = static_cast<int>(std::nearbyint(127.0f * p(j)));
    for (Eigen::Index c = 0; c < v.cols(); ++c) {
      long acc = 0;
      for (Eigen::Index j = 0; j < k.rows(); ++j) acc += long{(*p8)(i, j)} * vi(j, c);
      o(i, c) = static_cast<float>(acc * sv / 127);
    }
  }
  return o;
}

}  // namespace

TEST_CASE("symmetric INT8: the primer's goldens (largest magnitude at code 127) and the zero tensor", "[pipelines]") {
  test::check_symmetric_goldens([](const RowMatrixXd& x) { return quantize_symmetric_int8(x); }, 127, {-42, 0, 42, 127});
}

TEST_CASE("quant-only equals its loop formulation bit for bit", "[pipelines]") {
  std::mt19937_64 g(1);
  const RowMatrixXd q = random_matrix(7, 16, 1.0, g), k = random_matrix(9, 16, 1.5, g), v = random_matrix(9, 5, 2.0, g);
  RowMatrixXi32 p8;
  const RowMatrixXd o = quant_only_loops(q, k, v, 0.25, &p8);
  const AttentionResult r = quant_only_attention(q, k, v, 0.25, {});
  CHECK(r.p_int == p8);
  CHECK(r.o == o);
  CHECK(r.p_scale == 127);
}

TEST_CASE("intattention equals quantise + int matmul + IndexSoftmax + int matmul", "[pipelines]") {
  std::mt19937_64 g(2);
  const RowMatrixXd q = random_matrix(6, 32, 1.0, g), k = random_matrix(11, 32, 1.0, g), v = random_matrix(11, 4, 1.0, g);
  IndexSoftmaxParams p;
  p.lut_rounding = LutRounding::round;
  const double scale = 1 / std::sqrt(32.0);
  std::vector<RowMatrixXi32> codes;
  for (const Int8Rounding qround : {Int8Rounding::rne, Int8Rounding::floor}) {
    INFO("qround " << (qround == Int8Rounding::rne ? "rne" : "floor"));
    const AttentionResult r = int_attention(q, k, v, scale, {}, p, CintEvaluation::f64, {}, qround);
    const Int8Matrix qi = quantize_symmetric_int8(q, qround), ki = quantize_symmetric_int8(k, qround),
                     vi = quantize_symmetric_int8(v, qround);
    codes.push_back(qi.values);
    RowMatrixXi32 a(6, 11);
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 11; ++j) a(i, j) = (qi.values.row(i).cast<long>().array() * ki.values.row(j).cast<long>().array()).sum();
    const std::int64_t c_int = std::llround(6.6 / (qi.scale * ki.scale * scale));
    const RowMatrixXi32 pe = index_softmax(a, c_int, p);
    CHECK(r.p_int == pe);
    for (int i = 0; i < 6; ++i)
      for (int c = 0; c < 4; ++c) {
        long acc = 0;
        for (int j = 0; j < 11; ++j) acc += long{pe(i, j)} * vi.values(j, c);
        CHECK(r.o(i, c) == static_cast<float>(acc * vi.scale / 255));
      }
  }
  CHECK(codes[0] != codes[1]);  // the two roundings give different codes on these inputs
  // @paper is Eq. 3 as printed (floor); the official presets round half to even.
  const Registry& reg = reference_registry();
  CHECK(reg.canonical(parse_method_spec("intattention@paper")).find("qround=floor") != std::string::npos);
  CHECK(reg.canonical(parse_method_spec("intattention@upstream-sim")).find("qround=rne") != std::string::npos);
}

// Key order, determinism, masks (padding, causal with L_q != L_k, fully masked rows) and masking = dropping run for
// every registered method in tests/property/registry_property_test.cc, to the tolerances the entries declare.

TEST_CASE("causal masks align at the bottom right", "[pipelines]") {
  AttentionMask causal;
  causal.causal = true;
  const RowMatrixXb vis = causal.visible(3, 5);  // query i sees keys 0 .. i + 2
  CHECK(vis == (RowMatrixXb(3, 5) << 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1).finished());
  CHECK(causal.visible(5, 3).row(1).isZero());  // L_q > L_k: the first two queries see no key
  CHECK(causal.visible(5, 3).row(2).count() == 1);
  CHECK_THROWS_AS(reference_registry().create("fp32")->attention(RowMatrixXd::Zero(3, 2), RowMatrixXd::Zero(5, 2),
                                                                 RowMatrixXd::Zero(5, 2), 0.3,
                                                                 AttentionMask{RowMatrixXb(2, 2), false}),
                  std::invalid_argument);
}

TEST_CASE("scaling V by a power of two scales the fp32 output exactly", "[pipelines]") {
  std::mt19937_64 g(6);
  const RowMatrixXd q = random_matrix(10, 16, 1.0, g), k = random_matrix(12, 16, 1.0, g), v = random_matrix(12, 8, 1.0, g);
  const RowMatrixXd o = float_attention(q, k, v, 0.25, FloatPrecision::fp32).o;
  CHECK(float_attention(q, k, (v * 8.0).eval(), 0.25, FloatPrecision::fp32).o == o * 8.0);
  CHECK(float_attention(q, k, (v * 0.5).eval(), 0.25, FloatPrecision::fp64).o == o.cast<double>() * 0.0 +
        float_attention(q, k, v, 0.25, FloatPrecision::fp64).o * 0.5);
}

TEST_CASE("group-wise intattention: per-token Q is one call per query row, per-channel V one call per column", "[pipelines]") {
  std::mt19937_64 g(7);
  RowMatrixXd q = random_matrix(9, 16, 1.0, g), k = random_matrix(21, 16, 1.0, g), v = random_matrix(21, 5, 1.0, g);
  q.row(2) *= 20;  // one loud query: per tensor it would flatten every other row's logits
  v.col(1) *= 30;  // one loud channel
  const IndexSoftmaxParams p = index_softmax_params(reference_registry().resolve(parse_method_spec("index@upstream-neon")));
  AttentionMask causal;
  causal.causal = true;
  const AttentionResult r = int_attention(q, k, v, 0.25, causal, p, CintEvaluation::f64, {.q_rows = 1, .v = VGroup::channel});
  for (Eigen::Index i = 0; i < 9; ++i) {
    AttentionMask row_mask;
    row_mask.valid = causal.visible(9, 21).row(i);
    CHECK(r.p_int.row(i) == int_attention(q.row(i), k, v, 0.25, row_mask, p, CintEvaluation::f64).p_int.row(0));
  }
  for (Eigen::Index c = 0; c < 5; ++c)
    CHECK(r.o.col(c) == int_attention(q, k, v.col(c), 0.25, causal, p, CintEvaluation::f64, {.q_rows = 1}).o.col(0));
  // blocks of 4 rows: rows 0-3 share one scale (the loud row 2 included), rows 4-7 another
  const AttentionResult b4 = int_attention(q, k, v, 0.25, {}, p, CintEvaluation::f64, {.q_rows = 4});
  CHECK(b4.p_int.middleRows(4, 4) == int_attention(q.middleRows(4, 4), k, v, 0.25, {}, p, CintEvaluation::f64).p_int);
  CHECK(b4.p_int.topRows(4) != r.p_int.topRows(4));
  // the per-tensor default is unchanged by the new parameters
  CHECK(reference_registry().create("intattention:q-group=0,v-group=tensor")->attention(q, k, v, 0.25, {}).o ==
        int_attention(q, k, v, 0.25, {}, index_softmax_params(reference_registry().resolve(parse_method_spec("index"))),
                      CintEvaluation::f64).o);
}

TEST_CASE("int_matmul_abt and int_matmul_ab: the exact integer products in every range of their sums", "[int_pipelines]") {
  std::mt19937_64 g(31);
  // max |entry| per operand: products whose sums stay below 2^24 (the float GEMM), below 2^31 and 2^53 (the double
  // GEMM), and beyond (int64 sums; abt then refuses a result outside int32)
  for (const std::int32_t bound : {127, 1000, 40000, 1 << 28}) {
    INFO("entries up to " << bound);
    std::uniform_int_distribution<std::int32_t> entry(-bound, bound);
    RowMatrixXi32 a(9, 67), b(11, 67), c(67, 5);
    for (RowMatrixXi32* m : {&a, &b, &c})
      for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = entry(g);
    a(0, 0) = bound, b(0, 0) = -bound;  // the bound is reached
    bool fits = true;
    RowMatrixXi32 abt(a.rows(), b.rows());
    for (Eigen::Index i = 0; i < a.rows(); ++i)
      for (Eigen::Index j = 0; j < b.rows(); ++j) {
        std::int64_t s = 0;
        for (Eigen::Index t = 0; t < a.cols(); ++t) s += std::int64_t{a(i, t)} * b(j, t);
        if (s > INT32_MAX || s < INT32_MIN) fits = false;
        else abt(i, j) = static_cast<std::int32_t>(s);
      }
    // the prepared form holds its own copies (A as int8 when it fits, B as float, double or int32): the caller's
    // codes are gone before its blocks are taken
    auto a_copy = std::make_unique<RowMatrixXi32>(a), b_copy = std::make_unique<RowMatrixXi32>(b);
    const ref::IntMatmulAbt prepared(*a_copy, *b_copy);
    a_copy.reset(), b_copy.reset();
    if (fits) {
      CHECK(ref::int_matmul_abt(a, b) == abt);
      CHECK(prepared.rows(0, a.rows()) == abt);
      CHECK(prepared.rows(2, 3) == abt.middleRows(2, 3));
      CHECK(prepared.rows(8, 1) == abt.bottomRows(1));
    } else {
      CHECK_THROWS_AS(ref::int_matmul_abt(a, b), std::overflow_error);
      CHECK_THROWS_AS(prepared.rows(0, a.rows()), std::overflow_error);
    }
    RowMatrixXd ab(a.rows(), c.cols());
    for (Eigen::Index i = 0; i < a.rows(); ++i)
      for (Eigen::Index j = 0; j < c.cols(); ++j) {
        std::int64_t s = 0;
        for (Eigen::Index t = 0; t < a.cols(); ++t) s += std::int64_t{a(i, t)} * c(t, j);
        ab(i, j) = static_cast<double>(s);
      }
    CHECK(ref::int_matmul_ab(a, c) == ab);
    auto c_copy = std::make_unique<RowMatrixXi32>(c);
    const ref::IntMatmulAb pv(*c_copy);
    c_copy.reset();
    CHECK(pv(a) == ab);
    CHECK(pv(a.middleRows(3, 4)) == ab.middleRows(3, 4));
  }
  // The P V bound is the largest row sum of |a| times max|b|. Row 2 sums to 1 without the absolute values, but its
  // exact result 2 (2^23 + 1) - 1 = 2^24 + 1 is not a float: a bound without them would take the float GEMM.
  RowMatrixXi32 p = RowMatrixXi32::Zero(3, 40), v(40, 2);
  for (Eigen::Index i = 0; i < v.size(); ++i) v.data()[i] = 1 + static_cast<std::int32_t>(i % 7);
  v(0, 0) = v(0, 1) = (1 << 23) + 1;
  v(1, 0) = v(1, 1) = 1;
  p(1, 39) = 1;
  p(2, 0) = 2, p(2, 1) = -1;
  RowMatrixXd pv_exact(3, 2);
  for (Eigen::Index i = 0; i < 3; ++i)
    for (Eigen::Index j = 0; j < 2; ++j) {
      std::int64_t s = 0;
      for (Eigen::Index t = 0; t < 40; ++t) s += std::int64_t{p(i, t)} * v(t, j);
      pv_exact(i, j) = static_cast<double>(s);
    }
  CHECK(ref::int_matmul_ab(p, v) == pv_exact);
  CHECK(ref::IntMatmulAb(v)(p) == pv_exact);
}
