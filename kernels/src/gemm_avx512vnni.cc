// AVX-512 VNNI variants of the GEMM families: vpdpbusd (u8 x s8, four products summed into each s32 lane), tiles of
// 8 rows x 48 columns (24 zmm accumulators; 4-row and 1-row tiles for the rows left over), the A group of 4 bytes
// broadcast to every lane.
// qk: A = Q is s8 and enters as the u8 a ^ 0x80 = a + 128, from a copy biased once per call into a per-thread buffer
// (qattn/thread_buffer.h), so every group broadcasts straight from memory; the lanes start from -128 B_sum[n] and add
// sum (a + 128) b (every partial value is a wrapped sum of the same terms as S, which is exact in int32:
// |S| <= 128^2 k, and (a + 128) b sums stay below 255 * 128 * k < 2^31 for k < 65000). It can also fold each row's
// maximum over its visible columns (GemmArgs::row_max), in the tile's epilogue. pv: A = P is u8, native.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "qattn/kernels.h"
#include "qattn/mac_loop_frame.h"
#include "qattn/thread_buffer.h"

namespace qattn::kernels {
namespace {

// The k loop of a 4 x (16 V) tile in inline assembly, its accumulators fixed in zmm16..zmm27 (row r, vector v in
// zmm(16 + 3 r + v)): A groups broadcast from memory (rows a0, a0 + lda, a0 + 2 lda, a3 = a0 + 3 lda) into zmm3, V
// vectors of B loaded into zmm0..zmm2 per group of 4 k, 4 V vpdpbusd; the sums are stored to `out` [4][16 V]. Written
// by hand because GCC 12 compiles the intrinsics loop with a register-to-register copy of every accumulator per
// step (24 vmovdqa per 12 vpdpbusd), which held the Q.K^T tile near 60 % of the peak;
// tests/kernels/peak_loop_codegen.py checks this loop's code.
#define QATTN_ACC(r, v) "%%zmm" QATTN_STR(QATTN_REG_##r##v)
#define QATTN_STR2(x) #x
#define QATTN_STR(x) QATTN_STR2(x)
#define QATTN_REG_00 16
#define QATTN_REG_01 17
#define QATTN_REG_02 18
#define QATTN_REG_10 19
#define QATTN_REG_11 20
#define QATTN_REG_12 21
#define QATTN_REG_20 22
#define QATTN_REG_21 23
#define QATTN_REG_22 24
#define QATTN_REG_30 25
#define QATTN_REG_31 26
#define QATTN_REG_32 27
#define QATTN_DP(r, v) "vpdpbusd %%zmm" #v ", %%zmm3, " QATTN_ACC(r, v) "\n\t"
#define QATTN_ROW1(addr, r) "vpbroadcastd " addr ", %%zmm3\n\t" QATTN_DP(r, 0)
#define QATTN_ROW2(addr, r) QATTN_ROW1(addr, r) QATTN_DP(r, 1)
#define QATTN_ROW3(addr, r) QATTN_ROW2(addr, r) QATTN_DP(r, 2)
#define QATTN_ROWS(ROW) ROW("(%[a0])", 0) ROW("(%[a0],%[lda],1)", 1) ROW("(%[a0],%[lda],2)", 2) ROW("(%[a3])", 3)
#define QATTN_LOAD(v) "vmovdqu64 " #v "*64(%[b]), %%zmm" #v "\n\t"
#define QATTN_ZERO(r, v) "vpxord " QATTN_ACC(r, v) ", " QATTN_ACC(r, v) ", " QATTN_ACC(r, v) "\n\t"
#define QATTN_STORE(r, v, V) "vmovdqu64 " QATTN_ACC(r, v) ", (" #r " * " #V " + " #v ") * 64(%[out])\n\t"
#define QATTN_TILE(ZERO, LOADS, ROW, STORE)                                                                   \
  ZERO(0) ZERO(1) ZERO(2) ZERO(3)                                                                              \
  "1:\n\t" LOADS "add %[bs], %[b]\n\t" QATTN_ROWS(ROW)                                                        \
  "add $4, %[a0]\n\t"                                                                                          \
  "add $4, %[a3]\n\t"                                                                                          \
  "dec %[n]\n\t"                                                                                               \
  "jnz 1b\n\t" STORE(0) STORE(1) STORE(2) STORE(3)
#define QATTN_ZERO3(r) QATTN_ZERO(r, 0) QATTN_ZERO(r, 1) QATTN_ZERO(r, 2)
#define QATTN_ZERO2(r) QATTN_ZERO(r, 0) QATTN_ZERO(r, 1)
#define QATTN_ZERO1(r) QATTN_ZERO(r, 0)
#define QATTN_STORE3(r) QATTN_STORE(r, 0, 3) QATTN_STORE(r, 1, 3) QATTN_STORE(r, 2, 3)
#define QATTN_STORE2(r) QATTN_STORE(r, 0, 2) QATTN_STORE(r, 1, 2)
#define QATTN_STORE1(r) QATTN_STORE(r, 0, 1)
#define QATTN_CLOBBERS                                                                                         \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", \
      "xmm25", "xmm26", "xmm27", "cc", "memory"

template <int V>
inline void k_loop_4rows(const std::uint8_t* a0, Index lda, const std::int8_t* b, Index bs, Index steps,
                         std::int32_t* out) {
  const std::uint8_t* a3 = a0 + 3 * lda;
  if constexpr (V == 3) {
    asm volatile(QATTN_TILE(QATTN_ZERO3, QATTN_LOAD(0) QATTN_LOAD(1) QATTN_LOAD(2), QATTN_ROW3, QATTN_STORE3)
                 : [a0] "+r"(a0), [a3] "+r"(a3), [b] "+r"(b), [n] "+r"(steps)
                 : [lda] "r"(lda), [bs] "r"(bs), [out] "r"(out)
                 : QATTN_CLOBBERS);
  } else if constexpr (V == 2) {
    asm volatile(QATTN_TILE(QATTN_ZERO2, QATTN_LOAD(0) QATTN_LOAD(1), QATTN_ROW2, QATTN_STORE2)
                 : [a0] "+r"(a0), [a3] "+r"(a3), [b] "+r"(b), [n] "+r"(steps)
                 : [lda] "r"(lda), [bs] "r"(bs), [out] "r"(out)
                 : QATTN_CLOBBERS);
  } else {
    static_assert(V == 1);
    asm volatile(QATTN_TILE(QATTN_ZERO1, QATTN_LOAD(0), QATTN_ROW1, QATTN_STORE1)
                 : [a0] "+r"(a0), [a3] "+r"(a3), [b] "+r"(b), [n] "+r"(steps)
                 : [lda] "r"(lda), [bs] "r"(bs), [out] "r"(out)
                 : QATTN_CLOBBERS);
  }
}

// The k loop of an 8 x 48 tile: accumulators in zmm4..zmm27 (row r, vector v in zmm(4 + 3 r + v)), V vectors of B in
// zmm0..zmm2, the A group in zmm3. Rows by three bases: a0 (rows 0, 1, 2, 4 as a0 + {0, 1, 2, 4} lda), a3 (rows 3,
// 5, 7 as a3 + {0, 2, 4} lda) and a6 (row 6). Per group of 4 k: 3 loads of B, 8 broadcasts, 24 vpdpbusd, so half
// the bytes of B per product of the 4-row tile.
#define QATTN8_REG_00 4
#define QATTN8_REG_01 5
#define QATTN8_REG_02 6
#define QATTN8_REG_10 7
#define QATTN8_REG_11 8
#define QATTN8_REG_12 9
#define QATTN8_REG_20 10
#define QATTN8_REG_21 11
#define QATTN8_REG_22 12
#define QATTN8_REG_30 13
#define QATTN8_REG_31 14
#define QATTN8_REG_32 15
#define QATTN8_REG_40 16
#define QATTN8_REG_41 17
#define QATTN8_REG_42 18
#define QATTN8_REG_50 19
#define QATTN8_REG_51 20
#define QATTN8_REG_52 21
#define QATTN8_REG_60 22
#define QATTN8_REG_61 23
#define QATTN8_REG_62 24
#define QATTN8_REG_70 25
#define QATTN8_REG_71 26
#define QATTN8_REG_72 27
#define QATTN8_ACC(r, v) "%%zmm" QATTN_STR(QATTN8_REG_##r##v)
#define QATTN8_DP(r, v) "vpdpbusd %%zmm" #v ", %%zmm3, " QATTN8_ACC(r, v) "\n\t"
#define QATTN8_ROW1(addr, r) "vpbroadcastd " addr ", %%zmm3\n\t" QATTN8_DP(r, 0)
#define QATTN8_ROW2(addr, r) QATTN8_ROW1(addr, r) QATTN8_DP(r, 1)
#define QATTN8_ROW3(addr, r) QATTN8_ROW2(addr, r) QATTN8_DP(r, 2)
#define QATTN8_INIT(r, v) "vmovdqu64 " #v "*64(%[init]), " QATTN8_ACC(r, v) "\n\t"
#define QATTN8_INIT1(r) QATTN8_INIT(r, 0) "add %[ldi], %[init]\n\t"
#define QATTN8_INIT2(r) QATTN8_INIT(r, 0) QATTN8_INIT(r, 1) "add %[ldi], %[init]\n\t"
#define QATTN8_INIT3(r) QATTN8_INIT(r, 0) QATTN8_INIT(r, 1) QATTN8_INIT(r, 2) "add %[ldi], %[init]\n\t"
#define QATTN8_STORE(r, v) "vmovdqu64 " QATTN8_ACC(r, v) ", " #v "*64(%[out])\n\t"
#define QATTN8_STORE1(r) QATTN8_STORE(r, 0) "add %[ldo], %[out]\n\t"
#define QATTN8_STORE2(r) QATTN8_STORE(r, 0) QATTN8_STORE(r, 1) "add %[ldo], %[out]\n\t"
#define QATTN8_STORE3(r) QATTN8_STORE(r, 0) QATTN8_STORE(r, 1) QATTN8_STORE(r, 2) "add %[ldo], %[out]\n\t"
#define QATTN8_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
// The row maxima after the loop (MAX): row r's V vectors folded by vpmaxsd into zmm0 with its 16 running lanes at
// r * 64 bytes from `lanes` (a memory operand, loaded into the free init register), and stored back.
#define QATTN8_MAX3(r) "vpmaxsd " QATTN8_ACC(r, 1) ", " QATTN8_ACC(r, 0) ", %%zmm0\n\t" \
                       "vpmaxsd " QATTN8_ACC(r, 2) ", %%zmm0, %%zmm0\n\t" QATTN8_MAXLANES(r)
#define QATTN8_MAX2(r) "vpmaxsd " QATTN8_ACC(r, 1) ", " QATTN8_ACC(r, 0) ", %%zmm0\n\t" QATTN8_MAXLANES(r)
#define QATTN8_MAX1(r) "vpmaxsd " #r "*64(%[init]), " QATTN8_ACC(r, 0) ", %%zmm0\n\t" \
                       "vmovdqu64 %%zmm0, " #r "*64(%[init])\n\t"
#define QATTN8_MAXLANES(r) "vpmaxsd " #r "*64(%[init]), %%zmm0, %%zmm0\n\t" \
                           "vmovdqu64 %%zmm0, " #r "*64(%[init])\n\t"
#define QATTN8_MAXES(MAX) "mov %[lanes], %[init]\n\t" QATTN8_ALL(MAX)
#define QATTN8_TILE(ZERO, LOADS, ROW, STORE, MAXES)                                                                 \
  QATTN8_ALL(ZERO)                                                                                                 \
  "1:\n\t" LOADS "add %[bs], %[b]\n\t"                                                                             \
  ROW("(%[a0])", 0) ROW("(%[a0],%[lda],1)", 1) ROW("(%[a0],%[lda],2)", 2) ROW("(%[a3])", 3)                        \
  ROW("(%[a0],%[lda],4)", 4) ROW("(%[a3],%[lda],2)", 5) ROW("(%[a6])", 6) ROW("(%[a3],%[lda],4)", 7)               \
  "add $4, %[a0]\n\t"                                                                                              \
  "add $4, %[a3]\n\t"                                                                                              \
  "add $4, %[a6]\n\t"                                                                                              \
  "dec %[n]\n\t"                                                                                                   \
  "jnz 1b\n\t" QATTN8_ALL(STORE) MAXES
#define QATTN8_OPERANDS                                                                                           \
  : [a0] "+r"(a0), [a3] "+r"(a3), [a6] "+r"(a6), [b] "+r"(b), [n] "+r"(steps), [init] "+r"(init), [out] "+r"(out) \
  : [lda] "r"(lda), [bs] "r"(bs), [ldi] "r"(ldi), [ldo] "r"(ldo), [lanes] "m"(lanes)                              \
  : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",       \
    "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24",     \
    "xmm25", "xmm26", "xmm27", "cc", "memory"

// The accumulators start from `init` (rows ldi bytes apart: 0 repeats one row, e.g. zeros or Q.K^T's bias row) and
// end in `out` (rows ldo bytes apart), so a k block after the first adds its products to C's partial sums with no copy
// in between. kMax: each row's final values also fold into its 16 lanes at lanes + 16 r (the tile's columns all
// visible, the last k block).
template <int V, bool kMax>
inline void k_loop_8rows(const std::uint8_t* a0, Index lda, const std::int8_t* b, Index bs, Index steps,
                         const std::int32_t* init, Index ldi, std::int32_t* out, Index ldo, std::int32_t* lanes) {
  const std::uint8_t* a3 = a0 + 3 * lda;
  const std::uint8_t* a6 = a0 + 6 * lda;
#define QATTN8_LOOP(V, INIT, LOADS, MAX)                                                                        \
  if constexpr (kMax) {                                                                                          \
    asm volatile(QATTN8_TILE(INIT, LOADS, QATTN8_ROW##V, QATTN8_STORE##V, QATTN8_MAXES(MAX)) QATTN8_OPERANDS);     \
  } else {                                                                                                       \
    asm volatile(QATTN8_TILE(INIT, LOADS, QATTN8_ROW##V, QATTN8_STORE##V, "") QATTN8_OPERANDS);                  \
  }
  if constexpr (V == 3) {
    QATTN8_LOOP(3, QATTN8_INIT3, QATTN_LOAD(0) QATTN_LOAD(1) QATTN_LOAD(2), QATTN8_MAX3)
  } else if constexpr (V == 2) {
    QATTN8_LOOP(2, QATTN8_INIT2, QATTN_LOAD(0) QATTN_LOAD(1), QATTN8_MAX2)
  } else {
    static_assert(V == 1);
    QATTN8_LOOP(1, QATTN8_INIT1, QATTN_LOAD(0), QATTN8_MAX1)
  }
#undef QATTN8_LOOP
}
#undef QATTN8_OPERANDS
#undef QATTN8_TILE
#undef QATTN8_MAXES
#undef QATTN8_MAXLANES
#undef QATTN8_MAX1
#undef QATTN8_MAX2
#undef QATTN8_MAX3
#undef QATTN8_ALL
#undef QATTN8_STORE3
#undef QATTN8_STORE2
#undef QATTN8_STORE1
#undef QATTN8_STORE
#undef QATTN8_INIT3
#undef QATTN8_INIT2
#undef QATTN8_INIT1
#undef QATTN8_INIT
#undef QATTN8_ROW3
#undef QATTN8_ROW2
#undef QATTN8_ROW1
#undef QATTN8_DP
#undef QATTN8_ACC
#undef QATTN_CLOBBERS
#undef QATTN_STORE1
#undef QATTN_STORE2
#undef QATTN_STORE3
#undef QATTN_ZERO1
#undef QATTN_ZERO2
#undef QATTN_ZERO3
#undef QATTN_TILE
#undef QATTN_STORE
#undef QATTN_ZERO
#undef QATTN_LOAD
#undef QATTN_ROWS
#undef QATTN_ROW3
#undef QATTN_ROW2
#undef QATTN_ROW1
#undef QATTN_DP

// What a call adds to the plain GEMM: the row C starts from on the first k block (Q.K^T's bias row -128 B_sum[n],
// or null for zeros), and the row maxima (GemmArgs::row_max, or null).
struct Epilogue {
  const std::int32_t* init_row = nullptr;
  std::int32_t* lanes = nullptr;
};

// The row maxima of rows [i0, i0 + rows) over C's columns [n0, n0 + 16 V) that are visible, read back from C.
inline void fold_row_max(const GemmArgs& g, const Epilogue& e, Index i0, Index rows, Index n0, int V) {
  for (Index r = i0; r < i0 + rows; ++r) {
    const Index visible = g.limit(r) - n0;
    if (visible <= 0) continue;
    __m512i m = _mm512_loadu_si512(e.lanes + r * 16);
    for (int v = 0; v < V && v * 16 < visible; ++v) {
      const Index n = std::min<Index>(16, visible - v * 16);
      const __mmask16 k = static_cast<__mmask16>((1u << n) - 1u);
      m = _mm512_mask_max_epi32(m, k, m, _mm512_maskz_loadu_epi32(k, g.c + r * g.n + n0 + v * 16));
    }
    _mm512_storeu_si512(e.lanes + r * 16, m);
  }
}

// C's columns [n0, n0 + 16 V) of rows i0..i0 + R - 1 from this k block's sums: C starts from the init row on the first
// k block and from its partial sums on the others (integer adds wrap, so the order of these terms does not change C's
// bits). On the last block, the row maxima over the visible columns, from the stored values.
template <int R, int V, typename Sum>
inline void store_tile(const GemmArgs& g, const Epilogue& e, Index i0, Index n0, bool first, bool last, Sum sum) {
  for (int v = 0; v < V; ++v) {
    for (int r = 0; r < R; ++r) {
      std::int32_t* c = g.c + (i0 + r) * g.n + n0 + v * 16;
      const __m512i from = first ? (e.init_row ? _mm512_loadu_si512(e.init_row + n0 + v * 16) : _mm512_setzero_si512())
                                 : _mm512_loadu_si512(c);
      _mm512_storeu_si512(c, _mm512_add_epi32(sum(r, v), from));
    }
  }
  if (last && e.lanes) fold_row_max(g, e, i0, R, n0, V);
}

// One R x (16 V) tile of C over k in [k0, k0 + kc).
template <int R, int V>
inline void tile(const GemmArgs& g, const Epilogue& e, Index i0, Index n0, Index k0, Index kc, bool first, bool last) {
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a) + i0 * g.k + k0;
  const std::int8_t* b = g.b_packed + (k0 / 4) * g.n * 4 + n0 * 4;
  if constexpr (R == 8) {
    alignas(64) static constexpr std::int32_t kZeros[V * 16] = {};
    if (kc < 4) {  // k = 0: the loop below runs at least once
      store_tile<R, V>(g, e, i0, n0, first, last, [](int, int) { return _mm512_setzero_si512(); });
      return;
    }
    // C += this block's sums in the loop's own loads and stores, from the init row on the first block; the row
    // maxima in the loop's epilogue where the whole tile is visible (every row sees at least the row i0 does).
    std::int32_t* c = g.c + i0 * g.n + n0;
    const Index ldc = g.n * static_cast<Index>(sizeof(std::int32_t));
    const std::int32_t* init = first ? (e.init_row ? e.init_row + n0 : kZeros) : c;
    const Index ldi = first ? 0 : ldc;
    if (last && e.lanes && g.limit(i0) >= n0 + 16 * V) {
      k_loop_8rows<V, true>(a, g.k, b, g.n * 4, kc / 4, init, ldi, c, ldc, e.lanes + i0 * 16);
    } else {
      k_loop_8rows<V, false>(a, g.k, b, g.n * 4, kc / 4, init, ldi, c, ldc, nullptr);
      if (last && e.lanes) fold_row_max(g, e, i0, R, n0, V);
    }
  } else if constexpr (R == 4) {
    alignas(64) std::int32_t sums[R][V * 16];
    if (kc >= 4) k_loop_4rows<V>(a, g.k, b, g.n * 4, kc / 4, &sums[0][0]);
    else std::memset(sums, 0, sizeof sums);
    store_tile<R, V>(g, e, i0, n0, first, last, [&](int r, int v) { return _mm512_load_si512(&sums[r][v * 16]); });
  } else {
    __m512i acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_si512();
    for (Index k4 = 0; k4 < kc / 4; ++k4, b += g.n * 4) {
      __m512i bv[V];
      for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_si512(b + v * 64);
      for (int r = 0; r < R; ++r) {
        std::int32_t group;
        __builtin_memcpy(&group, a + r * g.k + k4 * 4, 4);
        const __m512i av = _mm512_set1_epi32(group);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, bv[v]);
      }
    }
    store_tile<R, V>(g, e, i0, n0, first, last, [&](int r, int v) { return acc[r][v]; });
  }
}

template <int V>
inline void column_panel(const GemmArgs& g, const Epilogue& e, Index n0, Index k0, Index kc, bool first, bool last) {
  Index i0 = 0;
  for (; i0 + 8 <= g.rows; i0 += 8) tile<8, V>(g, e, i0, n0, k0, kc, first, last);
  for (; i0 + 4 <= g.rows; i0 += 4) tile<4, V>(g, e, i0, n0, k0, kc, first, last);
  for (; i0 < g.rows; ++i0) tile<1, V>(g, e, i0, n0, k0, kc, first, last);
}

// k blocks of kKc, then columns, then rows: within one k block the B panel (48 columns x kKc bytes = 12 KiB) stays in
// L1 while every row passes over it. Without the k blocks a long k (P V has k = L_k) streamed a B panel of 48 L_k
// bytes from L3 for every tile. On Zen 5 (two vpdpbusd per cycle) a 4-row tile needs 32 bytes of B per cycle and an
// 8-row one 16: with 4-row tiles, blocks of 1024 (a 48 KiB panel) held P.V at 1.41-1.51 x oneDNN's time there, 256
// at 1.14-1.22; 8-row tiles that add to C in their own loop brought it to 1.00-1.12, with blocks of 256 or 512 alike
// (256 leaves room in Zen 4's 32 KiB L1). Partial sums wait in C between k blocks: each is a sum of a subset of the
// final sum's products, so the overflow bound of the whole sum covers it.
constexpr Index kKc = 256;

void gemm_blocks(const GemmArgs& g, const Epilogue& e) {
  for (Index k0 = 0; k0 < g.k || k0 == 0; k0 += kKc) {
    const Index kc = std::min(kKc, g.k - k0);
    const bool first = k0 == 0, last = k0 + kc >= g.k;
    Index n0 = 0;
    for (; n0 + 48 <= g.n; n0 += 48) column_panel<3>(g, e, n0, k0, kc, first, last);
    if (n0 + 32 <= g.n) column_panel<2>(g, e, n0, k0, kc, first, last), n0 += 32;
    if (n0 < g.n) column_panel<1>(g, e, n0, k0, kc, first, last);  // n is a multiple of 16
    if (g.k == 0) break;
  }
}

void qk_gemm(const GemmArgs& g) {
  // Q biased to u8, and C's first values -128 B_sum[n] (the bias of sum (a + 128) b), once per call into per-thread
  // buffers (qattn/thread_buffer.h), so every group broadcasts straight from memory and the tiles need no bias pass.
  static thread_local ThreadBuffer copy, bias;
  const Index n = g.rows * g.k;
  std::uint8_t* biased = copy.reserve(n);
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  Index i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512(biased + i, _mm512_xor_si512(_mm512_loadu_si512(a + i), _mm512_set1_epi8(static_cast<char>(0x80))));
  for (; i < n; ++i) biased[i] = a[i] ^ 0x80;
  std::int32_t* init_row = reinterpret_cast<std::int32_t*>(bias.reserve(g.n * Index{sizeof(std::int32_t)}));
  for (Index j = 0; j < g.n; j += 16)  // n is a multiple of 16
    _mm512_storeu_si512(init_row + j, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_loadu_si512(g.b_sum + j), 7)));
  if (g.row_max) {
    for (Index r = 0; r < g.rows; ++r) _mm512_storeu_si512(g.row_max + r * 16, _mm512_set1_epi32(std::numeric_limits<std::int32_t>::min()));
  }
  GemmArgs h = g;
  h.a = biased;
  gemm_blocks(h, {init_row, g.row_max});
}

}  // namespace

void qk_s8s8_s32__avx512vnni_8x48(const GemmArgs& args) { qk_gemm(args); }
void pv_u8s8_s32__avx512vnni_8x48(const GemmArgs& args) { gemm_blocks(args, {}); }

}  // namespace qattn::kernels

