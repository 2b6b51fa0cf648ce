// AVX2 variants of the GEMM families. Both operands are widened to s16 and multiplied with vpmaddwd, which sums
// adjacent s16 x s16 products exactly into s32 (|2 * 255 * 127| is far inside int32). vpmaddubsw is not used: its
// s16 sum of two u8 x s8 products saturates at 255 * 127 * 2 > 32767.
// Layout per 8 columns n: 32 packed bytes = 8 n x 4 k. The low 16 bytes (n0..n3) and the high 16 (n4..n7) are
// sign-extended to 16 s16 each; the A group a0..a3 is broadcast as the s16 pattern (a0, a1, a2, a3) x 4. vpmaddwd
// then gives the lanes (n, k0k1), (n, k2k3) for n = n0..n3 (resp. n4..n7); vphaddd and a 64-bit permute put the
// eight sums in column order. Tiles of 2 rows x 16 columns. Each 16-column panel of B is widened once per call into
// a per-thread buffer (64 s16 per k group: 128 bytes, in the order the tiles read them), so a tile's k step is two
// broadcast groups, four loads and eight vpmaddwd; widening B in every tile cost four cross-lane vpmovsxbw per eight
// vpmaddwd, and shuffles issue at most twice per cycle.
#include <immintrin.h>

#include "qattn/kernels.h"
#include "qattn/thread_buffer.h"

namespace qattn::kernels {
namespace {

// The A group a0..a3 as the s16 pattern (a0, a1, a2, a3) x 4: one 4-byte load, a dword broadcast and one widening
// (GCC 12 built it from four scalar loads, shifts and ors: 16 scalar instructions per row and k group).
template <bool kSignedA>
inline __m256i broadcast_group(const std::uint8_t* a) {
  std::int32_t group;
  __builtin_memcpy(&group, a, 4);
  const __m128i bytes = _mm_set1_epi32(group);
  return kSignedA ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
}

// One R x 16 tile over the whole k, B from the widened panel (bw: per k group, 16 s16 for columns 0-3, 4-7, 8-11,
// 12-15 in turn).
template <bool kSignedA, int R>
inline void tile(const GemmArgs& g, Index i0, Index n0, const std::int16_t* bw) {
  constexpr int G = 2;
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  __m256i lo[R][G], hi[R][G];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < G; ++v) lo[r][v] = hi[r][v] = _mm256_setzero_si256();
  for (Index k4 = 0; k4 < g.k / 4; ++k4, bw += 64) {
    __m256i bl[G], bh[G];
    for (int v = 0; v < G; ++v) {
      bl[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bw + v * 32));
      bh[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bw + v * 32 + 16));
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

// Columns outer, rows inner: one widened panel of B (16 columns x k) stays in cache while every row of A passes over it.
template <bool kSignedA>
void gemm(const GemmArgs& g) {
  static thread_local ThreadBuffer panel;  // grows to the largest k this thread has seen
  const Index groups = g.k / 4;
  std::int16_t* bw = reinterpret_cast<std::int16_t*>(panel.reserve(groups * 64 * Index{sizeof(std::int16_t)}));
  for (Index n0 = 0; n0 < g.n; n0 += 16) {  // n is a multiple of 16
    const std::int8_t* b = g.b_packed + n0 * 4;
    for (Index k4 = 0; k4 < groups; ++k4, b += g.n * 4)
      for (int h = 0; h < 4; ++h)
        _mm256_store_si256(reinterpret_cast<__m256i*>(bw + k4 * 64 + h * 16),
                           _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + h * 16))));
    Index i0 = 0;
    for (; i0 + 2 <= g.rows; i0 += 2) tile<kSignedA, 2>(g, i0, n0, bw);
    for (; i0 < g.rows; ++i0) tile<kSignedA, 1>(g, i0, n0, bw);
  }
}

}  // namespace

void qk_s8s8_s32__avx2_2x16(const GemmArgs& args) { gemm<true>(args); }
void pv_u8s8_s32__avx2_2x16(const GemmArgs& args) { gemm<false>(args); }

}  // namespace qattn::kernels

namespace qattn::kernels {

// Register-only inline assembly (an intrinsics loop let GCC hoist the loop-invariant vpmaddwd and spill the
// accumulators): ymm0 / ymm1 the broadcast s16 operands, ymm2..ymm13 twelve accumulators, each round one vpmaddwd
// into a temporary (ymm14 / ymm15 alternately) and one vpaddd, as the GEMM tiles do.
std::int64_t mac_loop__avx2(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) {
    *checksum = 0;
    return 0;
  }
  volatile int seed = 0x00010001;
  std::int64_t n = iterations;
  alignas(32) std::int32_t lanes[8];
  asm volatile(
      "vmovd %k[seed], %%xmm0\n\t"
      "vpbroadcastd %%xmm0, %%ymm0\n\t"
      "vpaddw %%ymm0, %%ymm0, %%ymm1\n\t"
      "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
      "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
      "vpxor %%ymm4, %%ymm4, %%ymm4\n\t"
      "vpxor %%ymm5, %%ymm5, %%ymm5\n\t"
      "vpxor %%ymm6, %%ymm6, %%ymm6\n\t"
      "vpxor %%ymm7, %%ymm7, %%ymm7\n\t"
      "vpxor %%ymm8, %%ymm8, %%ymm8\n\t"
      "vpxor %%ymm9, %%ymm9, %%ymm9\n\t"
      "vpxor %%ymm10, %%ymm10, %%ymm10\n\t"
      "vpxor %%ymm11, %%ymm11, %%ymm11\n\t"
      "vpxor %%ymm12, %%ymm12, %%ymm12\n\t"
      "vpxor %%ymm13, %%ymm13, %%ymm13\n\t"
      "1:\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm14\n\t"
      "vpaddd %%ymm14, %%ymm2, %%ymm2\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddd %%ymm15, %%ymm3, %%ymm3\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm14\n\t"
      "vpaddd %%ymm14, %%ymm4, %%ymm4\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddd %%ymm15, %%ymm5, %%ymm5\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm14\n\t"
      "vpaddd %%ymm14, %%ymm6, %%ymm6\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddd %%ymm15, %%ymm7, %%ymm7\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm14\n\t"
      "vpaddd %%ymm14, %%ymm8, %%ymm8\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddd %%ymm15, %%ymm9, %%ymm9\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm14\n\t"
      "vpaddd %%ymm14, %%ymm10, %%ymm10\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddd %%ymm15, %%ymm11, %%ymm11\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm14\n\t"
      "vpaddd %%ymm14, %%ymm12, %%ymm12\n\t"
      "vpmaddwd %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddd %%ymm15, %%ymm13, %%ymm13\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vpaddd %%ymm3, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm4, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm5, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm6, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm7, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm8, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm9, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm10, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm11, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm12, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm13, %%ymm2, %%ymm2\n\t"
      "vmovdqu %%ymm2, %[lanes]\n\t"
      : [n] "+r"(n), [lanes] "=m"(lanes)
      : [seed] "r"(static_cast<int>(seed))
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "cc");
  std::uint32_t t = 0;  // the lanes wrapped over the run (vector adds wrap); sum them the same way, defined
  for (int r = 0; r < 8; ++r) t += static_cast<std::uint32_t>(lanes[r]);
  *checksum = static_cast<std::int32_t>(t & 0x7fffffff);
  return iterations * 12 * 16;  // 16 MACs per vpmaddwd
}

}  // namespace qattn::kernels
