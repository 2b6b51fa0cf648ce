// The scalar spec of Quant-Only's float softmax row: the core function softmax_row_lanes16 (the same one the
// reference model's lanes16 option calls), then requantisation to [0, 127].
#include <algorithm>
#include <cmath>
#include <limits>

#include "qattn/exp_f32.h"
#include "qattn/kernels.h"

namespace qattn::kernels {

void softmax_s32_f32_u8__scalar(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                                float* scratch, std::uint8_t* p) {
  limit = std::clamp<Index>(limit, 0, keys);
  for (Index j = 0; j < keys; ++j)
    scratch[j] = j < limit && (!valid || valid[j]) ? static_cast<float>(s[j]) * alpha
                                                   : -std::numeric_limits<float>::infinity();
  softmax_row_lanes16(scratch, nullptr, keys, scratch);
  for (Index j = 0; j < keys; ++j) p[j] = static_cast<std::uint8_t>(std::nearbyint(127.0f * scratch[j]));
}

}  // namespace qattn::kernels
