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