namespace qattn::kernels {

// Register-only inline assembly, so that no compiler can spill an accumulator or hoist an instruction out of the
// loop: zmm0 / zmm1 hold the broadcast operands, zmm16..zmm31 sixteen independent vpdpbusd chains, enough to cover the
// instruction's latency at two issues per cycle (Zen 5). tests/kernels/peak_loop_codegen.py checks the loop body.
std::int64_t mac_loop__avx512vnni(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) return no_mac_rounds(checksum);
  volatile int seed = 0x01010101;
  std::int64_t n = iterations;
  alignas(64) std::int32_t lanes[16];
#define QATTN_EACH(X) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)
#define QATTN_CLEAR(r) "vpxord %%zmm" #r ", %%zmm" #r ", %%zmm" #r "\n\t"
#define QATTN_CHAIN(r) "vpdpbusd %%zmm1, %%zmm0, %%zmm" #r "\n\t"
#define QATTN_FOLD(r) "vpaddd %%zmm" #r ", %%zmm16, %%zmm16\n\t"
  asm volatile(
      "vpbroadcastd %k[seed], %%zmm0\n\t"
      "vpaddb %%zmm0, %%zmm0, %%zmm1\n\t"
      QATTN_EACH(QATTN_CLEAR)
      "1:\n\t"
      QATTN_EACH(QATTN_CHAIN)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      QATTN_FOLD(17) QATTN_FOLD(18) QATTN_FOLD(19) QATTN_FOLD(20) QATTN_FOLD(21) QATTN_FOLD(22) QATTN_FOLD(23)
      QATTN_FOLD(24) QATTN_FOLD(25) QATTN_FOLD(26) QATTN_FOLD(27) QATTN_FOLD(28) QATTN_FOLD(29) QATTN_FOLD(30)
      QATTN_FOLD(31)
      "vmovdqu32 %%zmm16, %[lanes]\n\t"
      : [n] "+r"(n), [lanes] "=m"(lanes)
      : [seed] "r"(static_cast<int>(seed))
      : "xmm0", "xmm1", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25",
        "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc");
#undef QATTN_FOLD
#undef QATTN_CHAIN
#undef QATTN_CLEAR
#undef QATTN_EACH
  *checksum = lanes_checksum(lanes);
  return iterations * 16 * 64;  // 64 MACs per vpdpbusd
}

}  // namespace qattn::kernels
