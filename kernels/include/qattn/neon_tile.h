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
// Only the 4-row tile uses it; the row remainder and the k / 4 mod 4 tail stay in intrinsics (they are not hot).
#pragma once

#include <arm_neon.h>

#include <cstdint>

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

}  // namespace qattn::kernels::neon
