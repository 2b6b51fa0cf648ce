// Rounding of doubles onto narrower binary floating-point formats, exactly.
//
// A format is described by its precision p (significand bits including the implicit one), its smallest normal
// exponent emin and its largest finite value. round_to_format(x, f) returns the element of f nearest to x under
// round-to-nearest, ties-to-even (IEEE 754 roundTiesToEven, what vcvt / vcvtps2ph / cvtneps2bf16 do), as a
// double. Subnormals of f are kept (gradual underflow). A result whose magnitude rounds beyond max_finite
// becomes +-inf, as IEEE binary16/bfloat16 conversions do. NaN stays NaN, +-0 keeps its sign.
//
// Exactness: x is scaled by a power of two (exact), rounded to an integer with nearbyint under the default
// FE_TONEAREST mode (exact), and scaled back (exact), so there is no double rounding for any double input.
#pragma once

#include <bit>
#include <cstdint>

namespace qattn {

struct FloatFormat {
  int precision;      // significand bits including the implicit leading bit: binary16 11, bfloat16 8, binary32 24
  int emin;           // exponent of the smallest normal number: binary16 -14, bfloat16 and binary32 -126
  double max_finite;  // largest finite value
};

inline constexpr FloatFormat kBinary16{11, -14, 65504.0};
inline constexpr FloatFormat kBfloat16{8, -126, 3.3895313892515355e38};  // (2 - 2^-7) * 2^127
inline constexpr FloatFormat kBinary32{24, -126, 3.4028234663852886e38};  // (2 - 2^-23) * 2^127

double round_to_format(double x, const FloatFormat& f);

// round_to_format(x, kBinary16) and round_to_format(x, kBfloat16), bit for bit (NaN stays a NaN, +-0 keeps its
// sign), in a few integer and double operations with no library call: the forms the FP16/BF16 models apply to every
// input, logit, probability and output (tests/unit/float_format_test.cc holds them against round_to_format).
inline double round_to_binary16(double x) {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  const std::uint64_t sign = bits & 0x8000000000000000u, a = bits & 0x7fffffffffffffffu;
  if (a >= 0x7ff0000000000000u) return x;                                        // inf, NaN
  if (a >= 0x40effe0000000000u) return std::bit_cast<double>(sign | 0x7ff0000000000000u);  // >= 65520: inf
  if (a >= 0x3f10000000000000u) {                                                // >= 2^-14: 11 significant bits
    const std::uint64_t half = (std::uint64_t{1} << 41) - 1, dropped = (std::uint64_t{1} << 42) - 1;
    return std::bit_cast<double>(sign | ((a + half + ((a >> 42) & 1u)) & ~dropped));  // RNE on 42 dropped bits
  }
  // Below 2^-14 the quantum is 2^-24, the ulp of doubles in [2^28, 2^29): adding 2^28 rounds |x| to it (RNE) and
  // the subtraction is exact (IEEE double arithmetic; the project never builds with -ffast-math).
  const double rounded = (std::bit_cast<double>(a) + 0x1p28) - 0x1p28;
  return std::bit_cast<double>(sign | std::bit_cast<std::uint64_t>(rounded));
}

inline double round_to_bfloat16(double x) {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  const std::uint64_t sign = bits & 0x8000000000000000u, a = bits & 0x7fffffffffffffffu;
  if (a >= 0x7ff0000000000000u) return x;                                        // inf, NaN
  if (a >= 0x47eff00000000000u) return std::bit_cast<double>(sign | 0x7ff0000000000000u);  // >= max + ulp/2: inf
  if (a >= 0x3810000000000000u) {                                                // >= 2^-126: 8 significant bits
    const std::uint64_t half = (std::uint64_t{1} << 44) - 1, dropped = (std::uint64_t{1} << 45) - 1;
    return std::bit_cast<double>(sign | ((a + half + ((a >> 45) & 1u)) & ~dropped));  // RNE on 45 dropped bits
  }
  // Below 2^-126 the quantum is 2^-133, the ulp of doubles in [2^-81, 2^-80).
  const double rounded = (std::bit_cast<double>(a) + 0x1p-81) - 0x1p-81;
  return std::bit_cast<double>(sign | std::bit_cast<std::uint64_t>(rounded));
}

}  // namespace qattn
