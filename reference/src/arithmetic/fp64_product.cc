#include "qattn/reference/fp64_product.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace qattn::ref {
namespace {

// Columns of one row in one vector register: Vec2 for SSE2 and NEON, Vec4 for AVX2 (x86-64 copies with AVX2 or
// AVX-512). Lane x only ever meets lane x, so the width cannot change an element's operations.
using Vec2 = double __attribute__((vector_size(16)));
using Vec4 = double __attribute__((vector_size(32)));

constexpr long kRowTile = 4;  // rows of A per register tile
constexpr long kColTile = 8;  // columns of B per register tile

// Where the kernel writes c_ij: c[i * ldc + j], or c[j * ldc + i] for a transposed C.
template <bool kTransposed>
[[gnu::always_inline]] inline double& at(double* c, long ldc, long i, long j) {
  return kTransposed ? c[j * ldc + i] : c[i * ldc + j];
}

// One R x 8 tile of C (rows i.., columns j..) over t in [t0, t1), onto the partial sums C holds (or from 0 where
// first), in registers of type V. a: the tile's first row of A; b: its first row of B's 8 columns.
template <class V, long R, bool kTransposed>
[[gnu::always_inline]] inline void sum_tile(const double* a, long lda, const double* b, long ldb, double* c, long ldc,
                                            long i, long j, long t0, long t1, bool first) {
  constexpr long kLanes = sizeof(V) / sizeof(double), kParts = kColTile / kLanes;
  V s[R][kParts];
  for (long r = 0; r < R; ++r) {
    double row[kColTile] = {};
    if (!first)
      for (long x = 0; x < kColTile; ++x) row[x] = at<kTransposed>(c, ldc, i + r, j + x);
    for (long x = 0; x < kParts; ++x) std::memcpy(&s[r][x], row + x * kLanes, sizeof(V));
  }
  for (long t = t0; t < t1; ++t) {
    V bt[kParts];
    for (long x = 0; x < kParts; ++x) std::memcpy(&bt[x], b + t * ldb + x * kLanes, sizeof(V));
    for (long r = 0; r < R; ++r) {
      const double ar = a[r * lda + t];
      // the product rounded, then the sum: -ffp-contract=off keeps them two operations
      for (long x = 0; x < kParts; ++x) s[r][x] = s[r][x] + ar * bt[x];
    }
  }
  for (long r = 0; r < R; ++r) {
    double row[kColTile];
    for (long x = 0; x < kParts; ++x) std::memcpy(row + x * kLanes, &s[r][x], sizeof(V));
    for (long x = 0; x < kColTile; ++x) at<kTransposed>(c, ldc, i + r, j + x) = row[x];
  }
}

// C [m, n] = A [m, k] (row stride lda) B [k, n], every element summed over t = 0, 1, ..., k - 1 in turn, written by
// rows (row stride ldc) or transposed (C^T by rows, row stride ldc). B's columns [j, j + 8) start at
// b + (j / 8) * tile_stride, row t of them ldb further on: a matrix by rows has tile_stride 8; one packed tile by
// tile (each tile's k rows of 8 together, the last tile padded) has tile_stride 8 k and ldb 8.
// The inner index goes in panels of kc: a panel's partial sums are stored in C and taken up again by the next
// panel, which continues the same sequence of additions (a double stored is the double loaded), so kc is a cache
// choice only. Columns past the last whole tile are summed one element at a time, in the same order.
template <class V, bool kTransposed>
[[gnu::always_inline]] inline void product_kernel_body(const double* a, long lda, const double* b, long ldb,
                                                       long tile_stride, double* c, long ldc, long m, long n, long k) {
  if (k == 0) {  // empty sums
    for (long i = 0; i < m; ++i)
      for (long j = 0; j < n; ++j) at<kTransposed>(c, ldc, i, j) = 0.0;
    return;
  }
  const long kc = std::max(64L, (32768L / std::max(n, 1L)) / 8 * 8);  // B's panel about 256 KiB
  const long n_tiles = n / kColTile * kColTile;
  for (long t0 = 0; t0 < k; t0 += kc) {
    const long t1 = std::min(k, t0 + kc);
    const bool first = t0 == 0;
    for (long j = 0; j < n_tiles; j += kColTile) {  // B's k x 8 strip stays in L1 while the rows of A pass
      const double* bj = b + j / kColTile * tile_stride;
      long i = 0;
      for (; i + kRowTile <= m; i += kRowTile)
        sum_tile<V, kRowTile, kTransposed>(a + i * lda, lda, bj, ldb, c, ldc, i, j, t0, t1, first);
      for (; i < m; ++i) sum_tile<V, 1, kTransposed>(a + i * lda, lda, bj, ldb, c, ldc, i, j, t0, t1, first);
    }
    for (long r = 0; r < m; ++r)
      for (long j = n_tiles; j < n; ++j) {
        const double* bj = b + j / kColTile * tile_stride + j % kColTile;
        double s = first ? 0.0 : at<kTransposed>(c, ldc, r, j);
        for (long t = t0; t < t1; ++t) s = s + a[r * lda + t] * bj[t * ldb];
        at<kTransposed>(c, ldc, r, j) = s;
      }
  }
}

struct KernelArgs {
  const double* a;
  long lda;
  const double* b;
  long ldb, tile_stride;
  double* c;
  long ldc, m, n, k;
  bool transposed;
  ProductKernel kernel;
};

template <class V>
[[gnu::always_inline]] inline void run_kernel(const KernelArgs& g) {
  if (g.transposed) product_kernel_body<V, true>(g.a, g.lda, g.b, g.ldb, g.tile_stride, g.c, g.ldc, g.m, g.n, g.k);
  else product_kernel_body<V, false>(g.a, g.lda, g.b, g.ldb, g.tile_stride, g.c, g.ldc, g.m, g.n, g.k);
}

void product_kernel_base(const KernelArgs& g) { run_kernel<Vec2>(g); }

#if defined(__x86_64__) && defined(__GNUC__)
#define QATTN_FP64_PRODUCT_AVX2 1
__attribute__((target("avx2"))) void product_kernel_avx2(const KernelArgs& g) { run_kernel<Vec4>(g); }
#endif

// The AVX2 copy where the CPU has AVX2 (every CPU with AVX-512 has it), else the baseline one; both compute the
// same bits.
void product_kernel(const KernelArgs& g) {
#ifdef QATTN_FP64_PRODUCT_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && g.kernel == ProductKernel::widest) return product_kernel_avx2(g);
#endif
  product_kernel_base(g);
}

}  // namespace

