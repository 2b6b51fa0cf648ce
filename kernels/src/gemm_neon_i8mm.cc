// NEON i8mm variant of pv: usdot (u8 group x s8 vector, four products summed into each s32 lane) makes u8 P x s8 V
// native, with no offset; its by-element form sudot (s8 vector x u8 lane) serves the main loop, 16 bytes of each P
// row at once. Tiles of 4 rows x 16 columns (qattn/neon_tile.h). qk keeps the dotprod kernel (sdot is native for
// s8 x s8).
#include <arm_neon.h>

#include "qattn/kernels.h"
#include "qattn/neon_tile.h"

namespace qattn::kernels {

void pv_u8s8_s32__neon_i8mm_4x16(const GemmArgs& g) { neon::gemm<neon::TileDot::kSudotUnsignedA, false>(g); }

// The MAC-rate loop of usdot (qattn/neon_tile.h).
std::int64_t mac_loop__neon_i8mm(std::int64_t iterations, std::int32_t* checksum) {
  return neon::mac_loop<neon::MacDot::kUsdot>(iterations, checksum);
}

}  // namespace qattn::kernels
