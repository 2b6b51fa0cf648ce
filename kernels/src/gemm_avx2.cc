// AVX2 variants of the GEMM families. Both operands are widened to s16 and multiplied with vpmaddwd, which sums
// adjacent s16 x s16 products exactly into s32 (|2 * 255 * 127| is far inside int32; a 32-bit lane holds the sum of
// k/2 of them, exact for k < 66000). vpmaddubsw is not used: its s16 sum of two u8 x s8 products saturates at
// 255 * 127 * 2 > 32767. No offset trick is needed, so Q.K^T and P.V differ only in how A is widened (sign or zero).
// Per call, A is widened to s16 rows into a per-thread buffer, so a row's pair of k (a_2p, a_2p+1) is one dword that
// vpbroadcastd takes straight from memory. Per k block of kKc and 16-column panel, B is widened into a per-thread
// panel of k pairs: for each pair, 16 columns x (b_2p, b_2p+1) as s16, two ymm in column order, so vpmaddwd with
// the broadcast pair gives column n's sum for pair p in lane n. Tiles of 6 rows x 16 columns: 12 ymm accumulators, 2
// for B, 1 for the A pair and 1 for the products, all 16 ymm registers; 4-, 2- and 1-row tiles take the rows left
// over. A k step per pair is 2 loads of B, 6 broadcasts, 12 vpmaddwd and 12 vpaddd, the mix of the peak loop below.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "qattn/kernels.h"
#include "qattn/mac_loop_frame.h"
#include "qattn/thread_buffer.h"
#include "qattn/ymm_tile_asm.h"

namespace qattn::kernels {
namespace {

// k blocks of 256: a widened panel is then 128 pairs x 64 bytes = 8 KiB and stays in L1 while every row passes over
// it. Partial sums wait in C between k blocks: each is a sum of a subset of the final sum's products, so the bound of
// the whole sum covers it.
constexpr Index kKc = 256;

// The k loop of an R x 16 tile (R = 6, 4, 2 or 1) in inline assembly (registers and rows: qattn/ymm_tile_asm.h): the
// panel's two vectors of a pair in ymm0 and ymm1, the A pair broadcast from memory into ymm2, each product in ymm3
// before its add. The sums are stored to `out` [R][16]. In assembly for the same reason as the AVX-VNNI tile
// (gemm_avxvnni.cc): a compiler may copy or spill accumulators in a loop that uses every register;
// tests/kernels/peak_loop_codegen.py checks it.
#define QATTN_STEP(r)                                                                                   \
  "vpbroadcastd " QATTN_A_ROW(r) ", %%ymm2\n\t"                                                          \
  "vpmaddwd %%ymm0, %%ymm2, %%ymm3\n\t"                                                                 \
  "vpaddd %%ymm3, " QATTN_ACC(r, 0) ", " QATTN_ACC(r, 0) "\n\t"                                         \
  "vpmaddwd %%ymm1, %%ymm2, %%ymm3\n\t"                                                                 \
  "vpaddd %%ymm3, " QATTN_ACC(r, 1) ", " QATTN_ACC(r, 1) "\n\t"
#define QATTN_FIRST(r) "vpxor " QATTN_ACC(r, 0) ", " QATTN_ACC(r, 0) ", " QATTN_ACC(r, 0) "\n\t" \
                       "vpxor " QATTN_ACC(r, 1) ", " QATTN_ACC(r, 1) ", " QATTN_ACC(r, 1) "\n\t"
#define QATTN_STORE(r) "vmovdqu " QATTN_ACC(r, 0) ", " #r "*64(%[out])\n\t" \
                       "vmovdqu " QATTN_ACC(r, 1) ", " #r "*64+32(%[out])\n\t"
#define QATTN_LOOP(FIRSTS, STEPS, STORES) QATTN_YMM_TILE_LOOP("vmovdqa", "$64", FIRSTS, STEPS, STORES)
#define QATTN_OPERANDS                                                                                  \
  : [a0] "+r"(a0), [a3] "+r"(a3), [b] "+r"(b), [n] "+r"(pairs)                                           \
  : [lda] "r"(lda), [out] "r"(out)                                                                       \
  : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
    "xmm13", "xmm14", "xmm15", "cc", "memory"

// a0: row 0's first pair (s16), lda: the rows' stride in bytes, b: the panel's first pair, pairs >= 1.
template <int R>
inline void k_loop(const std::int16_t* a0, Index lda, const std::int16_t* b, Index pairs, std::int32_t* out) {
  const std::int16_t* a3 = reinterpret_cast<const std::int16_t*>(reinterpret_cast<const char*>(a0) + 3 * lda);
  QATTN_TILE_ASM_FOR_R
}
#undef QATTN_OPERANDS
#undef QATTN_LOOP
#undef QATTN_STORE
#undef QATTN_FIRST
#undef QATTN_STEP

// One R x 16 tile of C over the k block whose widened panel is bw (pairs pairs) and whose A pairs start at a16: the
// partial sums already in C are added on every block but the first (integer adds wrap, so the order does not
// change C).
template <int R>
inline void tile(const GemmArgs& g, const std::int16_t* a16, Index i0, Index n0, const std::int16_t* bw, Index pairs,
                 bool first) {
  alignas(32) std::int32_t sums[R][16];
  if (pairs > 0) k_loop<R>(a16 + i0 * g.k, g.k * Index{sizeof(std::int16_t)}, bw, pairs, &sums[0][0]);
  else std::memset(sums, 0, sizeof sums);  // k = 0: the loop runs at least once
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) {
      std::int32_t* c = g.c + (i0 + r) * g.n + n0 + 8 * v;
      __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(&sums[r][8 * v]));
      if (!first) x = _mm256_add_epi32(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c), x);
    }
}

