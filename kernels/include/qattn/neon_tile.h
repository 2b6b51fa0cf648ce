// The main loop of the NEON 4-row x 16-column GEMM tiles (gemm_neon_dotprod.cc, gemm_neon_i8mm.cc), in inline
// assembly so that the register allocation is fixed: written with intrinsics, GCC 12 kept all 16 B vectors of an
// iteration live next to the 16 accumulators, spilled one to the stack and added vector moves, and LLVM's Cortex-A76
// model ran that loop at 25 MAC/cycle (experiments/arm-estimate).
//
// Registers: v0..v3 the four A rows, 16 bytes each (4 groups of k); v4..v7 and v8..v11 two sets of B's 4 vectors
// (one group of k for 16 columns), alternating so that a set is reloaded while the other is in use; v16..v31 the
// accumulators, row r vector v in v(16 + 4 r + v). (Accumulators as "+w" operands would need 32 of GCC's 30 asm
// operands, so the loop zeroes them itself and stores them to memory at the end.)
// One iteration: 4 A loads, 16 B loads (8 ldp), 64 dot products by element (lane l of each A row = group l),
// 6 integer instructions.
//
// Only the 4-row tile uses it; the row remainder and the k / 4 mod 4 tail stay in intrinsics (they are not hot):
// gemm_tile below, the whole R x 16 tile of both files, each instantiating it for its own dot product only (so no
// i8mm instruction is compiled under the dotprod file's flags). mac_loop is both files' MAC-rate loop.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <type_traits>

#include "qattn/kernels.h"

