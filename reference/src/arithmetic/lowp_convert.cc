#include "qattn/reference/lowp_convert.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "qattn/reference/lowp_float.h"

namespace qattn::ref {
namespace {

constexpr struct {
  LowpCode code;
  const char* name;
} kCodes[] = {{LowpCode::e4m3fn, "e4m3fn"}, {LowpCode::e5m2, "e5m2"}, {LowpCode::e4m3fnuz, "e4m3fnuz"},
              {LowpCode::e5m2fnuz, "e5m2fnuz"}, {LowpCode::e2m1, "e2m1"}, {LowpCode::ue8m0, "ue8m0"},
              {LowpCode::ue4m3, "ue4m3"}};

const LowpFormat& element_format(LowpCode f) {
  switch (f) {
    case LowpCode::e4m3fn: return fp8_e4m3fn();
    case LowpCode::e5m2: return fp8_e5m2();
    case LowpCode::e4m3fnuz: return fp8_e4m3fnuz();
    case LowpCode::e5m2fnuz: return fp8_e5m2fnuz();
    case LowpCode::e2m1: return fp4_e2m1();
    case LowpCode::ue8m0:
    case LowpCode::ue4m3: break;
  }
  throw std::invalid_argument(std::string("lowp: ") + lowp_code_name(f) + " is not an element format");
}

const char* rounding_name(LowpCodeRounding r) {
  return r == LowpCodeRounding::rn ? "rn" : r == LowpCodeRounding::rz ? "rz" : "rp";
}

// PTX cvt.{rz,rp}{.satfinite}.ue8m0x2.f32: the float32 exponent field of |x|, rounded up (rp) when the significand
// is not 1 and |x| > 2^-127.
std::uint8_t ue8m0_code(float x, LowpCodeRounding r, bool saturate) {
  if (std::isnan(x)) return 0xff;
  const float a = std::fabs(x);
  if (std::isinf(a)) return saturate ? 0xfe : 0xff;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(a);
  std::uint32_t code = bits >> 23;
  if (r == LowpCodeRounding::rp && (bits & 0x7fffffu) != 0 && a > std::ldexp(1.0f, -127)) ++code;
  if (code == 0xff) return saturate ? 0xfe : 0xff;
  return static_cast<std::uint8_t>(code);
}

std::uint8_t element_code(float x, LowpCode f, LowpCodeRounding r, bool saturate) {
  const LowpFormat& fmt = element_format(f);
  const bool fnuz = f == LowpCode::e4m3fnuz || f == LowpCode::e5m2fnuz;
  if ((f == LowpCode::e4m3fn || f == LowpCode::e5m2) && r == LowpCodeRounding::rn)
    return fp8_from_float(x, fmt, saturate ? Fp8Cast::ptx_satfinite : Fp8Cast::torch);  // the H100's, measured
  // NaN: E2M1 has none (PTX writes +6), FNUZ one; e4m3fn and e5m2 the positive one with saturate (PTX), else x's
  // sign kept (torch)
  const auto signed_nan = static_cast<std::uint8_t>((std::signbit(x) ? 0x80 : 0x00) | 0x7f);
  if (std::isnan(x)) return f == LowpCode::e2m1 ? 0x7 : fnuz ? 0x80 : saturate ? 0x7f : signed_nan;
  const double v = lowp_round(x, fmt, r == LowpCodeRounding::rn ? LowpRounding::rne : LowpRounding::rz,
                              saturate ? LowpOverflow::saturate : LowpOverflow::non_saturating);
  if (std::isnan(v))  // an overflow where the format has no infinity: FNUZ's one NaN, or e4m3fn's with x's sign
    return fnuz ? 0x80 : signed_nan;
  return static_cast<std::uint8_t>(lowp_encode(v, fmt));
}

}  // namespace

std::optional<LowpCode> lowp_code_format(std::string_view name) {
  for (const auto& c : kCodes)
    if (name == c.name) return c.code;
  return std::nullopt;
}

const char* lowp_code_name(LowpCode f) {
  for (const auto& c : kCodes)
    if (c.code == f) return c.name;
  return "?";
}

std::string lowp_code_names() {
  std::string s;
  for (const auto& c : kCodes) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

void lowp_check_conversion(LowpCode f, LowpCodeRounding r, bool saturate) {
  const bool ok = f == LowpCode::ue8m0   ? r != LowpCodeRounding::rn
                  : f == LowpCode::ue4m3 ? r == LowpCodeRounding::rn
                                         : r != LowpCodeRounding::rp;
  if (!ok)
    throw std::invalid_argument(std::string("rounding '") + rounding_name(r) + "' for " + lowp_code_name(f) +
                                ": it takes " +
                                (f == LowpCode::ue8m0   ? "rz or rp (PTX cvt.{rz,rp}.satfinite.ue8m0x2.f32)"
                                 : f == LowpCode::ue4m3 ? "rn (the e4m3 conversion of |x|)"
                                                        : "rn or rz"));
  if (f == LowpCode::e2m1 && !saturate)
    throw std::invalid_argument("e2m1 has neither NaN nor infinity to overflow to: it takes saturate only "
                                "(PTX cvt.rn.satfinite.e2m1x2.f32)");
  if (f == LowpCode::ue4m3 && !saturate)
    throw std::invalid_argument("ue4m3: block scales are converted with saturation (cvt.rn.satfinite.e4m3x2.f32)");
}

std::uint8_t lowp_encode_f32(float x, LowpCode f, LowpCodeRounding r, bool saturate) {
  lowp_check_conversion(f, r, saturate);
  if (f == LowpCode::ue8m0) return ue8m0_code(x, r, saturate);
  if (f == LowpCode::ue4m3) {
    if (std::isnan(x)) return 0x7f;
    return fp8_from_float(std::fabs(x), fp8_e4m3fn(), Fp8Cast::ptx_satfinite) & 0x7f;
  }
  return element_code(x, f, r, saturate);
}

double lowp_decode_code(std::uint8_t code, LowpCode f) {
  switch (f) {
    case LowpCode::ue8m0:
      return code == 0xff ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, static_cast<int>(code) - 127);
    case LowpCode::ue4m3: return lowp_decode(code & 0x7fu, fp8_e4m3fn());
    case LowpCode::e2m1:
      if (code > 0x0f)
        throw std::invalid_argument("code " + std::to_string(code) + " is not an E2M1 code (0 to 15, one per byte)");
      break;
    default: break;
  }
  return lowp_decode(code, element_format(f));
}

namespace {

float amax_of(std::span<const float> x) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  return amax;
}

void check_blocks(std::span<const float> x, std::size_t rows, std::size_t cols, std::size_t block) {
  if (block == 0 || cols % block != 0)
    throw std::invalid_argument("the last axis (" + std::to_string(cols) + ") is not whole blocks of " +
                                std::to_string(block));
  if (x.size() != rows * cols) throw std::invalid_argument("quantize: x does not hold rows x cols values");
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      throw std::invalid_argument("element " + std::to_string(i) + " is " + (std::isnan(x[i]) ? "NaN" : "infinite") +
                                  ": a block scale needs finite values");
}

}  // namespace