// The 8 columns' pairs (b_4g, b_4g+1) and (b_4g+2, b_4g+3) of one packed group of 4 k (32 bytes: column c's 4 k in
// bytes 4c..4c+3), as s16 in column order: sign-extended, each column is the dword pair (pair 0, pair 1); the even
// dwords of the two halves hold pair 0, the odd ones pair 1, and a 64-bit permute puts the columns in order.
inline void widen_group(const std::int8_t* b, std::int16_t* pair0, std::int16_t* pair1) {
  const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));       // columns 0-3
  const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));  // columns 4-7
  const __m256 l = _mm256_castsi256_ps(lo), h = _mm256_castsi256_ps(hi);
  // shuffle_ps per 128-bit lane: (l.d0, l.d2, h.d0, h.d2) = columns (0, 1, 4, 5) low lane, (2, 3, 6, 7) high lane.
  const __m256i even = _mm256_castps_si256(_mm256_shuffle_ps(l, h, 0x88)), odd = _mm256_castps_si256(_mm256_shuffle_ps(l, h, 0xDD));
  _mm256_store_si256(reinterpret_cast<__m256i*>(pair0), _mm256_permute4x64_epi64(even, 0xD8));
  _mm256_store_si256(reinterpret_cast<__m256i*>(pair1), _mm256_permute4x64_epi64(odd, 0xD8));
}

// k blocks, then 16-column panels (each widened once), then rows.
template <bool kSignedA>
void gemm(const GemmArgs& g) {
  static thread_local ThreadBuffer a_buffer, panel_buffer;  // grow to the largest A and k block this thread has seen
  std::int16_t* a16 = reinterpret_cast<std::int16_t*>(a_buffer.reserve(std::max<Index>(1, g.rows * g.k) * 2));
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  const Index total = g.rows * g.k;
  Index i = 0;
  for (; i + 16 <= total; i += 16) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a16 + i), kSignedA ? _mm256_cvtepi8_epi16(x) : _mm256_cvtepu8_epi16(x));
  }
  for (; i < total; ++i) a16[i] = kSignedA ? static_cast<std::int16_t>(static_cast<std::int8_t>(a[i])) : std::int16_t{a[i]};
  std::int16_t* bw = reinterpret_cast<std::int16_t*>(panel_buffer.reserve(kKc / 2 * 64));
  for (Index k0 = 0; k0 < g.k || k0 == 0; k0 += kKc) {
    const Index kc = std::min(kKc, g.k - k0), pairs = kc / 2;  // k is a multiple of 4
    const bool first = k0 == 0;
    for (Index n0 = 0; n0 < g.n; n0 += 16) {  // n is a multiple of 16
      const std::int8_t* b = g.b_packed + (k0 / 4) * g.n * 4 + n0 * 4;
      for (Index q = 0; q < kc / 4; ++q, b += g.n * 4)
        for (int h = 0; h < 2; ++h) widen_group(b + 32 * h, bw + q * 64 + 16 * h, bw + q * 64 + 32 + 16 * h);
      const std::int16_t* a_block = a16 + k0;
      Index r0 = 0;
      for (; r0 + 6 <= g.rows; r0 += 6) tile<6>(g, a_block, r0, n0, bw, pairs, first);
      for (; r0 + 4 <= g.rows; r0 += 4) tile<4>(g, a_block, r0, n0, bw, pairs, first);
      for (; r0 + 2 <= g.rows; r0 += 2) tile<2>(g, a_block, r0, n0, bw, pairs, first);
      for (; r0 < g.rows; ++r0) tile<1>(g, a_block, r0, n0, bw, pairs, first);
    }
    if (g.k == 0) break;
  }
}

}  // namespace

