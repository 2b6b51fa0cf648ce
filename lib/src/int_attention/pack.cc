// Packing of K^T and V into the groups-of-4 layout of kernels.h, with zero padding and column sums.
#include <algorithm>

#include "qattn/kernels.h"

namespace qattn::kernels {

void pack_k_transposed(const std::int8_t* k, Index keys, Index d, Index d4, Index keys16,
                       std::int8_t* packed, std::int32_t* sum) {
  std::fill(packed, packed + d4 * keys16, std::int8_t{0});
  std::fill(sum, sum + keys16, 0);
  for (Index j = 0; j < keys; ++j)
    for (Index t = 0; t < d; ++t) {
      packed[(t / 4) * keys16 * 4 + j * 4 + t % 4] = k[j * d + t];
      sum[j] += k[j * d + t];
    }
}

void pack_v(const std::int8_t* v, Index keys, Index dv, Index keys4, Index dv16,
            std::int8_t* packed, std::int32_t* sum) {
  std::fill(packed, packed + keys4 * dv16, std::int8_t{0});
  std::fill(sum, sum + dv16, 0);
  for (Index j = 0; j < keys; ++j)
    for (Index c = 0; c < dv; ++c) {
      packed[(j / 4) * dv16 * 4 + c * 4 + j % 4] = v[j * dv + c];
      sum[c] += v[j * dv + c];
    }
}

}  // namespace qattn::kernels