MxQuantized mx_quantize(std::span<const float> x, std::size_t rows, std::size_t cols, LowpCode element,
                        std::size_t block) {
  int emax = 0;
  switch (element) {
    case LowpCode::e2m1: emax = 2; break;
    case LowpCode::e4m3fn: emax = 8; break;
    case LowpCode::e5m2: emax = 15; break;
    default:
      throw std::invalid_argument(std::string("mx_quantize: ") + lowp_code_name(element) +
                                  " is not an MX element format (e2m1, e4m3fn, e5m2)");
  }
  check_blocks(x, rows, cols, block);
  const LowpFormat& fmt = element_format(element);
  MxQuantized q;
  q.codes.resize(x.size());
  q.scales.resize(x.size() / block);
  for (std::size_t b = 0; b < q.scales.size(); ++b) {
    const std::span<const float> xs = x.subspan(b * block, block);
    const float amax = amax_of(xs);
    const int shared = amax == 0 ? -127 : std::clamp(std::ilogb(amax) - emax, -127, 127);
    q.scales[b] = static_cast<std::uint8_t>(shared + 127);
    for (std::size_t i = 0; i < block; ++i) {  // x / 2^X exact in double, then one rounding onto the element format
      const double v = lowp_round(std::ldexp(static_cast<double>(xs[i]), -shared), fmt, LowpRounding::rne,
                                  LowpOverflow::saturate);
      q.codes[b * block + i] = static_cast<std::uint8_t>(lowp_encode(v, fmt));
    }
  }
  return q;
}

Nvfp4Quantized nvfp4_quantize(std::span<const float> x, std::size_t rows, std::size_t cols) {
  constexpr std::size_t kBlock = 16;
  check_blocks(x, rows, cols, kBlock);
  const float amax = amax_of(x);
  // float32 throughout, each operation rounded to nearest even (-ffp-contract=off: no fused multiply-add)
  float enc = amax == 0 ? 1.0f : std::min(2688.0f / amax, FLT_MAX);  // 2688 / amax is 0 only past FLT_MAX
  if (enc == 0) enc = 1.0f;
  const float s_dec = 1.0f / enc;
  const float enc_sixth = enc * (1.0f / 6.0f);
  Nvfp4Quantized q;
  q.global_scale = s_dec;
  q.codes.resize(x.size());
  q.scales.resize(x.size() / kBlock);
  for (std::size_t b = 0; b < q.scales.size(); ++b) {
    const std::span<const float> xs = x.subspan(b * kBlock, kBlock);
    const float amax_b = amax_of(xs);
    const float scale = std::min(amax_b * enc_sixth, FLT_MAX);
    q.scales[b] = fp8_from_float(scale, fp8_e4m3fn(), Fp8Cast::ptx_satfinite);
    const float decoded = static_cast<float>(lowp_decode(q.scales[b], fp8_e4m3fn()));
    const float denominator = decoded * s_dec;  // 0: 1 / 0 is inf, min'd to FLT_MAX (TE's fminf)
    const float coeff = denominator == 0 ? FLT_MAX : std::min(1.0f / denominator, FLT_MAX);
    for (std::size_t i = 0; i < kBlock; ++i)
      q.codes[b * kBlock + i] = element_code(xs[i] * coeff, LowpCode::e2m1, LowpCodeRounding::rn, true);
  }
  return q;
}

}  // namespace qattn::ref
