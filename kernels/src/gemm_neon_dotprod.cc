// NEON dotprod variants of the GEMM families: sdot (s8 x s8, four products summed into each s32 lane), tiles of
// 4 rows x 16 columns (16 q accumulators). The main loop takes 16 bytes of each A row at once and uses sdot by
// element (for the 4-row tile in inline assembly, qattn/neon_tile.h); the last k / 4 mod 4 groups duplicate the A
// group of 4 bytes into every lane.
// qk: A = Q is s8, native. pv: A = P is u8 and sdot has no u8 x s8 form: a ^ 0x80 = a - 128 as s8, flipped once per
// call into a per-thread copy (so the tile loops are Q.K^T's, with no eor), the lanes hold sum (a - 128) b, and
// 128 B_sum[n] is added at the end (|sum| <= 128 * 127 * k, exact in int32).
#include <arm_neon.h>

#include "qattn/kernels.h"
#include "qattn/neon_tile.h"
#include "qattn/thread_buffer.h"

namespace qattn::kernels {
namespace {

// One group of k for every row of the tile: B's 4 vectors times lane kLane of each A row register.
template <int kLane, int R>
inline void lane_step(int32x4_t (&acc)[R][4], const int8x16_t (&av)[R], const std::int8_t* b) {
  int8x16_t bv[4];
  for (int v = 0; v < 4; ++v) bv[v] = vld1q_s8(b + v * 16);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vdotq_laneq_s32(acc[r][v], bv[v], av[r], kLane);
}

// kFlippedA: A holds u8 values as a ^ 0x80 (s8 a - 128); the tile adds 128 B_sum back.
template <bool kFlippedA, int R>
inline void tile(const GemmArgs& g, Index i0, Index n0) {
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
      neon::tile_4x16_main_loop<neon::TileDot::kSdot>(acc, a_rows, g.k, b, g.n * 4, iterations);
      k4 = iterations * 4;
    }
  }
  // Main loop of the 1-row tile, 4 groups of k at a time: 16 bytes of the A row in one register, sdot by element
  // (lane kk picks the group), so no broadcast is issued per group.
  for (; k4 + 4 <= g.k / 4; k4 += 4) {
    int8x16_t av[R];
    for (int r = 0; r < R; ++r) av[r] = vreinterpretq_s8_u8(vld1q_u8(a + (i0 + r) * g.k + k4 * 4));
    lane_step<0, R>(acc, av, b);
    lane_step<1, R>(acc, av, b + g.n * 4);
    lane_step<2, R>(acc, av, b + g.n * 8);
    lane_step<3, R>(acc, av, b + g.n * 12);
    b += g.n * 16;
  }
  for (; k4 < g.k / 4; ++k4, b += g.n * 4) {  // the last k / 4 mod 4 groups: one broadcast each
    int8x16_t bv[4];
    for (int v = 0; v < 4; ++v) bv[v] = vld1q_s8(b + v * 16);
    for (int r = 0; r < R; ++r) {
      std::int32_t group;
      __builtin_memcpy(&group, a + (i0 + r) * g.k + k4 * 4, 4);
      const int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(group));
      for (int v = 0; v < 4; ++v) acc[r][v] = vdotq_s32(acc[r][v], bv[v], av);
    }
  }
  for (int v = 0; v < 4; ++v) {
    const int32x4_t bias = kFlippedA ? vshlq_n_s32(vld1q_s32(g.b_sum + n0 + v * 4), 7) : vdupq_n_s32(0);
    for (int r = 0; r < R; ++r) vst1q_s32(g.c + (i0 + r) * g.n + n0 + v * 4, vaddq_s32(acc[r][v], bias));
  }
}

template <bool kFlippedA>
void gemm(const GemmArgs& g) {
  for (Index n0 = 0; n0 < g.n; n0 += 16) {  // n is a multiple of 16
    Index i0 = 0;
    for (; i0 + 4 <= g.rows; i0 += 4) tile<kFlippedA, 4>(g, i0, n0);
    for (; i0 < g.rows; ++i0) tile<kFlippedA, 1>(g, i0, n0);
  }
}

}  // namespace

void qk_s8s8_s32__neon_dotprod_4x16(const GemmArgs& args) { gemm<false>(args); }

