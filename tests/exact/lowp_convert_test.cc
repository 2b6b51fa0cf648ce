// float32 -> low-precision codes (qattn/reference/lowp_convert.h) against an exact model written apart: the format's
// values listed and sorted, the nearest (ties to the even code), the one below (rz) or above (rp) chosen by
// comparison in double. Every boundary of every format (each value, each midpoint and the float32 neighbours of both,
// the overflow threshold, zeros, subnormal and huge float32, inf, NaN), both signs, every rounding and saturation the
// format takes, and a sample of a million float32 patterns; then the MX and NVFP4 block quantisers, case by case.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "qattn/reference/lowp_convert.h"
#include "qattn/reference/lowp_float.h"
#include "support/test_scale.h"

namespace {

using qattn::ref::LowpCode;
using qattn::ref::LowpCodeRounding;

struct FormatModel {
  LowpCode f;
  std::vector<double> value;  // the finite magnitudes, ascending
  std::vector<int> code;      // their codes (sign bit clear)
  int sign_bit;               // 0: unsigned
  double next_virtual;        // the value after the largest, were the exponent range wider (its code is max + 1)
};

FormatModel model_of(LowpCode f) {
  FormatModel m{f, {}, {}, 0, 0};
  const int codes = f == LowpCode::e2m1 ? 8 : f == LowpCode::ue8m0 ? 256 : 128;
  m.sign_bit = f == LowpCode::e2m1 ? 0x8 : f == LowpCode::ue8m0 || f == LowpCode::ue4m3 ? 0 : 0x80;
  for (int c = 0; c < codes; ++c) {
    const double v = qattn::ref::lowp_decode_code(static_cast<std::uint8_t>(c), f);
    if (std::isfinite(v)) m.value.push_back(v), m.code.push_back(c);
  }
  const double max = m.value.back();
  m.next_virtual = f == LowpCode::ue8m0 ? 2 * max : max + (max - m.value[m.value.size() - 2]);
  return m;
}

// The code the conversion must give, from the sorted values alone.
int expected(const FormatModel& m, float x, LowpCodeRounding r, bool saturate) {
  const LowpCode f = m.f;
  const bool fnuz = f == LowpCode::e4m3fnuz || f == LowpCode::e5m2fnuz;
  const int sign = std::signbit(x) ? m.sign_bit : 0;
  if (std::isnan(x)) {
    if (f == LowpCode::e2m1) return 0x7;
    if (fnuz) return 0x80;
    if (f == LowpCode::ue8m0) return 0xff;
    if (f == LowpCode::ue4m3) return 0x7f;
    return saturate ? 0x7f : sign | 0x7f;
  }
  const int max_code = m.code.back();
  auto overflow = [&]() -> int {
    if (saturate || f == LowpCode::e2m1) return f == LowpCode::ue8m0 ? 0xfe : sign | max_code;
    if (f == LowpCode::ue8m0) return 0xff;
    if (fnuz) return 0x80;
    if (f == LowpCode::e5m2) return sign | 0x7c;
    return sign | 0x7f;  // e4m3fn: NaN with x's sign
  };
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return overflow();
  // i: the largest value <= a
  const auto it = std::upper_bound(m.value.begin(), m.value.end(), a);
  const std::size_t i = static_cast<std::size_t>(it - m.value.begin()) - 1;  // value[0] is the least (0 or 2^-127)
  auto with_sign = [&](std::size_t k) {
    if (fnuz && m.value[k] == 0) return 0;
    return sign | m.code[k];
  };
  if (a < m.value[0]) return with_sign(0);  // ue8m0 below 2^-127: its least code, in rz and in rp
  if (r == LowpCodeRounding::rz) return with_sign(i);
  const bool above_max = i + 1 == m.value.size();
  if (a == m.value[i]) return with_sign(i);
  const double lo = m.value[i], hi = above_max ? m.next_virtual : m.value[i + 1];
  const int hi_code = above_max ? max_code + 1 : m.code[i + 1];
  bool up;
  if (r == LowpCodeRounding::rp) {
    up = true;
  } else {
    const double d_lo = a - lo, d_hi = hi - a;
    up = d_hi < d_lo || (d_hi == d_lo && hi_code % 2 == 0);
  }
  if (!up) return with_sign(i);
  if (above_max) {
    // rn beyond max: the largest value when the nearer, else an overflow (ue8m0 rp: overflow)
    return overflow();
  }
  return with_sign(i + 1);
}

std::vector<float> boundary_points(const FormatModel& m) {
  std::vector<float> pts;
  auto add = [&](double v) {
    const float f = static_cast<float>(v);
    if (static_cast<double>(f) != v && std::isfinite(v) && std::fabs(v) < FLT_MAX) return;  // not a float32 point
    for (float p : {f, std::nextafter(f, -INFINITY), std::nextafter(f, INFINITY)}) pts.push_back(p), pts.push_back(-p);
  };
  for (std::size_t i = 0; i < m.value.size(); ++i) {
    add(m.value[i]);
    const double next = i + 1 < m.value.size() ? m.value[i + 1] : m.next_virtual;
    add((m.value[i] + next) / 2);
  }
  add(m.next_virtual);
  for (double v : {0.0, 1e-45, 1.1754944e-38, 1e-30, 1e30, 3.4028235e38}) add(v);
  pts.push_back(INFINITY), pts.push_back(-INFINITY), pts.push_back(NAN), pts.push_back(-NAN);
  return pts;
}

struct Combination {
  LowpCode f;
  LowpCodeRounding r;
  bool saturate;
};

const Combination kCombinations[] = {
    {LowpCode::e4m3fn, LowpCodeRounding::rn, true},    {LowpCode::e4m3fn, LowpCodeRounding::rn, false},
    {LowpCode::e4m3fn, LowpCodeRounding::rz, true},    {LowpCode::e4m3fn, LowpCodeRounding::rz, false},
    {LowpCode::e5m2, LowpCodeRounding::rn, true},      {LowpCode::e5m2, LowpCodeRounding::rn, false},
    {LowpCode::e5m2, LowpCodeRounding::rz, true},      {LowpCode::e5m2, LowpCodeRounding::rz, false},
    {LowpCode::e4m3fnuz, LowpCodeRounding::rn, true},  {LowpCode::e4m3fnuz, LowpCodeRounding::rn, false},
    {LowpCode::e4m3fnuz, LowpCodeRounding::rz, true},  {LowpCode::e5m2fnuz, LowpCodeRounding::rn, true},
    {LowpCode::e5m2fnuz, LowpCodeRounding::rn, false}, {LowpCode::e5m2fnuz, LowpCodeRounding::rz, false},
    {LowpCode::e2m1, LowpCodeRounding::rn, true},      {LowpCode::e2m1, LowpCodeRounding::rz, true},
    {LowpCode::ue8m0, LowpCodeRounding::rz, true},     {LowpCode::ue8m0, LowpCodeRounding::rz, false},
    {LowpCode::ue8m0, LowpCodeRounding::rp, true},     {LowpCode::ue8m0, LowpCodeRounding::rp, false},
    {LowpCode::ue4m3, LowpCodeRounding::rn, true},
};

}  // namespace

