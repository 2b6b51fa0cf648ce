// floor(n / d) by a multiply and a shift, for the IndexSoftmax normalisation floor(255 E / S) (Eq. 15): a
// per-row reciprocal replaces one division per element. Exact for every numerator 0 <= n < 2^16 and every
// divisor 1 <= d < 2^47 (the row sum S = sum E <= 255 L):
//
//   l = ceil(log2 d),  shift = 16 + l,  m = ceil(2^shift / d),  floor(n / d) == (n * m) >> shift.
//
// Proof (docs/methods/index-softmax.md, "Fast normalisation"): write m d = 2^shift + e with 0 <= e < d, and
// n = q d + r with 0 <= r < d. Then n m / 2^shift = q + (r + n e / 2^shift) / d, and n e / 2^shift < 2^16 d /
// 2^(16 + l) = d / 2^l <= 1, so r + n e / 2^shift < d and the floor is q. m <= 2^17 + 1 and n m < 2^34: the product
// fits 64 bits with room. tests/exact/certify_index_test.cc checks it exhaustively for S up to 255 * 65536.
#pragma once

#include <bit>
#include <cstdint>
#include <stdexcept>

namespace qattn {

struct FloorDivider16 {
  std::uint64_t multiplier = 0;
  int shift = 0;

  static FloorDivider16 make(std::uint64_t d) {
    if (d < 1 || d >= (std::uint64_t{1} << 47)) throw std::invalid_argument("FloorDivider16: divisor outside [1, 2^47)");
    const int l = d == 1 ? 0 : std::bit_width(d - 1);  // ceil(log2 d)
    FloorDivider16 f;
    f.shift = 16 + l;
    const std::uint64_t p = std::uint64_t{1} << f.shift;  // shift <= 63; p + d - 1 < 2^63 + 2^47 fits
    f.multiplier = (p + d - 1) / d;
    return f;
  }
  // n in [0, 2^16).
  std::uint32_t divide(std::uint32_t n) const {
    return static_cast<std::uint32_t>((std::uint64_t{n} * multiplier) >> shift);  // n m < 2^34
  }
};

}  // namespace qattn
