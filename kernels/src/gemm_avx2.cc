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
#include "qattn/thread_buffer.h"

namespace qattn::kernels {
namespace {

// k blocks of 256: a widened panel is then 128 pairs x 64 bytes = 8 KiB and stays in L1 while every row passes over
// it. Partial sums wait in C between k blocks: each is a sum of a subset of the final sum's products, so the bound of
// the whole sum covers it.
constexpr Index kKc = 256;

// The k loop of an R x 16 tile (R = 6, 4, 2 or 1) in inline assembly: row r's accumulators fixed in ymm(4 + 2 r) and
// ymm(5 + 2 r), the panel's two vectors of a pair in ymm0 and ymm1, the A pair broadcast from memory into ymm2, each
// product in ymm3 before its add. Rows by two bases: a0 (rows 0, 1, 2, 4 as a0 + {0, 1, 2, 4} lda) and a3 (rows 3, 5
// as a3 + {0, 2} lda). The sums are stored to `out` [R][16]. In assembly for the same reason as the AVX-VNNI tile
// (gemm_avxvnni.cc): a compiler may copy or spill accumulators in a loop that uses every register;
// tests/kernels/peak_loop_codegen.py checks it.
#define QATTN_STR2(x) #x
#define QATTN_STR(x) QATTN_STR2(x)
#define QATTN_ACC(r, v) "%%ymm" QATTN_STR(QATTN_REG_##r##v)
#define QATTN_REG_00 4
#define QATTN_REG_01 5
#define QATTN_REG_10 6
#define QATTN_REG_11 7
#define QATTN_REG_20 8
#define QATTN_REG_21 9
#define QATTN_REG_30 10
#define QATTN_REG_31 11
#define QATTN_REG_40 12
#define QATTN_REG_41 13
#define QATTN_REG_50 14
#define QATTN_REG_51 15
#define QATTN_ROW(addr, r)                                                                              \
  "vpbroadcastd " addr ", %%ymm2\n\t"                                                                   \
  "vpmaddwd %%ymm0, %%ymm2, %%ymm3\n\t"                                                                 \
  "vpaddd %%ymm3, " QATTN_ACC(r, 0) ", " QATTN_ACC(r, 0) "\n\t"                                         \
  "vpmaddwd %%ymm1, %%ymm2, %%ymm3\n\t"                                                                 \
  "vpaddd %%ymm3, " QATTN_ACC(r, 1) ", " QATTN_ACC(r, 1) "\n\t"
#define QATTN_ROW0 QATTN_ROW("(%[a0])", 0)
#define QATTN_ROW1 QATTN_ROW("(%[a0],%[lda],1)", 1)
#define QATTN_ROW2 QATTN_ROW("(%[a0],%[lda],2)", 2)
#define QATTN_ROW3 QATTN_ROW("(%[a3])", 3)
#define QATTN_ROW4 QATTN_ROW("(%[a0],%[lda],4)", 4)
#define QATTN_ROW5 QATTN_ROW("(%[a3],%[lda],2)", 5)
#define QATTN_ZERO(r) "vpxor " QATTN_ACC(r, 0) ", " QATTN_ACC(r, 0) ", " QATTN_ACC(r, 0) "\n\t" \
                      "vpxor " QATTN_ACC(r, 1) ", " QATTN_ACC(r, 1) ", " QATTN_ACC(r, 1) "\n\t"
#define QATTN_STORE(r) "vmovdqu " QATTN_ACC(r, 0) ", " #r "*64(%[out])\n\t" \
                       "vmovdqu " QATTN_ACC(r, 1) ", " #r "*64+32(%[out])\n\t"
#define QATTN_LOOP(ZEROS, ROWS, STORES)                                                                 \
  ZEROS                                                                                                 \
  "1:\n\t"                                                                                              \
  "vmovdqa (%[b]), %%ymm0\n\t"                                                                          \
  "vmovdqa 32(%[b]), %%ymm1\n\t"                                                                        \
  "add $64, %[b]\n\t" ROWS                                                                              \
  "add $4, %[a0]\n\t"                                                                                   \
  "add $4, %[a3]\n\t"                                                                                   \
  "dec %[n]\n\t"                                                                                        \
  "jnz 1b\n\t" STORES
#define QATTN_OPERANDS                                                                                  \
  : [a0] "+r"(a0), [a3] "+r"(a3), [b] "+r"(b), [n] "+r"(pairs)                                           \
  : [lda] "r"(lda), [out] "r"(out)                                                                       \
  : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
    "xmm13", "xmm14", "xmm15", "cc", "memory"

// a0: row 0's first pair (s16), lda: the rows' stride in bytes, b: the panel's first pair, pairs >= 1.
template <int R>
inline void k_loop(const std::int16_t* a0, Index lda, const std::int16_t* b, Index pairs, std::int32_t* out) {
  const std::int16_t* a3 = reinterpret_cast<const std::int16_t*>(reinterpret_cast<const char*>(a0) + 3 * lda);
  if constexpr (R == 6) {
    asm volatile(QATTN_LOOP(QATTN_ZERO(0) QATTN_ZERO(1) QATTN_ZERO(2) QATTN_ZERO(3) QATTN_ZERO(4) QATTN_ZERO(5),
                            QATTN_ROW0 QATTN_ROW1 QATTN_ROW2 QATTN_ROW3 QATTN_ROW4 QATTN_ROW5,
                            QATTN_STORE(0) QATTN_STORE(1) QATTN_STORE(2) QATTN_STORE(3) QATTN_STORE(4) QATTN_STORE(5))
                     QATTN_OPERANDS);
  } else if constexpr (R == 4) {
    asm volatile(QATTN_LOOP(QATTN_ZERO(0) QATTN_ZERO(1) QATTN_ZERO(2) QATTN_ZERO(3),
                            QATTN_ROW0 QATTN_ROW1 QATTN_ROW2 QATTN_ROW3,
                            QATTN_STORE(0) QATTN_STORE(1) QATTN_STORE(2) QATTN_STORE(3)) QATTN_OPERANDS);
  } else if constexpr (R == 2) {
    asm volatile(QATTN_LOOP(QATTN_ZERO(0) QATTN_ZERO(1), QATTN_ROW0 QATTN_ROW1, QATTN_STORE(0) QATTN_STORE(1))
                     QATTN_OPERANDS);
  } else {
    static_assert(R == 1);
    asm volatile(QATTN_LOOP(QATTN_ZERO(0), QATTN_ROW0, QATTN_STORE(0)) QATTN_OPERANDS);
  }
}
#undef QATTN_OPERANDS
#undef QATTN_LOOP
#undef QATTN_STORE
#undef QATTN_ZERO
#undef QATTN_ROW5
#undef QATTN_ROW4
#undef QATTN_ROW3
#undef QATTN_ROW2
#undef QATTN_ROW1
#undef QATTN_ROW0
#undef QATTN_ROW
#undef QATTN_ACC
#undef QATTN_STR
#undef QATTN_STR2

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