void qk_s8s8_s32__avx2_6x16(const GemmArgs& args) { gemm<true>(args); }
void pv_u8s8_s32__avx2_6x16(const GemmArgs& args) { gemm<false>(args); }

}  // namespace qattn::kernels

namespace qattn::kernels {

// Register-only inline assembly (an intrinsics loop let GCC hoist the loop-invariant vpmaddwd and spill the
// accumulators): ymm0 / ymm1 the broadcast s16 operands, ymm2..ymm13 twelve accumulators, each round one vpmaddwd
// into a temporary (ymm14 / ymm15 alternately) and one vpaddd, as the GEMM tiles do.
std::int64_t mac_loop__avx2(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) return no_mac_rounds(checksum);
  volatile int seed = 0x00010001;
  std::int64_t n = iterations;
  alignas(32) std::int32_t lanes[8];
#define QATTN_MAC(acc, tmp) \
  "vpmaddwd %%ymm1, %%ymm0, %%ymm" #tmp "\n\t" "vpaddd %%ymm" #tmp ", %%ymm" #acc ", %%ymm" #acc "\n\t"
#define QATTN_CLEAR(r) "vpxor %%ymm" #r ", %%ymm" #r ", %%ymm" #r "\n\t"
#define QATTN_FOLD(r) "vpaddd %%ymm" #r ", %%ymm2, %%ymm2\n\t"
  asm volatile(
      "vmovd %k[seed], %%xmm0\n\t"
      "vpbroadcastd %%xmm0, %%ymm0\n\t"
      "vpaddw %%ymm0, %%ymm0, %%ymm1\n\t"
      QATTN_CLEAR(2) QATTN_CLEAR(3) QATTN_CLEAR(4) QATTN_CLEAR(5) QATTN_CLEAR(6) QATTN_CLEAR(7) QATTN_CLEAR(8)
      QATTN_CLEAR(9) QATTN_CLEAR(10) QATTN_CLEAR(11) QATTN_CLEAR(12) QATTN_CLEAR(13)
      "1:\n\t"
      QATTN_MAC(2, 14) QATTN_MAC(3, 15) QATTN_MAC(4, 14) QATTN_MAC(5, 15) QATTN_MAC(6, 14) QATTN_MAC(7, 15)
      QATTN_MAC(8, 14) QATTN_MAC(9, 15) QATTN_MAC(10, 14) QATTN_MAC(11, 15) QATTN_MAC(12, 14) QATTN_MAC(13, 15)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      QATTN_FOLD(3) QATTN_FOLD(4) QATTN_FOLD(5) QATTN_FOLD(6) QATTN_FOLD(7) QATTN_FOLD(8) QATTN_FOLD(9) QATTN_FOLD(10)
      QATTN_FOLD(11) QATTN_FOLD(12) QATTN_FOLD(13)
      "vmovdqu %%ymm2, %[lanes]\n\t"
      : [n] "+r"(n), [lanes] "=m"(lanes)
      : [seed] "r"(static_cast<int>(seed))
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "cc");
#undef QATTN_FOLD
#undef QATTN_CLEAR
#undef QATTN_MAC
  *checksum = lanes_checksum(lanes);
  return iterations * 12 * 16;  // 16 MACs per vpmaddwd
}

}  // namespace qattn::kernels
