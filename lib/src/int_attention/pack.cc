// Packing of K^T and V into the groups-of-4 layout of kernels.h, with zero padding and column sums. Both loops move a
// whole group of 4 bytes at a time and sum in separate passes the compiler vectorises: O(L d) work beside the
// O(L^2 d) GEMMs, but at L = 2048 the byte-by-byte loops had cost an eighth of a GEMM stage.
#include <algorithm>
#include <bit>
#include <cstring>

#include "qattn/kernels.h"

namespace qattn::kernels {

static_assert(std::endian::native == std::endian::little, "pack_v writes a group of 4 bytes as one word");

void pack_k_transposed(const std::int8_t* k, Index keys, Index d, Index d4, Index keys16,
                       std::int8_t* packed, std::int32_t* sum) {
  std::fill(packed, packed + d4 * keys16, std::int8_t{0});
  std::fill(sum, sum + keys16, 0);
  const Index groups = d / 4;  // whole groups of 4 along d; a tail of d % 4 bytes goes byte by byte
  for (Index j = 0; j < keys; ++j) {
    const std::int8_t* row = k + j * d;
    std::int32_t s = 0;
    for (Index t = 0; t < d; ++t) s += row[t];
    sum[j] = s;
    for (Index g = 0; g < groups; ++g) std::memcpy(packed + (g * keys16 + j) * 4, row + g * 4, 4);
    for (Index t = groups * 4; t < d; ++t) packed[(t / 4) * keys16 * 4 + j * 4 + t % 4] = row[t];
  }
}

void pack_v(const std::int8_t* v, Index keys, Index dv, Index keys4, Index dv16,
            std::int8_t* packed, std::int32_t* sum) {
  std::fill(packed, packed + keys4 * dv16, std::int8_t{0});
  std::fill(sum, sum + dv16, 0);
  for (Index j = 0; j < keys; ++j) {
    const std::int8_t* row = v + j * dv;
    for (Index c = 0; c < dv; ++c) sum[c] += row[c];
  }
  // Group j4 holds keys 4 j4 .. 4 j4 + 3: column c's 4 bytes side by side, as one little-endian word.
  const Index whole = keys / 4 * 4;
  for (Index j0 = 0; j0 < whole; j0 += 4) {
    const std::uint8_t* r0 = reinterpret_cast<const std::uint8_t*>(v + j0 * dv);
    const std::uint8_t *r1 = r0 + dv, *r2 = r1 + dv, *r3 = r2 + dv;
    std::int8_t* out = packed + (j0 / 4) * dv16 * 4;
    for (Index c = 0; c < dv; ++c) {
      const std::uint32_t word = std::uint32_t{r0[c]} | std::uint32_t{r1[c]} << 8 | std::uint32_t{r2[c]} << 16 |
                                 std::uint32_t{r3[c]} << 24;
      std::memcpy(out + c * 4, &word, 4);
    }
  }
  for (Index j = whole; j < keys; ++j)  // the last, partial group
    for (Index c = 0; c < dv; ++c) packed[(j / 4) * dv16 * 4 + c * 4 + j % 4] = v[j * dv + c];
}

}  // namespace qattn::kernels