TEST_CASE("lowp_encode_f32 equals the exact model at every boundary of every format", "[lowp][convert]") {
  std::size_t checked = 0;
  for (const Combination& c : kCombinations) {
    const FormatModel m = model_of(c.f);
    for (float x : boundary_points(m)) {
      const int want = expected(m, x, c.r, c.saturate);
      const int got = qattn::ref::lowp_encode_f32(x, c.f, c.r, c.saturate);
      INFO(qattn::ref::lowp_code_name(c.f) << " r=" << static_cast<int>(c.r) << " saturate=" << c.saturate << " x="
                                           << x << " (0x" << std::hex << std::bit_cast<std::uint32_t>(x) << ")");
      REQUIRE(got == want);
      ++checked;
    }
  }
  CHECK(checked > 20000);
}

TEST_CASE("lowp_encode_f32 equals the exact model on a million float32 patterns", "[lowp][convert]") {
  std::mt19937 rng(20261128);
  std::vector<FormatModel> models;
  for (const Combination& c : kCombinations) models.push_back(model_of(c.f));
  const int count = qattn::test::scaled(1 << 20, 4096);
  qattn::test::announce_scale("lowp_encode_f32 on random float32 patterns", count);
  for (int n = 0; n < count; ++n) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    const std::size_t k = static_cast<std::size_t>(n) % std::size(kCombinations);
    const Combination& c = kCombinations[k];
    const int want = expected(models[k], x, c.r, c.saturate);
    const int got = qattn::ref::lowp_encode_f32(x, c.f, c.r, c.saturate);
    if (got != want) {
      INFO(qattn::ref::lowp_code_name(c.f) << " x=" << x);
      REQUIRE(got == want);
    }
  }
}

