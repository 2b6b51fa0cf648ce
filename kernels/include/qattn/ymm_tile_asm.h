// The inline-assembly frame the 6 x 16 GEMM tiles of gemm_avx2.cc and gemm_avxvnni.cc share: which ymm registers
// hold which accumulators, where each of the tile's A rows is read, and an R-row tile's asm statement built from the
// file's own instructions. Only macros (asm text), so including it under either file's flags compiles nothing.
//
// Row r's two accumulators are fixed in ymm(4 + 2 r) and ymm(5 + 2 r). Rows are addressed from two bases: a0 (rows 0,
// 1, 2, 4 as a0 + {0, 1, 2, 4} lda) and a3 (rows 3, 5 as a3 + {0, 2} lda), so that every row is one addressing mode.
#pragma once

#define QATTN_YMM_STR2(x) #x
#define QATTN_YMM_STR(x) QATTN_YMM_STR2(x)
// Accumulator v (0 or 1) of row r, as an asm operand.
#define QATTN_ACC(r, v) "%%ymm" QATTN_YMM_STR(QATTN_YMM_REG_##r##v)
#define QATTN_YMM_REG_00 4
#define QATTN_YMM_REG_01 5
#define QATTN_YMM_REG_10 6
#define QATTN_YMM_REG_11 7
#define QATTN_YMM_REG_20 8
#define QATTN_YMM_REG_21 9
#define QATTN_YMM_REG_30 10
#define QATTN_YMM_REG_31 11
#define QATTN_YMM_REG_40 12
#define QATTN_YMM_REG_41 13
#define QATTN_YMM_REG_50 14
#define QATTN_YMM_REG_51 15
// The address of row r's current A group (4 bytes) or pair (2 x s16).
#define QATTN_A_ROW(r) QATTN_A_ROW_##r
#define QATTN_A_ROW_0 "(%[a0])"
#define QATTN_A_ROW_1 "(%[a0],%[lda],1)"
#define QATTN_A_ROW_2 "(%[a0],%[lda],2)"
#define QATTN_A_ROW_3 "(%[a3])"
#define QATTN_A_ROW_4 "(%[a0],%[lda],4)"
#define QATTN_A_ROW_5 "(%[a3],%[lda],2)"

// X(r) for every row of an R-row tile (R = 6, 4, 2, 1).
#define QATTN_TILE_ROWS_6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define QATTN_TILE_ROWS_4(X) X(0) X(1) X(2) X(3)
#define QATTN_TILE_ROWS_2(X) X(0) X(1)
#define QATTN_TILE_ROWS_1(X) X(0)

// The k loop: FIRSTS, then per step the two B vectors of the step into ymm0 and ymm1 (LOAD_B: vmovdqa or vmovdqu), b
// advanced by B_STEP, the rows' STEPS, a0 and a3 advanced by one A group (4 bytes), until n steps are done; STORES.
#define QATTN_YMM_TILE_LOOP(LOAD_B, B_STEP, FIRSTS, STEPS, STORES) \
  FIRSTS                                                            \
  "1:\n\t"                                                          \
  LOAD_B " (%[b]), %%ymm0\n\t"                                      \
  LOAD_B " 32(%[b]), %%ymm1\n\t"                                    \
  "add " B_STEP ", %[b]\n\t" STEPS                                  \
  "add $4, %[a0]\n\t"                                               \
  "add $4, %[a3]\n\t"                                               \
  "dec %[n]\n\t"                                                    \
  "jnz 1b\n\t" STORES

// The asm statement of an R-row tile's k loop (ROWS = QATTN_TILE_ROWS_R), from the including file's macros:
// QATTN_LOOP(FIRSTS, STEPS, STORES) the loop around the per-row parts, QATTN_FIRST(r) row r's accumulators before
// the loop, QATTN_STEP(r) row r's share of one k step, QATTN_STORE(r) its sums after the loop, QATTN_OPERANDS.
#define QATTN_TILE_ASM(ROWS) \
  asm volatile(QATTN_LOOP(ROWS(QATTN_FIRST), ROWS(QATTN_STEP), ROWS(QATTN_STORE)) QATTN_OPERANDS)
// The k loop of an R-row tile, R a template parameter of the enclosing function.
#define QATTN_TILE_ASM_FOR_R                                                  \
  if constexpr (R == 6) {                                                     \
    QATTN_TILE_ASM(QATTN_TILE_ROWS_6);                                        \
  } else if constexpr (R == 4) {                                              \
    QATTN_TILE_ASM(QATTN_TILE_ROWS_4);                                        \
  } else if constexpr (R == 2) {                                              \
    QATTN_TILE_ASM(QATTN_TILE_ROWS_2);                                        \
  } else {                                                                    \
    static_assert(R == 1);                                                    \
    QATTN_TILE_ASM(QATTN_TILE_ROWS_1);                                        \
  }
