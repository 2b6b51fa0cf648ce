// Low-precision binary floating-point formats, cpfloat-style: any exponent width, significand width, bias,
// subnormal and special-value policy, with four rounding modes and two overflow modes. Values are carried as
// doubles holding exactly a value of the format. docs/lowp-float.md tabulates the formats and the rules.
//
// Rounding of x (finite, not representable):
//   rne   nearest, ties to even                 (IEEE roundTiesToEven; cvt instructions)
//   rz    toward zero (truncation)              (IEEE roundTowardZero; the FP22 accumulator)
//   rna   nearest, ties away from zero          (IEEE roundTiesToAway)
//   stochastic: up with probability equal to the distance from the lower neighbour, in units of the quantum
//         (seeded std::mt19937_64, so runs replay)
// Overflow (the rounded magnitude exceeds max_finite):
//   saturate:     +-max_finite
//   non-saturating: +-inf if the format has infinities, NaN if it has none (OCP E4M3FN). In rz mode IEEE rounds an
//                   overflow to max_finite, and so does this module.
// NaN stays NaN; +-inf saturates to +-max_finite, or stays inf (NaN for formats without inf).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

namespace qattn::ref {

enum class LowpRounding { rne, rz, rna, stochastic };
enum class LowpOverflow { saturate, non_saturating };

// Which codes are special.
enum class LowpSpecials {
  ieee,      // all-ones exponent: inf (mantissa 0) or NaN
  fn,        // "finite, NaN only": all-ones exponent is a normal binade except all-ones mantissa = NaN (OCP E4M3FN)
  fnuz,      // "finite, NaN unsigned zero" (AMD CDNA3 FP8): every exponent field is a binade; the negative-zero code
             // (sign bit alone) is the only NaN, so zero is unsigned; no infinity
  none,      // every code is a finite number (OCP E2M1): no NaN, no infinity
};

struct LowpFormat {
  std::string name;
  int exponent_bits;
  int mantissa_bits;  // stored fraction bits (precision = mantissa_bits + 1)
  int bias;
  bool subnormals = true;
  LowpSpecials specials = LowpSpecials::ieee;

  int emin() const { return 1 - bias; }  // exponent of the smallest normal
  int emax() const;                      // exponent of the largest finite binade
  double max_finite() const;
  double min_normal() const;
  double min_subnormal() const;
  bool has_inf() const { return specials == LowpSpecials::ieee; }
  int bits() const { return 1 + exponent_bits + mantissa_bits; }
};

const LowpFormat& fp8_e4m3fn();  // OCP E4M3FN: bias 7, max 448, S.1111.111 = NaN, no inf
const LowpFormat& fp8_e5m2();    // OCP E5M2: IEEE-like, bias 15, max 57344, inf
const LowpFormat& fp8_e4m3fnuz();  // E4M3FNUZ: bias 8, max 240, 0x80 = NaN, no -0, no inf
const LowpFormat& fp8_e5m2fnuz();  // E5M2FNUZ: bias 16, max 57344, 0x80 = NaN, no -0, no inf
const LowpFormat& fp4_e2m1();      // OCP E2M1 (MX, NVFP4): bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6; every code finite
const LowpFormat& fp16_binary16();
const LowpFormat& bf16_bfloat16();
const LowpFormat& fp22_accumulator();  // 1 sign, 8 exponent, 13 mantissa bits (bias 127), used with rz

// The value of `x` rounded onto the format. `rng` is needed only for stochastic rounding. A format with neither NaN
// nor infinity (E2M1) saturates on overflow whatever `overflow` says; an FNUZ format rounds to an unsigned zero.
double lowp_round(double x, const LowpFormat& f, LowpRounding mode, LowpOverflow overflow, std::mt19937_64* rng = nullptr);

// Bit patterns. decode is defined for every code; encode takes a value of the format (a lowp_round result) and
// throws std::invalid_argument otherwise.
double lowp_decode(std::uint32_t code, const LowpFormat& f);
std::uint32_t lowp_encode(double value, const LowpFormat& f);

// float32 -> FP8 code as an H100 converts (tests/fixtures/h100-fp8, checked bit for bit over every float32 for PTX and
// over the measured patterns for torch in tests/exact/h100_fp8_conversion_test.cc). Both round to nearest, ties to
// even; they differ beyond the largest finite value and for NaN:
//   ptx_satfinite  PTX cvt.rn.satfinite.{e4m3,e5m2}x2.f32: saturates to +-max_finite (infinities too); NaN -> 0x7F
//   torch          x.to(torch.float8_e4m3fn / float8_e5m2): e4m3fn overflows to NaN (448 < |x| <= 464 rounds to
//                  448, beyond is NaN), e5m2 to +-inf; NaN and an overflow to NaN keep the sign of x (0x7F / 0xFF)
enum class Fp8Cast { ptx_satfinite, torch };
// The E4M3FN value nearest to finite x (ties to even), saturated to +-448: lowp_round(x, fp8_e4m3fn(), rne,
// saturate) in float bit operations, for hot loops (SageAttention2's P~ and V). tests/exact checks the two agree on
// a dense sample of float32 patterns. x must be finite.
// Inline, so that the loops calling it vectorise.
inline float e4m3_round_saturate(float x) {
  const float a = std::fabs(x);
  float r;
  if (a < 0.015625f) {  // below 2^-6: E4M3 subnormals, multiples of 2^-9; a * 512 < 8, and adding then taking away
    constexpr float kShift = 8388608.0f;  // 2^23 rounds it to an integer in the current mode (to nearest even)
    r = ((a * 512.0f + kShift) - kShift) * (1.0f / 512.0f);
  } else {  // keep 3 of float's 23 stored bits, round to nearest even: add half an E4M3 ulp - 1 + lsb
    std::uint32_t u = std::bit_cast<std::uint32_t>(a);
    u += 0x7ffffu + ((u >> 20) & 1u);
    r = std::bit_cast<float>(u & ~0xfffffu);
  }
  r = std::min(r, 448.0f);
  return std::copysign(r, x);
}
std::uint8_t fp8_from_float(float x, const LowpFormat& f, Fp8Cast cast);

}  // namespace qattn::ref