TEST_CASE("the PTX rules the model encodes, spelt out", "[lowp][convert]") {
  using qattn::ref::lowp_encode_f32;
  CHECK(lowp_encode_f32(NAN, LowpCode::e2m1, LowpCodeRounding::rn, true) == 0x7);      // NaN -> +6
  CHECK(lowp_encode_f32(-INFINITY, LowpCode::e2m1, LowpCodeRounding::rn, true) == 0xf);  // -inf -> -6
  CHECK(lowp_encode_f32(-0.1f, LowpCode::e2m1, LowpCodeRounding::rn, true) == 0x8);      // -0 keeps its sign
  CHECK(lowp_encode_f32(0.75f, LowpCode::e2m1, LowpCodeRounding::rn, true) == 0x2);      // tie 0.5|1 -> 1 (even)
  CHECK(lowp_encode_f32(5.0f, LowpCode::e2m1, LowpCodeRounding::rn, true) == 0x6);       // tie 4|6 -> 4 (even)
  CHECK(lowp_encode_f32(3.0f, LowpCode::ue8m0, LowpCodeRounding::rz, true) == 128);      // 2^1
  CHECK(lowp_encode_f32(3.0f, LowpCode::ue8m0, LowpCodeRounding::rp, true) == 129);      // 2^2
  CHECK(lowp_encode_f32(-4.0f, LowpCode::ue8m0, LowpCodeRounding::rp, true) == 129);     // the sign dropped
  CHECK(lowp_encode_f32(0.0f, LowpCode::ue8m0, LowpCodeRounding::rp, true) == 0);
  CHECK(lowp_encode_f32(INFINITY, LowpCode::ue8m0, LowpCodeRounding::rz, true) == 0xfe);
  CHECK(lowp_encode_f32(INFINITY, LowpCode::ue8m0, LowpCodeRounding::rz, false) == 0xff);
  CHECK(lowp_encode_f32(FLT_MAX, LowpCode::ue8m0, LowpCodeRounding::rp, true) == 0xfe);
  CHECK(lowp_encode_f32(-448.0f, LowpCode::ue4m3, LowpCodeRounding::rn, true) == 0x7e);
  CHECK(lowp_encode_f32(-0.0f, LowpCode::e4m3fnuz, LowpCodeRounding::rn, true) == 0x00);
  CHECK(lowp_encode_f32(248.0f, LowpCode::e4m3fnuz, LowpCodeRounding::rn, false) == 0x80);  // rounds to 256: NaN
  CHECK(lowp_encode_f32(247.0f, LowpCode::e4m3fnuz, LowpCodeRounding::rn, false) == 0x7f);  // 240
  CHECK_THROWS_AS(lowp_encode_f32(1.0f, LowpCode::ue8m0, LowpCodeRounding::rn, true), std::invalid_argument);
  CHECK_THROWS_AS(lowp_encode_f32(1.0f, LowpCode::e2m1, LowpCodeRounding::rn, false), std::invalid_argument);
  CHECK_THROWS_AS(lowp_encode_f32(1.0f, LowpCode::e4m3fn, LowpCodeRounding::rp, true), std::invalid_argument);
  CHECK_THROWS_AS(qattn::ref::lowp_decode_code(0x10, LowpCode::e2m1), std::invalid_argument);
}

TEST_CASE("e4m3fn and e5m2 with rn are the H100's conversions (fp8_from_float)", "[lowp][convert]") {
  std::mt19937 rng(7);
  const int count = qattn::test::scaled(1 << 18, 4096);
  for (int n = 0; n < count; ++n) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    for (const auto& [f, fmt] : {std::pair{LowpCode::e4m3fn, &qattn::ref::fp8_e4m3fn()},
                                 std::pair{LowpCode::e5m2, &qattn::ref::fp8_e5m2()}}) {
      REQUIRE(qattn::ref::lowp_encode_f32(x, f, LowpCodeRounding::rn, true) ==
              qattn::ref::fp8_from_float(x, *fmt, qattn::ref::Fp8Cast::ptx_satfinite));
      REQUIRE(qattn::ref::lowp_encode_f32(x, f, LowpCodeRounding::rn, false) ==
              qattn::ref::fp8_from_float(x, *fmt, qattn::ref::Fp8Cast::torch));
    }
  }
}

