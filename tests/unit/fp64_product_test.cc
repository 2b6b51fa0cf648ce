// The float64 products of the fp64 reference (fp64_product.h): every element is the plain sequential sum, bit for
// bit, on the widest copy of the kernel this CPU runs (AVX2 on x86-64 where it has it, NEON under qemu) and on the
// baseline one (SSE2).
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "qattn/reference/float_attention.h"
#include "qattn/reference/fp64_product.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"
#include "qattn/method.h"

using namespace qattn;
using namespace qattn::ref;

namespace {

// c_ij = (...((0 + a_i0 b_0j) + a_i1 b_1j) + ...), each product and sum rounded (the build has -ffp-contract=off).
// b_tj is b(t, j), or b(j, t) where transposed.
RowMatrixXd plain_product(const MatrixView& a, const MatrixView& b, bool transposed) {
  const Eigen::Index n = transposed ? b.rows() : b.cols();
  RowMatrixXd c(a.rows(), n);
  for (Eigen::Index i = 0; i < a.rows(); ++i)
    for (Eigen::Index j = 0; j < n; ++j) {
      double s = 0;
      for (Eigen::Index t = 0; t < a.cols(); ++t) s = s + a(i, t) * (transposed ? b(j, t) : b(t, j));
      c(i, j) = s;
    }
  return c;
}

// Entries of widely spread magnitudes (2^-20 to 2^20 times a normal value), so that summing in any other order
// changes bits.
RowMatrixXd spread_matrix(Eigen::Index rows, Eigen::Index cols, std::mt19937_64& g) {
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> exponent(-20, 20);
  RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = std::ldexp(normal(g), exponent(g));
  return m;
}

bool same_bits(double x, double y) {
  return (std::isnan(x) && std::isnan(y)) || std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
}

// The first element whose bits differ, as "(i, j): got x, want y", or "" where every one is the same.
std::string first_difference(const RowMatrixXd& got, const RowMatrixXd& want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) return "shapes differ";
  for (Eigen::Index i = 0; i < got.rows(); ++i)
    for (Eigen::Index j = 0; j < got.cols(); ++j)
      if (!same_bits(got(i, j), want(i, j))) {
        std::ostringstream s;
        s << std::hexfloat << "(" << i << ", " << j << "): got " << got(i, j) << ", want " << want(i, j);
        return s.str();
      }
  return "";
}

}  // namespace

TEST_CASE("product_ab and product_abt equal the plain sequential sum bit for bit", "[fp64_product]") {
  std::mt19937_64 g(7);
  // (m, n, k): whole and partial 4 x 8 tiles, rows and columns of one, no inner index, and inner indices that run
  // over several of the kernel's panels (n = 130 for product_ab, a block of up to 64 rows for product_abt).
  const Eigen::Index shapes[][3] = {{1, 1, 1},   {4, 8, 16},  {5, 9, 3},    {3, 7, 33},   {0, 5, 4},  {6, 0, 4},
                                    {7, 11, 0},  {64, 64, 128}, {67, 17, 5}, {13, 130, 700}, {70, 9, 1100}};
  for (const auto& [m, n, k] : shapes) {
    // A and B as views into wider matrices: rows further apart than their length
    const RowMatrixXd a_wide = spread_matrix(m, k + 3, g), b_wide = spread_matrix(k, n + 5, g),
                      bt_wide = spread_matrix(n, k + 2, g);
    const MatrixView a = a_wide.leftCols(k), b = b_wide.leftCols(n), bt = bt_wide.leftCols(k);
    INFO("m " << m << ", n " << n << ", k " << k);
    const RowMatrixXd c = plain_product(a, b, false), ct = plain_product(a, bt, true);
    for (const ProductKernel kernel : {ProductKernel::widest, ProductKernel::baseline}) {
      INFO((kernel == ProductKernel::widest ? "the widest kernel" : "the baseline kernel"));
      CHECK(first_difference(product_ab(a, b, kernel), c) == "");
      CHECK(first_difference(product_abt(a, bt, kernel), ct) == "");
    }
  }
}