namespace qattn::kernels::neon {

// Which dot product the tile issues.
enum class TileDot {
  kSdot,         // s8 A x s8 B (qk; pv on dotprod, whose P the caller flipped to s8 once per call)
  kSudotUnsignedA,  // u8 A x s8 B with sudot by element (pv on i8mm: s8 vector x u8 lane)
};

// 4 dot products of one A row (register av, lane l) against the B set b0..b3, into that row's accumulators c0..c3.
#define QATTN_NEON_DOT_ROW(op, c0, c1, c2, c3, av, l, b0, b1, b2, b3) \
  op " " c0 ".4s, " b0 ".16b, " av ".4b[" #l "]\n\t"                \
  op " " c1 ".4s, " b1 ".16b, " av ".4b[" #l "]\n\t"                \
  op " " c2 ".4s, " b2 ".16b, " av ".4b[" #l "]\n\t"                \
  op " " c3 ".4s, " b3 ".16b, " av ".4b[" #l "]\n\t"
// The 16 dot products of group l (lane l of every A row) against one B set.
#define QATTN_NEON_DOT_GROUP(op, l, b0, b1, b2, b3)                         \
  QATTN_NEON_DOT_ROW(op, "v16", "v17", "v18", "v19", "v0", l, b0, b1, b2, b3) \
  QATTN_NEON_DOT_ROW(op, "v20", "v21", "v22", "v23", "v1", l, b0, b1, b2, b3) \
  QATTN_NEON_DOT_ROW(op, "v24", "v25", "v26", "v27", "v2", l, b0, b1, b2, b3) \
  QATTN_NEON_DOT_ROW(op, "v28", "v29", "v30", "v31", "v3", l, b0, b1, b2, b3)
// Load one B set (one group of k, 16 columns: 64 contiguous bytes) and step to the next group.
#define QATTN_NEON_LOAD_B(q0, q1, q2, q3)   \
  "ldp " q0 ", " q1 ", [%[b]]\n\t"          \
  "ldp " q2 ", " q3 ", [%[b], #32]\n\t"     \
  "add %[b], %[b], %[group_bytes]\n\t"
#define QATTN_NEON_LOAD_A             \
  "ldr q0, [%[a]]\n\t"                \
  "ldr q1, [%[a], %[lda1]]\n\t"       \
  "ldr q2, [%[a], %[lda2]]\n\t"       \
  "ldr q3, [%[a], %[lda3]]\n\t"       \
  "add %[a], %[a], #16\n\t"
#define QATTN_NEON_TILE_BODY(op)                            \
  "movi v16.4s, #0\n\t"                                     \
  "movi v17.4s, #0\n\t"                                     \
  "movi v18.4s, #0\n\t"                                     \
  "movi v19.4s, #0\n\t"                                     \
  "movi v20.4s, #0\n\t"                                     \
  "movi v21.4s, #0\n\t"                                     \
  "movi v22.4s, #0\n\t"                                     \
  "movi v23.4s, #0\n\t"                                     \
  "movi v24.4s, #0\n\t"                                     \
  "movi v25.4s, #0\n\t"                                     \
  "movi v26.4s, #0\n\t"                                     \
  "movi v27.4s, #0\n\t"                                     \
  "movi v28.4s, #0\n\t"                                     \
  "movi v29.4s, #0\n\t"                                     \
  "movi v30.4s, #0\n\t"                                     \
  "movi v31.4s, #0\n\t"                                     \
  "1:\n\t"                                                  \
  QATTN_NEON_LOAD_A                                         \
  QATTN_NEON_LOAD_B("q4", "q5", "q6", "q7")                 \
  QATTN_NEON_LOAD_B("q8", "q9", "q10", "q11")               \
  QATTN_NEON_DOT_GROUP(op, 0, "v4", "v5", "v6", "v7")       \
  QATTN_NEON_LOAD_B("q4", "q5", "q6", "q7")                 \
  QATTN_NEON_DOT_GROUP(op, 1, "v8", "v9", "v10", "v11")     \
  QATTN_NEON_LOAD_B("q8", "q9", "q10", "q11")               \
  QATTN_NEON_DOT_GROUP(op, 2, "v4", "v5", "v6", "v7")       \
  QATTN_NEON_DOT_GROUP(op, 3, "v8", "v9", "v10", "v11")     \
  "subs %[n], %[n], #1\n\t"                                 \
  "b.ne 1b\n\t"                                             \
  "stp q16, q17, [%[c]]\n\t"                                \
  "stp q18, q19, [%[c], #32]\n\t"                           \
  "stp q20, q21, [%[c], #64]\n\t"                           \
  "stp q22, q23, [%[c], #96]\n\t"                           \
  "stp q24, q25, [%[c], #128]\n\t"                          \
  "stp q26, q27, [%[c], #160]\n\t"                          \
  "stp q28, q29, [%[c], #192]\n\t"                          \
  "stp q30, q31, [%[c], #224]\n\t"
#define QATTN_NEON_TILE_OPERANDS                                                                                 \
  : [a] "+r"(a), [b] "+r"(b), [n] "+r"(iterations)                                                              \
  : [c] "r"(&c[0][0]), [lda1] "r"(lda), [lda2] "r"(2 * lda), [lda3] "r"(3 * lda), [group_bytes] "r"(group_bytes)  \
  : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v16", "v17", "v18", "v19", "v20", \
    "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31", "cc", "memory"

// Runs `iterations` (> 0) steps of 4 groups of k over the 4 A rows a, a + lda, a + 2 lda, a + 3 lda (bytes) and the
// packed B (group_bytes = 4 n bytes between groups) and writes the sums, from zero, to c[row][vector]. Leaves a
// 16 bytes and b 4 group_bytes further on per iteration, ready for the tail.
template <TileDot kDot>
inline void tile_4x16_main_loop(int32x4_t (&c)[4][4], const std::uint8_t*& a, Index lda, const std::int8_t*& b,
                                Index group_bytes, Index iterations) {
  if constexpr (kDot == TileDot::kSdot) {
    asm volatile(QATTN_NEON_TILE_BODY("sdot") QATTN_NEON_TILE_OPERANDS);
  } else {
    asm volatile(QATTN_NEON_TILE_BODY("sudot") QATTN_NEON_TILE_OPERANDS);
  }
}

#undef QATTN_NEON_DOT_ROW
#undef QATTN_NEON_DOT_GROUP
#undef QATTN_NEON_LOAD_B
#undef QATTN_NEON_LOAD_A
#undef QATTN_NEON_TILE_BODY
#undef QATTN_NEON_TILE_OPERANDS

namespace {  // NOLINT(google-build-namespaces): one private copy per ISA file, on purpose (qattn/thread_buffer.h)

// An A row register of 16 bytes (4 groups of k) as the dot product reads it: s8 for sdot, u8 for sudot / usdot.
template <TileDot kDot>
using ARow = std::conditional_t<kDot == TileDot::kSdot, int8x16_t, uint8x16_t>;

// One group of k for every row of the tile: B's 4 vectors times lane kLane of each A row register (sdot, or sudot:
// s8 vector x u8 lane).
template <TileDot kDot, int kLane, int R>
inline void lane_step(int32x4_t (&acc)[R][4], const ARow<kDot> (&av)[R], const std::int8_t* b) {
  int8x16_t bv[4];
  for (int v = 0; v < 4; ++v) bv[v] = vld1q_s8(b + v * 16);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v)
      if constexpr (kDot == TileDot::kSdot) acc[r][v] = vdotq_laneq_s32(acc[r][v], bv[v], av[r], kLane);
      else acc[r][v] = vsudotq_laneq_s32(acc[r][v], bv[v], av[r], kLane);
}

// One R x 16 tile of C = A B (R = 4 or 1) from zero: the 4-row main loop above, then 4 groups of k at a time for the
// 1-row tile, then the last k / 4 mod 4 groups one broadcast each. kFlippedA (sdot only): A holds u8 values as
// a ^ 0x80 (s8 a - 128), and the tile adds 128 B_sum back.
template <TileDot kDot, bool kFlippedA, int R>
inline void gemm_tile(const GemmArgs& g, Index i0, Index n0) {
  static_assert(!kFlippedA || kDot == TileDot::kSdot);
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  int32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_s32(0);
  const std::int8_t* b = g.b_packed + n0 * 4;
  Index k4 = 0;
  if constexpr (R == 4) {
    const Index iterations = g.k / 16;
    if (iterations > 0) {
      const std::uint8_t* a_rows = a + i0 * g.k;
      tile_4x16_main_loop<kDot>(acc, a_rows, g.k, b, g.n * 4, iterations);
      k4 = iterations * 4;
    }
  }
  // Main loop of the 1-row tile, 4 groups of k at a time: 16 bytes of the A row in one register, the dot product by
  // element (lane kk picks the group), so no broadcast is issued per group.
  for (; k4 + 4 <= g.k / 4; k4 += 4) {
    ARow<kDot> av[R];
    for (int r = 0; r < R; ++r)
      if constexpr (kDot == TileDot::kSdot) av[r] = vreinterpretq_s8_u8(vld1q_u8(a + (i0 + r) * g.k + k4 * 4));
      else av[r] = vld1q_u8(a + (i0 + r) * g.k + k4 * 4);
    lane_step<kDot, 0, R>(acc, av, b);
    lane_step<kDot, 1, R>(acc, av, b + g.n * 4);
    lane_step<kDot, 2, R>(acc, av, b + g.n * 8);
    lane_step<kDot, 3, R>(acc, av, b + g.n * 12);
    b += g.n * 16;
  }
  for (; k4 < g.k / 4; ++k4, b += g.n * 4) {  // the last k / 4 mod 4 groups: one broadcast each
    int8x16_t bv[4];
    for (int v = 0; v < 4; ++v) bv[v] = vld1q_s8(b + v * 16);
    for (int r = 0; r < R; ++r) {
      if constexpr (kDot == TileDot::kSdot) {
        std::int32_t group;
        __builtin_memcpy(&group, a + (i0 + r) * g.k + k4 * 4, 4);
        const int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(group));
        for (int v = 0; v < 4; ++v) acc[r][v] = vdotq_s32(acc[r][v], bv[v], av);
      } else {
        std::uint32_t group;
        __builtin_memcpy(&group, a + (i0 + r) * g.k + k4 * 4, 4);
        const uint8x16_t av = vreinterpretq_u8_u32(vdupq_n_u32(group));
        for (int v = 0; v < 4; ++v) acc[r][v] = vusdotq_s32(acc[r][v], av, bv[v]);
      }
    }
  }
  for (int v = 0; v < 4; ++v) {
    if constexpr (kFlippedA) {
      const int32x4_t bias = vshlq_n_s32(vld1q_s32(g.b_sum + n0 + v * 4), 7);
      for (int r = 0; r < R; ++r) vst1q_s32(g.c + (i0 + r) * g.n + n0 + v * 4, vaddq_s32(acc[r][v], bias));
    } else {
      for (int r = 0; r < R; ++r) vst1q_s32(g.c + (i0 + r) * g.n + n0 + v * 4, acc[r][v]);
    }
  }
}

