// NEON i8mm variant of pv: usdot (u8 group x s8 vector, four products summed into each s32 lane) makes u8 P x s8 V
// native, with no offset; its by-element form sudot (s8 vector x u8 lane) serves the main loop, 16 bytes of each P
// row at once. Tiles of 4 rows x 16 columns. qk keeps the dotprod kernel (sdot is native for s8 x s8).
#include <arm_neon.h>

#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {

// One group of k for every row of the tile: B's 4 vectors times lane kLane of each A row register.
template <int kLane, int R>
inline void lane_step(int32x4_t (&acc)[R][4], const uint8x16_t (&av)[R], const std::int8_t* b) {
  int8x16_t bv[4];
  for (int v = 0; v < 4; ++v) bv[v] = vld1q_s8(b + v * 16);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vsudotq_laneq_s32(acc[r][v], bv[v], av[r], kLane);
}

template <int R>
inline void tile(const GemmArgs& g, Index i0, Index n0) {
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  int32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_s32(0);
  const std::int8_t* b = g.b_packed + n0 * 4;
  Index k4 = 0;
  // Main loop, 4 groups of k at a time: 16 bytes of each P row in one register and sudot by element (s8 V vector x
  // the u8 P group in lane kk), so no broadcast is issued per group.
  for (; k4 + 4 <= g.k / 4; k4 += 4) {
    uint8x16_t av[R];
    for (int r = 0; r < R; ++r) av[r] = vld1q_u8(a + (i0 + r) * g.k + k4 * 4);
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
      std::uint32_t group;
      __builtin_memcpy(&group, a + (i0 + r) * g.k + k4 * 4, 4);
      const uint8x16_t av = vreinterpretq_u8_u32(vdupq_n_u32(group));
      for (int v = 0; v < 4; ++v) acc[r][v] = vusdotq_s32(acc[r][v], av, bv[v]);
    }
  }
  for (int v = 0; v < 4; ++v)
    for (int r = 0; r < R; ++r) vst1q_s32(g.c + (i0 + r) * g.n + n0 + v * 4, acc[r][v]);
}

}  // namespace

void pv_u8s8_s32__neon_i8mm_4x16(const GemmArgs& g) {
  for (Index n0 = 0; n0 < g.n; n0 += 16) {
    Index i0 = 0;
    for (; i0 + 4 <= g.rows; i0 += 4) tile<4>(g, i0, n0);
    for (; i0 < g.rows; ++i0) tile<1>(g, i0, n0);
  }
}

}  // namespace qattn::kernels

namespace qattn::kernels {

std::int64_t mac_loop__neon_i8mm(std::int64_t iterations, std::int32_t* checksum) {
  int32x4_t acc[12];
  for (auto& x : acc) x = vdupq_n_s32(0);
  volatile int seed = 1;
  const uint8x16_t a = vdupq_n_u8(static_cast<std::uint8_t>(seed));
  const int8x16_t b = vdupq_n_s8(static_cast<std::int8_t>(seed + 1));
  for (std::int64_t i = 0; i < iterations; ++i)
    for (auto& x : acc) x = vusdotq_s32(x, a, b);  // 16 MACs each
  int32x4_t s = acc[0];
  for (int r = 1; r < 12; ++r) s = vaddq_s32(s, acc[r]);
  *checksum = vaddvq_s32(s);
  return iterations * 12 * 16;
}

}  // namespace qattn::kernels