TEST_CASE("mx_quantize: X = floor(log2 amax) - emax_elem, elements rounded to nearest even and saturated", "[lowp][convert]") {
  std::vector<float> x(64, 0.0f);
  x[0] = 6.0f * 8, x[1] = 3.0f * 8, x[2] = -0.75f * 8, x[3] = 0.25f * 8;  // block 0: amax 48 = 1.5 x 2^5, X = 3
  x[32] = 1.99f * 256;                                                   // block 1 (e4m3: X = 8 - 8 = 0)
  const auto q = qattn::ref::mx_quantize(x, 1, 64, LowpCode::e2m1, 32);
  REQUIRE(q.scales.size() == 2);
  CHECK(q.scales[0] == 127 + 3);
  CHECK(q.codes[0] == 0x7);  // 6
  CHECK(q.codes[1] == 0x5);  // 3
  CHECK(q.codes[2] == 0xa);  // -0.75 ties to -1 (0xa, even) over -0.5 (0x9)
  CHECK(q.codes[3] == 0x0);  // 0.25 ties to 0 (even) over 0.5
  CHECK(q.scales[1] == 127 + 6);  // 509.44: floor(log2) = 8, e2m1 emax 2: X = 6
  CHECK(q.codes[32] == 0x7);          // 509.44 / 64 = 7.96: saturated to 6
  const auto e4 = qattn::ref::mx_quantize(x, 1, 64, LowpCode::e4m3fn, 32);
  CHECK(e4.scales[1] == 127);         // X = 8 - 8 = 0
  CHECK(e4.codes[32] == 0x7e);        // 509.44 saturated to 448
  const std::vector<float> zeros(32, 0.0f);
  const auto z = qattn::ref::mx_quantize(zeros, 1, 32, LowpCode::e2m1, 32);
  CHECK(z.scales[0] == 0);            // an all-zero block: X = -127
  CHECK(std::all_of(z.codes.begin(), z.codes.end(), [](std::uint8_t c) { return c == 0; }));
  std::vector<float> bad(32, 1.0f);
  bad[7] = NAN;
  CHECK_THROWS_WITH(qattn::ref::mx_quantize(bad, 1, 32, LowpCode::e2m1, 32), Catch::Contains("element 7 is NaN"));
  CHECK_THROWS_WITH(qattn::ref::mx_quantize(zeros, 1, 32, LowpCode::e2m1, 24), Catch::Contains("whole blocks of 24"));
}

TEST_CASE("nvfp4_quantize: Transformer Engine's recipe in float32", "[lowp][convert]") {
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f, x[1] = 3.0f, x[2] = -1.5f, x[3] = 0.5f;  // block 0: amax 6
  x[16] = 0.75f, x[17] = 0.375f;                       // block 1: amax 0.75
  const auto q = qattn::ref::nvfp4_quantize(x, 1, 32);
  CHECK(q.global_scale == 1.0f / (2688.0f / 6.0f));  // 1 / 448
  REQUIRE(q.scales.size() == 2);
  CHECK(qattn::ref::lowp_decode_code(q.scales[0], LowpCode::ue4m3) == 448.0);  // 6 x 448 / 6
  CHECK(qattn::ref::lowp_decode_code(q.scales[1], LowpCode::ue4m3) == 56.0);   // 0.75 x 448 / 6
  CHECK(q.codes[0] == 0x7);
  CHECK(q.codes[1] == 0x5);
  CHECK(q.codes[2] == 0xb);
  CHECK(q.codes[3] == 0x1);
  CHECK(q.codes[16] == 0x7);  // 0.75 x 8 = 6
  CHECK(q.codes[17] == 0x5);  // 3
  // every value decodes to within half an E2M1 step of its block
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = qattn::ref::lowp_decode_code(q.codes[i], LowpCode::e2m1) *
                     qattn::ref::lowp_decode_code(q.scales[i / 16], LowpCode::ue4m3) * q.global_scale;
    CHECK(std::fabs(v - x[i]) <= 1.0 * qattn::ref::lowp_decode_code(q.scales[i / 16], LowpCode::ue4m3) * q.global_scale);
  }
  const auto z = qattn::ref::nvfp4_quantize(std::vector<float>(16, 0.0f), 1, 16);
  CHECK(z.global_scale == 1.0f);
  CHECK(z.scales[0] == 0);
}
