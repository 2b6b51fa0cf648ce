// AVX-512 VNNI variants of the GEMM families: vpdpbusd (u8 x s8, four products summed into each s32 lane), tiles of
// 4 rows x 48 columns (12 zmm accumulators), the A group of 4 bytes broadcast to every lane.
// qk: A = Q is s8; a ^ 0x80 = a + 128 as u8, so the lanes hold sum (a + 128) b and 128 B_sum[n] is subtracted at the
// end (|sum| <= 255 * 127 * k: exact in int32 for k < 66000). pv: A = P is u8, native.
#include <immintrin.h>

#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {

template <bool kSignedA, int R, int V>
inline void tile(const GemmArgs& g, Index i0, Index n0) {
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  __m512i acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_si512();
  const std::int8_t* b = g.b_packed + n0 * 4;
  for (Index k4 = 0; k4 < g.k / 4; ++k4, b += g.n * 4) {
    __m512i bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_si512(b + v * 64);
    for (int r = 0; r < R; ++r) {
      std::int32_t group;
      __builtin_memcpy(&group, a + (i0 + r) * g.k + k4 * 4, 4);
      if (kSignedA) group ^= static_cast<std::int32_t>(0x80808080u);
      const __m512i av = _mm512_set1_epi32(group);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, bv[v]);
    }
  }
  for (int v = 0; v < V; ++v) {
    const __m512i bias = kSignedA ? _mm512_mullo_epi32(_mm512_loadu_si512(g.b_sum + n0 + v * 16), _mm512_set1_epi32(128)) : _mm512_setzero_si512();
    for (int r = 0; r < R; ++r)
      _mm512_storeu_si512(g.c + (i0 + r) * g.n + n0 + v * 16, _mm512_sub_epi32(acc[r][v], bias));
  }
}

template <bool kSignedA, int V>
inline void column_panel(const GemmArgs& g, Index n0) {
  Index i0 = 0;
  for (; i0 + 4 <= g.rows; i0 += 4) tile<kSignedA, 4, V>(g, i0, n0);
  for (; i0 < g.rows; ++i0) tile<kSignedA, 1, V>(g, i0, n0);
}

// Columns outer, rows inner: one panel of B (48 columns x k) stays in L1 while every row of A passes over it.
// 4 rows x 3 vectors = 12 accumulators, enough independent vpdpbusd chains to cover its latency.
template <bool kSignedA>
void gemm(const GemmArgs& g) {
  Index n0 = 0;
  for (; n0 + 48 <= g.n; n0 += 48) column_panel<kSignedA, 3>(g, n0);
  if (n0 + 32 <= g.n) column_panel<kSignedA, 2>(g, n0), n0 += 32;
  if (n0 < g.n) column_panel<kSignedA, 1>(g, n0);  // n is a multiple of 16
}

}  // namespace

void qk_s8s8_s32__avx512vnni_4x48(const GemmArgs& args) { gemm<true>(args); }
void pv_u8s8_s32__avx512vnni_4x48(const GemmArgs& args) { gemm<false>(args); }

}  // namespace qattn::kernels

namespace qattn::kernels {

std::int64_t mac_loop__avx512vnni(std::int64_t iterations, std::int32_t* checksum) {
  __m512i acc[12];
  for (auto& x : acc) x = _mm512_setzero_si512();
  volatile int seed = 1;
  const __m512i a = _mm512_set1_epi8(static_cast<char>(seed)), b = _mm512_set1_epi8(static_cast<char>(seed + 1));
  for (std::int64_t i = 0; i < iterations; ++i)
    for (auto& x : acc) x = _mm512_dpbusd_epi32(x, a, b);  // 64 MACs each
  __m512i s = acc[0];
  for (int r = 1; r < 12; ++r) s = _mm512_add_epi32(s, acc[r]);
  alignas(64) std::int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  std::uint32_t t = 0;  // the lanes wrapped over the run (vector adds wrap); sum them the same way, defined
  for (int r = 0; r < 16; ++r) t += static_cast<std::uint32_t>(lanes[r]);
  *checksum = static_cast<std::int32_t>(t & 0x7fffffff);
  return iterations * 12 * 64;
}

}  // namespace qattn::kernels
