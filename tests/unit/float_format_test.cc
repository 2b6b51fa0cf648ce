// round_to_format and the 16-bit conversions against independent constructions.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "qattn/float_format.h"
#include "qattn/tensor.h"

using namespace qattn;

namespace {
// Value of a binary16 bit pattern, computed from the IEEE layout directly (independent of the library).
double f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000) ? -1 : 1;
  if (e == 31) return m ? NAN : s * INFINITY;
  return e ? s * std::ldexp(1024 + m, e - 25) : s * std::ldexp(m, -24);
}
}  // namespace

TEST_CASE("binary16: every finite pattern decodes exactly and round-trips", "[float_format]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const double v = f16_value(static_cast<std::uint16_t>(h));
    const float f = f16_bits_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(v)) {
      REQUIRE(std::isnan(f));
      continue;
    }
    REQUIRE(static_cast<double>(f) == v);
    REQUIRE(round_to_format(v, kBinary16) == v);
    REQUIRE(f32_to_f16_bits(f) == h);
  }
}

TEST_CASE("binary16: midpoints round to even, near-midpoints to nearest", "[float_format]") {
  // Consecutive positive finite patterns h, h+1: the midpoint goes to the even one, a hair off goes to the near one.
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {
    const double a = f16_value(static_cast<std::uint16_t>(h)), b = f16_value(static_cast<std::uint16_t>(h + 1));
    const double mid = a + (b - a) / 2;  // exact in double
    const double even = (h % 2 == 0) ? a : b;
    REQUIRE(round_to_format(mid, kBinary16) == even);
    REQUIRE(round_to_format(-mid, kBinary16) == -even);
    REQUIRE(round_to_format(std::nextafter(mid, -INFINITY), kBinary16) == a);
    REQUIRE(round_to_format(std::nextafter(mid, INFINITY), kBinary16) == b);
  }
}

TEST_CASE("binary16 and bfloat16 overflow to infinity at max + half an ulp", "[float_format]") {
  // binary16: max 65504, ulp 32: 65519.99 stays, 65520 (the tie, odd side is max) goes to inf.
  CHECK(round_to_format(65519.99, kBinary16) == 65504.0);
  CHECK(std::isinf(round_to_format(65520.0, kBinary16)));
  CHECK(std::isinf(round_to_format(-1e6, kBinary16)));
  CHECK(round_to_format(-1e6, kBinary16) < 0);
  const double bf_max = kBfloat16.max_finite, bf_half_ulp = std::ldexp(1.0, 127 - 8);
  CHECK(round_to_format(bf_max + bf_half_ulp * 0.99, kBfloat16) == bf_max);
  CHECK(std::isinf(round_to_format(bf_max + bf_half_ulp, kBfloat16)));
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(std::isnan(f16_bits_to_f32(f32_to_f16_bits(NAN))));
  CHECK(std::signbit(round_to_format(-0.0, kBinary16)));
}

TEST_CASE("bfloat16: bit rounding agrees with round_to_format on random floats", "[float_format]") {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(bits(gen));
    if (std::isnan(f)) continue;
    const double r = round_to_format(f, kBfloat16);
    REQUIRE(static_cast<double>(bf16_bits_to_f32(f32_to_bf16_bits(f))) == r);
    ++checked;
  }
  CHECK(checked > 190000);
}

TEST_CASE("binary32 format equals the hardware double->float conversion", "[float_format]") {
  std::mt19937_64 gen(11);
  std::uniform_int_distribution<std::uint64_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const double d = std::bit_cast<double>(bits(gen));
    if (!std::isfinite(d)) continue;
    const double hw = static_cast<double>(static_cast<float>(d));
    REQUIRE(round_to_format(d, kBinary32) == hw);
  }
}

TEST_CASE("round_to_binary16/bfloat16 equal round_to_format on every exponent and rounding case", "[float_format]") {
  // Floats: every sign and exponent field, each with every value of the 11 low mantissa bits under 16 high patterns
  // (ties, near-ties and carries of binary16's 13 dropped bits and bfloat16's 16) and 256 random mantissas:
  // binary16's normal and subnormal ranges, both overflow thresholds, and float's own subnormals.
  std::mt19937_64 gen(19);
  std::uniform_int_distribution<std::uint64_t> bits64;
  const std::uint32_t highs[] = {0x000000u, 0x001000u, 0x002000u, 0x003000u, 0x7fe000u, 0x7ff000u, 0x400000u,
                                 0x7fff00u, 0x00ff00u, 0x008000u, 0x018000u, 0x7f0000u, 0x010000u, 0x7e8000u,
                                 0x3fe000u, 0x001800u};
  long checked = 0;
  auto check = [&](double x) {
    const double h = round_to_binary16(x), b = round_to_bfloat16(x);
    if (std::isnan(x)) {
      REQUIRE(std::isnan(h));
      REQUIRE(std::isnan(b));
      return;
    }
    REQUIRE(std::bit_cast<std::uint64_t>(h) == std::bit_cast<std::uint64_t>(round_to_format(x, kBinary16)));
    REQUIRE(std::bit_cast<std::uint64_t>(b) == std::bit_cast<std::uint64_t>(round_to_format(x, kBfloat16)));
    ++checked;
  };
  for (std::uint32_t sign_exp = 0; sign_exp < 512; ++sign_exp) {
    const auto as_float = [&](std::uint32_t mantissa) { return std::bit_cast<float>((sign_exp << 23) | mantissa); };
    for (const std::uint32_t high : highs)
      for (std::uint32_t low = 0; low < (1u << 11); ++low) check(as_float((high & ~0x7ffu) | low));
    for (int i = 0; i < 256; ++i) check(as_float(static_cast<std::uint32_t>(bits64(gen)) & 0x7fffffu));
  }
  // Doubles between binary16's and bfloat16's grid points: every exponent field, the dropped bits at their tie
  // (half), a hair either side of it, and random.
  for (std::uint64_t sign_exp = 0; sign_exp < 4096; ++sign_exp)
    for (const int dropped : {42, 45}) {
      const std::uint64_t half = std::uint64_t{1} << (dropped - 1);
      for (const std::uint64_t kept : {0ull, 1ull, 0x3ffull, 0x7full, 0x155ull}) {
        const std::uint64_t base = (sign_exp << 52) | (kept << dropped);
        for (const std::uint64_t low : {half, half - 1, half + 1, std::uint64_t{0}, 2 * half - 1})
          check(std::bit_cast<double>(base | (low & ((std::uint64_t{1} << 52) - 1))));
      }
      check(std::bit_cast<double>((sign_exp << 52) | (bits64(gen) >> 12)));
    }
  // The thresholds: 65520 (binary16's max 65504 plus half an ulp), 2^-25 (half the subnormal quantum).
  CHECK(round_to_binary16(65519.99) == 65504.0);
  CHECK(std::isinf(round_to_binary16(65520.0)));
  CHECK(round_to_binary16(0x1p-25) == 0.0);
  CHECK(round_to_binary16(std::nextafter(0x1p-25, 1.0)) == 0x1p-24);
  CHECK(std::signbit(round_to_binary16(-0x1p-26)));
  CHECK(std::isinf(round_to_bfloat16(kBfloat16.max_finite + std::ldexp(1.0, 127 - 8))));
  CHECK(checked > 8000000);
}
