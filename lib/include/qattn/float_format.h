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

}  // namespace qattn