// The whole GEMM: 16-column panels (n is a multiple of 16), 4-row tiles, then 1-row tiles for the rows left over.
template <TileDot kDot, bool kFlippedA>
inline void gemm(const GemmArgs& g) {
  for (Index n0 = 0; n0 < g.n; n0 += 16) {
    Index i0 = 0;
    for (; i0 + 4 <= g.rows; i0 += 4) gemm_tile<kDot, kFlippedA, 4>(g, i0, n0);
    for (; i0 < g.rows; ++i0) gemm_tile<kDot, kFlippedA, 1>(g, i0, n0);
  }
}

// The dot product a MAC-rate loop issues: sdot (s8 x s8, dotprod) or usdot (u8 x s8, i8mm), 16 MACs each.
enum class MacDot { kSdot, kUsdot };

#define QATTN_NEON_EACH_ACC(X) \
  X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)
#define QATTN_NEON_CLEAR(r) "movi v" #r ".4s, #0\n\t"
#define QATTN_NEON_SDOT(r) "sdot v" #r ".4s, v0.16b, v1.16b\n\t"
#define QATTN_NEON_USDOT(r) "usdot v" #r ".4s, v0.16b, v1.16b\n\t"
#define QATTN_NEON_FOLD(r) "add v16.4s, v16.4s, v" #r ".4s\n\t"
#define QATTN_NEON_MAC_LOOP(CHAIN)                                                                              \
  "dup v0.16b, %w[seed]\n\t"                                                                                    \
  "add v1.16b, v0.16b, v0.16b\n\t" QATTN_NEON_EACH_ACC(QATTN_NEON_CLEAR)                                       \
  "1:\n\t" QATTN_NEON_EACH_ACC(CHAIN)                                                                          \
  "subs %[n], %[n], #1\n\t"                                                                                     \
  "b.ne 1b\n\t"                                                                                                 \
  QATTN_NEON_FOLD(17) QATTN_NEON_FOLD(18) QATTN_NEON_FOLD(19) QATTN_NEON_FOLD(20) QATTN_NEON_FOLD(21)            \
  QATTN_NEON_FOLD(22) QATTN_NEON_FOLD(23) QATTN_NEON_FOLD(24) QATTN_NEON_FOLD(25) QATTN_NEON_FOLD(26)            \
  QATTN_NEON_FOLD(27) QATTN_NEON_FOLD(28) QATTN_NEON_FOLD(29) QATTN_NEON_FOLD(30) QATTN_NEON_FOLD(31)            \
  "mov %[sum].16b, v16.16b\n\t"