TEST_CASE("product_ab and product_abt carry infinities, NaN and signed zeros as the plain sum does", "[fp64_product]") {
  std::mt19937_64 g(8);
  RowMatrixXd a = spread_matrix(9, 12, g), b = spread_matrix(12, 10, g), bt = spread_matrix(10, 12, g);
  const double inf = std::numeric_limits<double>::infinity();
  a(0, 3) = inf, a(1, 0) = -inf, a(2, 5) = std::numeric_limits<double>::quiet_NaN();
  a.row(4).setConstant(-0.0), b(3, 2) = 0.0, bt(2, 3) = 0.0;  // inf * 0: NaN in those elements only
  b(7, 9) = -inf, bt(9, 7) = -inf;                             // inf - inf where row 0 meets it
  b.col(8).setConstant(-0.0), bt.row(8).setConstant(-0.0);     // -0 * -0 = +0; 0 + +0 = +0
  for (const bool transposed : {false, true}) {
    const RowMatrixXd got = transposed ? product_abt(a, bt) : product_ab(a, b);
    const RowMatrixXd want = plain_product(a, transposed ? MatrixView(bt) : MatrixView(b), transposed);
    INFO((transposed ? "product_abt" : "product_ab"));
    CHECK(first_difference(got, want) == "");
    CHECK(std::isnan(got(0, 2)));      // inf * 0
    CHECK(std::isinf(got(1, 0)));
    CHECK(std::isnan(got(2, 4)));      // NaN row
    CHECK(!std::signbit(got(4, 1)));   // a row of -0: products -0 or +0, summed onto +0
  }
}

TEST_CASE("product_ab and product_abt give a block of rows the whole product's rows", "[fp64_product]") {
  std::mt19937_64 g(9);
  const RowMatrixXd q = spread_matrix(150, 72, g), k = spread_matrix(301, 72, g), p = spread_matrix(150, 301, g),
                    v = spread_matrix(301, 40, g);
  const RowMatrixXd s = product_abt(q, k), o = product_ab(p, v);
  for (const auto& [r0, n] : {std::pair<Eigen::Index, Eigen::Index>{0, 64}, {5, 37}, {64, 64}, {101, 49}, {149, 1}}) {
    INFO("rows " << r0 << " to " << r0 + n);
    CHECK(first_difference(product_abt(q.middleRows(r0, n), k), s.middleRows(r0, n)) == "");
    CHECK(first_difference(product_ab(p.middleRows(r0, n), v), o.middleRows(r0, n)) == "");
  }
}

TEST_CASE("product_ab and product_abt refuse operands whose inner sizes differ", "[fp64_product]") {
  const RowMatrixXd a = RowMatrixXd::Ones(3, 4), b = RowMatrixXd::Ones(5, 2);
  CHECK_THROWS_WITH(product_ab(a, b), "product_ab: A has 4 columns, B 5 rows");
  CHECK_THROWS_WITH(product_abt(a, b), "product_abt: A has 4 columns, B 2");
}

TEST_CASE("fp64 attention forms its logits and O with the fp64 products and streams in blocks of 64 rows",
          "[fp64_product]") {
  std::mt19937_64 g(10);
  std::normal_distribution<double> normal;
  RowMatrixXd q(70, 16), k(90, 16), v(90, 8);
  for (RowMatrixXd* m : {&q, &k, &v})
    for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = 3 * normal(g);
  const double scale = 0.25;
  RowMatrixXd logits;
  const AttentionResult r = float_attention(q, k, v, scale, FloatPrecision::fp64, {}, &logits);
  RowMatrixXd s = product_abt(q, k);
  s *= scale;
  CHECK(first_difference(logits, s) == "");
  CHECK(first_difference(r.p, softmax_ref_rows(s)) == "");
  CHECK(first_difference(r.o, product_ab(r.p, v)) == "");
  // every architecture: the reference's rows are computed block by block (docs/streaming.md)
  CHECK(reference_registry().traits(parse_method_spec("fp64")).query_block_rows == 64);
}