RowMatrixXd product_ab(const MatrixView& a, const MatrixView& b, ProductKernel kernel) {
  if (a.cols() != b.rows()) throw std::invalid_argument("product_ab: A has " + std::to_string(a.cols()) +
                                                        " columns, B " + std::to_string(b.rows()) + " rows");
  RowMatrixXd c(a.rows(), b.cols());
  if (c.size() > 0)
    product_kernel({a.data(), a.outerStride(), b.data(), b.outerStride(), kColTile, c.data(), c.cols(), a.rows(),
                    b.cols(), a.cols(), false, kernel});
  return c;
}

RowMatrixXd product_abt(const MatrixView& a, const MatrixView& b, ProductKernel kernel) {
  if (a.cols() != b.cols()) throw std::invalid_argument("product_abt: A has " + std::to_string(a.cols()) +
                                                         " columns, B " + std::to_string(b.cols()));
  const Eigen::Index m = a.rows(), n = b.rows(), k = a.cols();
  RowMatrixXd c(m, n);
  if (c.size() == 0) return c;
  // C's rows in blocks of 64: C_block^T = B A_block^T, so the kernel's B is A_block^T [K, 64], packed tile by tile
  // (small, held in cache across B's rows), B's rows are read once per block, and the kernel writes C_block^T
  // transposed, that is C_block. c_ij sums b_jt a_it, which is a_it b_jt.
  constexpr Eigen::Index kBlock = 64;
  const Eigen::Index width = (std::min(kBlock, m) + kColTile - 1) / kColTile * kColTile;
  std::vector<double> packed(static_cast<std::size_t>(k * width));
  for (Eigen::Index r0 = 0; r0 < m; r0 += kBlock) {
    const Eigen::Index rows = std::min(kBlock, m - r0);
    std::fill(packed.begin(), packed.end(), 0.0);
    for (Eigen::Index i = 0; i < rows; ++i)
      for (Eigen::Index t = 0; t < k; ++t)
        packed[static_cast<std::size_t>((i / kColTile * k + t) * kColTile + i % kColTile)] = a(r0 + i, t);
    product_kernel({b.data(), b.outerStride(), packed.data(), kColTile, kColTile * k, c.data() + r0 * n, n, n, rows, k,
                    true, kernel});
  }
  return c;
}

}  // namespace qattn::ref