void pv_u8s8_s32__neon_dotprod_4x16(const GemmArgs& args) {
  static thread_local ThreadBuffer copy;  // grows to the largest P block this thread has seen
  const Index n = args.rows * args.k;
  std::uint8_t* flipped = copy.reserve(n);
  const std::uint8_t* p = static_cast<const std::uint8_t*>(args.a);
  Index i = 0;
  for (; i + 16 <= n; i += 16) vst1q_u8(flipped + i, veorq_u8(vld1q_u8(p + i), vdupq_n_u8(0x80)));
  for (; i < n; ++i) flipped[i] = p[i] ^ 0x80;
  GemmArgs h = args;
  h.a = flipped;
  gemm<true>(h);
}

}  // namespace qattn::kernels

namespace qattn::kernels {

// Register-only inline assembly, so that no compiler can spill an accumulator: v0 / v1 the broadcast operands,
// v16..v31 sixteen independent sdot chains (tests/kernels/peak_loop_codegen.py checks the loop body).
std::int64_t mac_loop__neon_dotprod(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) {
    *checksum = 0;
    return 0;
  }
  volatile int seed = 1;
  std::int64_t n = iterations;
  int32x4_t sum;
  asm volatile(
      "dup v0.16b, %w[seed]\n\t"
      "add v1.16b, v0.16b, v0.16b\n\t"
      "movi v16.4s, #0\n\t"
      "movi v17.4s, #0\n\t"
      "movi v18.4s, #0\n\t"
      "movi v19.4s, #0\n\t"
      "movi v20.4s, #0\n\t"
      "movi v21.4s, #0\n\t"
      "movi v22.4s, #0\n\t"
      "movi v23.4s, #0\n\t"
      "movi v24.4s, #0\n\t"
      "movi v25.4s, #0\n\t"
      "movi v26.4s, #0\n\t"
      "movi v27.4s, #0\n\t"
      "movi v28.4s, #0\n\t"
      "movi v29.4s, #0\n\t"
      "movi v30.4s, #0\n\t"
      "movi v31.4s, #0\n\t"
      "1:\n\t"
      "sdot v16.4s, v0.16b, v1.16b\n\t"
      "sdot v17.4s, v0.16b, v1.16b\n\t"
      "sdot v18.4s, v0.16b, v1.16b\n\t"
      "sdot v19.4s, v0.16b, v1.16b\n\t"
      "sdot v20.4s, v0.16b, v1.16b\n\t"
      "sdot v21.4s, v0.16b, v1.16b\n\t"
      "sdot v22.4s, v0.16b, v1.16b\n\t"
      "sdot v23.4s, v0.16b, v1.16b\n\t"
      "sdot v24.4s, v0.16b, v1.16b\n\t"
      "sdot v25.4s, v0.16b, v1.16b\n\t"
      "sdot v26.4s, v0.16b, v1.16b\n\t"
      "sdot v27.4s, v0.16b, v1.16b\n\t"
      "sdot v28.4s, v0.16b, v1.16b\n\t"
      "sdot v29.4s, v0.16b, v1.16b\n\t"
      "sdot v30.4s, v0.16b, v1.16b\n\t"
      "sdot v31.4s, v0.16b, v1.16b\n\t"
      "subs %[n], %[n], #1\n\t"
      "b.ne 1b\n\t"
      "add v16.4s, v16.4s, v17.4s\n\t"
      "add v16.4s, v16.4s, v18.4s\n\t"
      "add v16.4s, v16.4s, v19.4s\n\t"
      "add v16.4s, v16.4s, v20.4s\n\t"
      "add v16.4s, v16.4s, v21.4s\n\t"
      "add v16.4s, v16.4s, v22.4s\n\t"
      "add v16.4s, v16.4s, v23.4s\n\t"
      "add v16.4s, v16.4s, v24.4s\n\t"
      "add v16.4s, v16.4s, v25.4s\n\t"
      "add v16.4s, v16.4s, v26.4s\n\t"
      "add v16.4s, v16.4s, v27.4s\n\t"
      "add v16.4s, v16.4s, v28.4s\n\t"
      "add v16.4s, v16.4s, v29.4s\n\t"
      "add v16.4s, v16.4s, v30.4s\n\t"
      "add v16.4s, v16.4s, v31.4s\n\t"
      "mov %[sum].16b, v16.16b\n\t"
      : [n] "+r"(n), [sum] "=w"(sum)
      : [seed] "r"(static_cast<int>(seed))
      : "v0", "v1", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29",
        "v30", "v31", "cc");
  *checksum = vaddvq_s32(sum) & 0x7fffffff;
  return iterations * 16 * 16;  // 16 MACs per sdot
}

}  // namespace qattn::kernels
