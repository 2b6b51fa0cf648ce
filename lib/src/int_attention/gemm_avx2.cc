// AVX2 variants of the GEMM families. Both operands are widened to s16 and multiplied with vpmaddwd, which sums
// adjacent s16 x s16 products exactly into s32 (|2 * 255 * 127| is far inside int32). vpmaddubsw is not used: its
// s16 sum of two u8 x s8 products saturates at 255 * 127 * 2 > 32767.
// Layout per 8 columns n: 32 packed bytes = 8 n x 4 k. The low 16 bytes (n0..n3) and the high 16 (n4..n7) are
// sign-extended to 16 s16 each; the A group a0..a3 is broadcast as the s16 pattern (a0, a1, a2, a3) x 4. vpmaddwd
// then gives the lanes (n, k0k1), (n, k2k3) for n = n0..n3 (resp. n4..n7); vphaddd and a 64-bit permute put the
// eight sums in column order. Tiles of 2 rows x 16 columns.
#include <immintrin.h>

#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {

template <bool kSignedA>
inline __m256i broadcast_group(const std::uint8_t* a) {
  std::int16_t w[4];
  for (int t = 0; t < 4; ++t) w[t] = kSignedA ? std::int16_t{static_cast<std::int8_t>(a[t])} : std::int16_t{a[t]};
  std::int64_t pattern;
  __builtin_memcpy(&pattern, w, 8);
  return _mm256_set1_epi64x(pattern);
}

template <bool kSignedA, int R, int G>
inline void tile(const GemmArgs& g, Index i0, Index n0) {
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  __m256i lo[R][G], hi[R][G];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < G; ++v) lo[r][v] = hi[r][v] = _mm256_setzero_si256();
  const std::int8_t* b = g.b_packed + n0 * 4;
  for (Index k4 = 0; k4 < g.k / 4; ++k4, b += g.n * 4) {
    __m256i bl[G], bh[G];
    for (int v = 0; v < G; ++v) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + v * 32));
      bl[v] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw));
      bh[v] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(raw, 1));
    }
    for (int r = 0; r < R; ++r) {
      const __m256i av = broadcast_group<kSignedA>(a + (i0 + r) * g.k + k4 * 4);
      for (int v = 0; v < G; ++v) {
        lo[r][v] = _mm256_add_epi32(lo[r][v], _mm256_madd_epi16(av, bl[v]));
        hi[r][v] = _mm256_add_epi32(hi[r][v], _mm256_madd_epi16(av, bh[v]));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < G; ++v) {
      const __m256i sums = _mm256_hadd_epi32(lo[r][v], hi[r][v]);  // n0 n1 n4 n5 | n2 n3 n6 n7
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(g.c + (i0 + r) * g.n + n0 + v * 8),
                          _mm256_permute4x64_epi64(sums, 0xD8));
    }
}

// Columns outer, rows inner: one panel of B (16 columns x k) stays in L1 while every row of A passes over it.
template <bool kSignedA>
void gemm(const GemmArgs& g) {
  for (Index n0 = 0; n0 < g.n; n0 += 16) {  // n is a multiple of 16
    Index i0 = 0;
    for (; i0 + 2 <= g.rows; i0 += 2) tile<kSignedA, 2, 2>(g, i0, n0);
    for (; i0 < g.rows; ++i0) tile<kSignedA, 1, 2>(g, i0, n0);
  }
}

}  // namespace

void qk_s8s8_s32__avx2_2x16(const GemmArgs& args) { gemm<true>(args); }
void pv_u8s8_s32__avx2_2x16(const GemmArgs& args) { gemm<false>(args); }

}  // namespace qattn::kernels

namespace qattn::kernels {

std::int64_t mac_loop__avx2(std::int64_t iterations, std::int32_t* checksum) {
  __m256i acc[12];
  for (auto& x : acc) x = _mm256_setzero_si256();
  volatile int seed = 1;
  const __m256i a = _mm256_set1_epi16(static_cast<short>(seed)), b = _mm256_set1_epi16(static_cast<short>(seed + 1));
  for (std::int64_t i = 0; i < iterations; ++i)
    for (auto& x : acc) x = _mm256_add_epi32(x, _mm256_madd_epi16(a, b));  // 16 MACs each
  __m256i s = acc[0];
  for (int r = 1; r < 12; ++r) s = _mm256_add_epi32(s, acc[r]);
  alignas(32) std::int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  std::uint32_t t = 0;  // the lanes wrapped over the run (vector adds wrap); sum them the same way, defined
  for (int r = 0; r < 8; ++r) t += static_cast<std::uint32_t>(lanes[r]);
  *checksum = static_cast<std::int32_t>(t & 0x7fffffff);
  return iterations * 12 * 16;
}

}  // namespace qattn::kernels
