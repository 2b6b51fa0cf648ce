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

void qk_s8s8_s32__neon_dotprod_4x16(const GemmArgs& args) { neon::gemm<neon::TileDot::kSdot, false>(args); }

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
  neon::gemm<neon::TileDot::kSdot, true>(h);
}

// The MAC-rate loop of sdot (qattn/neon_tile.h).
std::int64_t mac_loop__neon_dotprod(std::int64_t iterations, std::int32_t* checksum) {
  return neon::mac_loop<neon::MacDot::kSdot>(iterations, checksum);
}

}  // namespace qattn::kernels