#define QATTN_NEON_MAC_OPERANDS                                                                                 \
  : [n] "+r"(n), [sum] "=w"(sum)                                                                               \
  : [seed] "r"(static_cast<int>(seed))                                                                         \
  : "v0", "v1", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", \
    "v30", "v31", "cc"

// The MAC-rate loop of mac_loop__neon_*: register-only inline assembly, so that no compiler can spill an
// accumulator: v0 / v1 the broadcast operands, v16..v31 sixteen independent chains of the dot product
// (tests/kernels/peak_loop_codegen.py checks the loop body in the caller, into which this is always inlined).
template <MacDot kDot>
[[gnu::always_inline]] inline std::int64_t mac_loop(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) {
    *checksum = 0;
    return 0;
  }
  volatile int seed = 1;
  std::int64_t n = iterations;
  int32x4_t sum;
  if constexpr (kDot == MacDot::kSdot) asm volatile(QATTN_NEON_MAC_LOOP(QATTN_NEON_SDOT) QATTN_NEON_MAC_OPERANDS);
  else asm volatile(QATTN_NEON_MAC_LOOP(QATTN_NEON_USDOT) QATTN_NEON_MAC_OPERANDS);
  *checksum = vaddvq_s32(sum) & 0x7fffffff;
  return iterations * 16 * 16;  // 16 MACs per sdot or usdot
}

#undef QATTN_NEON_EACH_ACC
#undef QATTN_NEON_CLEAR
#undef QATTN_NEON_SDOT
#undef QATTN_NEON_USDOT
#undef QATTN_NEON_FOLD
#undef QATTN_NEON_MAC_LOOP
#undef QATTN_NEON_MAC_OPERANDS

}  // namespace

}  // namespace qattn::kernels::neon
