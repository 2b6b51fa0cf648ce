// The scalar specs of the two GEMM families: plain loops over the packed layout, exact in int32.
#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {

template <typename A>
void gemm_scalar(const GemmArgs& g) {
  const A* a = static_cast<const A*>(g.a);
  for (Index i = 0; i < g.rows; ++i)
    for (Index n = 0; n < g.n; ++n) {
      std::int32_t acc = 0;
      for (Index k = 0; k < g.k; ++k)
        acc += std::int32_t{a[i * g.k + k]} * g.b_packed[(k / 4) * g.n * 4 + n * 4 + k % 4];
      g.c[i * g.n + n] = acc;
    }
}

}  // namespace

void qk_s8s8_s32__scalar(const GemmArgs& args) { gemm_scalar<std::int8_t>(args); }
void pv_u8s8_s32__scalar(const GemmArgs& args) { gemm_scalar<std::uint8_t>(args); }

}  // namespace qattn::kernels

namespace qattn::kernels {

std::int64_t mac_loop__scalar(std::int64_t iterations, std::int32_t* checksum) {
  // Unsigned accumulators: the sums wrap (defined) over long runs; the checksum only keeps the loop alive.
  std::uint32_t acc[12] = {};
  volatile std::int8_t seed = 3;
  const std::int8_t a = seed, b = static_cast<std::int8_t>(seed + 1);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int r = 0; r < 12; ++r) acc[r] += static_cast<std::uint32_t>(a * b);
  std::uint32_t s = 0;
  for (int r = 0; r < 12; ++r) s += acc[r];
  *checksum = static_cast<std::int32_t>(s & 0x7fffffff);
  return iterations * 12;
}

}  // namespace qattn::kernels
