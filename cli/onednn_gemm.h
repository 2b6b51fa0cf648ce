// oneDNN's int8 matmuls on the bench's shapes, the anchor rows of `qattn bench` (docs/kernels.md). Built only when
// CMake finds oneDNN (Debian libdnnl-dev, an optional dependency of the CLI alone: the library never links it).
#pragma once

#include <cstdint>
#include <string>

namespace qattn::cli {

// True when this build has oneDNN.
bool onednn_built();
// "oneDNN 2.6.3 (OpenMP)", or why there is none.
std::string onednn_version();

// Median milliseconds of oneDNN's two GEMMs on the layouts the fused kernels take, primitives created once outside
// the timing, `threads` OpenMP threads:
//   qk: Q [L, d] s8 row-major x K^T (K [L, d] s8 row-major, read as [d, L]) -> S [L, L] s32
//   pv: P [L, L] u8 row-major x V [L, d] s8 row-major -> O [L, d] s32
struct OneDnnTimes {
  double qk_ms = 0, pv_ms = 0;
};
OneDnnTimes time_onednn_gemms(const std::int8_t* q, const std::int8_t* k, const std::int8_t* v, int L, int d,
                              int threads, int reps);

}  // namespace qattn::cli
