// What every x86 MAC-rate loop (mac_loop__avx2, __avxvnni, __avx512vnni, __amx: int8_mac_peak_loop) does around its
// register-only instruction stream: no rounds for a count <= 0, and a checksum of the accumulators it folds into one
// row of lanes, so that the rounds cannot be optimised away and every ISA reports it the same way. Of internal linkage
// in every file that includes it (qattn/thread_buffer.h says why).
#pragma once

#include <cstdint>

namespace qattn::kernels {
namespace {  // NOLINT(google-build-namespaces): one private copy per ISA file, on purpose

// No rounds asked: none run, the checksum is 0, and so are the MACs returned.
inline std::int64_t no_mac_rounds(std::int32_t* checksum) {
  *checksum = 0;
  return 0;
}

// The folded lanes' sum, wrapping as the vector (or tile) adds did over the run, computed in uint32 where wrapping is
// defined, and its low 31 bits as the (non-negative) checksum.
template <int N>
inline std::int32_t lanes_checksum(const std::int32_t (&lanes)[N]) {
  std::uint32_t t = 0;
  for (const std::int32_t x : lanes) t += static_cast<std::uint32_t>(x);
  return static_cast<std::int32_t>(t & 0x7fffffff);
}

}  // namespace
}  // namespace qattn::kernels
