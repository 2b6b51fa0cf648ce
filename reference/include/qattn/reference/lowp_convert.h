// float32 -> low-precision codes as the conversion instructions write them, the codes' values, and the block
// quantisers every FP4/MX kernel uses (docs/lowp-float.md "Conversions"). The rounding steps, one per function:
//
//   element formats (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1): x rounded once onto the format, to nearest even (rn) or
//     toward zero (rz). saturate: a finite value beyond the largest, and +-inf, become +-max (PTX .satfinite);
//     without it they overflow as the format does (e5m2: +-inf; e4m3fn: NaN keeping the sign, torch's cast; FNUZ:
//     the NaN 0x80). NaN: with saturate the positive NaN code (0x7F e4m3fn/e5m2, PTX), without it the NaN keeping
//     x's sign (torch); FNUZ: 0x80. E2M1 has neither NaN nor inf: only saturate, NaN -> +6 (0x7), as PTX
//     cvt.rn.satfinite.e2m1x2.f32. A zero keeps its sign, except in FNUZ (one zero).
//     e4m3fn and e5m2 with rn are fp8_from_float: the H100's conversions, bit for bit.
//   ue8m0 (MX scales, 2^(code - 127)): from the float32 exponent field of |x| (the sign dropped): rz keeps it
//     (floor(log2|x|); zero and subnormals up to 2^-127 give 0x00), rp rounds up to the next power of two when the
//     significand is not 1 and |x| > 2^-127 (PTX cvt.{rz,rp}.satfinite.ue8m0x2.f32). saturate: +-inf and an rp
//     beyond 2^127 give 0xFE; without it 0xFF. NaN: 0xFF.
//   ue4m3 (NVFP4 block scales): the e4m3fn code of |x|, rounded to nearest even and saturated (no ue4m3 conversion
//     exists: kernels convert positive scales with the e4m3 one), the sign bit clear. NaN: 0x7F.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qattn::ref {

enum class LowpCode { e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, ue8m0, ue4m3 };
enum class LowpCodeRounding { rn, rz, rp };

// By name ("e4m3fn", ..., "ue4m3"); nullopt for another. lowp_code_names() lists them for messages.
std::optional<LowpCode> lowp_code_format(std::string_view name);
const char* lowp_code_name(LowpCode f);
std::string lowp_code_names();
// The roundings a format takes: rn and rz for the element formats, rz and rp for ue8m0, rn for ue4m3. Throws
// std::invalid_argument naming the format and the roundings it takes otherwise; also for e2m1 without saturate.
void lowp_check_conversion(LowpCode f, LowpCodeRounding r, bool saturate);

std::uint8_t lowp_encode_f32(float x, LowpCode f, LowpCodeRounding r, bool saturate);
// The value of a code (its low 4 bits for e2m1, whose codes above 15 are refused with std::invalid_argument); NaN
// codes give NaN. ue4m3 ignores the sign bit.
double lowp_decode_code(std::uint8_t code, LowpCode f);

// ---- block quantisers over the last axis of a row-major [rows, cols] array --------------------------------------

// OCP MX v1.0: per block of `block` consecutive elements of a row, the shared scale 2^X with X = floor(log2 amax) -
// emax_elem (emax_elem: 2 for E2M1, 8 for E4M3, 15 for E5M2), clamped to E8M0's [-127, 127] (an all-zero block:
// -127, code 0x00); each element x / 2^X (exact) rounded to nearest even onto the element format and saturated to
// its largest value. cols must be whole blocks; every x finite (std::invalid_argument naming the index otherwise).
struct MxQuantized {
  std::vector<std::uint8_t> codes;   // rows x cols
  std::vector<std::uint8_t> scales;  // rows x cols / block, UE8M0
};
MxQuantized mx_quantize(std::span<const float> x, std::size_t rows, std::size_t cols, LowpCode element,
                        std::size_t block = 32);

// NVFP4, Transformer Engine's recipe (core_nvfp4.cuh) in float32, each operation rounded to nearest even:
//   S_enc = 2688 / amax_tensor (448 x 6; 1 when amax is 0), S_dec = 1 / S_enc   (the global decode scale)
//   s_b   = e4m3_rn_satfinite(amax_block x (S_enc x (1/6)))                     (the block's UE4M3 scale)
//   code  = e2m1_rn_satfinite(x x min(1 / (s_b x S_dec), FLT_MAX))              (a zero s_b: codes 0)
// A value decodes as e2m1(code) x s_b x S_dec. cols must be whole blocks of 16; every x finite.
struct Nvfp4Quantized {
  std::vector<std::uint8_t> codes;   // rows x cols, E2M1
  std::vector<std::uint8_t> scales;  // rows x cols / 16, UE4M3
  float global_scale = 1;            // S_dec
};
Nvfp4Quantized nvfp4_quantize(std::span<const float> x, std::size_t rows, std::size_t cols);

}  // namespace qattn::ref
