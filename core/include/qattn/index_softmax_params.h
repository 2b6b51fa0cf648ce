// The parameters of IndexSoftmax (IntAttention), shared by the reference model (reference/) and the fast path
// (kernels/src/). Every rounding choice is an enum; docs/methods/index-softmax.md derives each one.
#pragma once

#include <cstdint>
#include <string_view>

#include "qattn/choice.h"

namespace qattn {

// Rounding of c / α to the integer clip threshold.
enum class CintRounding {
  round,  // Eq. 8: nearest, ties away from zero (C lround); c / α > 0, so ties go up
  trunc,  // upstream simulation: int(c * sqrt(d) / (sQ * sK)), truncation toward zero
  floor,  // floor; equal to trunc for the positive values that occur
};

// Rounding of the table entries 255 exp(-c i / (T-1)).
enum class LutRounding {
  floor,  // Eq. 13
  round,  // upstream: nearest. A tie would need 255 exp(-x) = k + 1/2 exactly, impossible for x > 0 since exp(-x)
          // is transcendental for rational x != 0; so the tie rule never matters.
};

// Mapping of the clipped distance Δ' in [0, c_int] to a table index.
enum class IndexRule {
  floor,           // Eq. 11: floor(Δ' (T-1) / c_int), exact integer division
  round,           // floor((2 Δ' (T-1) + c_int) / (2 c_int)): nearest, ties up, exact
  floor_f32,       // upstream simulation: trunc(fl32(fl32(Δ' (T-1)) / fl32(c_int))), float32 division
  q26_round,       // upstream NEON vector path: m = floor((T-1) 2^26 / c_int + 1/2); (Δ' m + 2^25) >> 26
  q26_floor,       // upstream NEON scalar tail: (Δ' m) >> 26
};

// Integer normalisation of E to P with P scale s_P.
enum class Normalization {
  floor,          // Eq. 15: floor(s_P E / S), exact integer
  f32_rne,        // upstream simulation: round-half-even(fl32(fl32(s_P E) / fl32(S)))
  q8_reciprocal,  // upstream NEON vector path, UINT8 P only: if S == s_P, P = E; else ns = floor(256 s_P / S + 1/2) (exact),
                  // P = (E ns + 128) >> 8. ns is kept in 32 bits, S in 64: the upstream uint8/uint16 wraps are
                  // not reproduced. ns = 0 once S > 512 s_P, and then every P is 0 (as upstream).
};

enum class PFormat { u8, s8 };

// The largest code of P in each format: P = code / p_code_max, so 1.0 is the largest code (UINT8 255, INT8 127).
inline constexpr int kU8CodeMax = 255, kS8CodeMax = 127;
constexpr int p_code_max(PFormat f) { return f == PFormat::u8 ? kU8CodeMax : kS8CodeMax; }

struct IndexSoftmaxParams {
  int bits = 5;      // b in 1..8: table of T = 2^b entries
  double c = 6.6;    // clip in logit units (c > 0)
  CintRounding cint_rounding = CintRounding::round;
  LutRounding lut_rounding = LutRounding::floor;
  IndexRule index_rule = IndexRule::floor;
  Normalization normalization = Normalization::floor;
  PFormat p_format = PFormat::u8;
  int p_scale() const { return p_code_max(p_format); }
};

// The largest c_int ever used: Δ' (T-1) <= 2^30 * 255 < 2^38 and Δ' m stay far inside int64.
inline constexpr std::int64_t kCintMax = std::int64_t{1} << 30;

// The one check of an IndexSoftmax configuration, used by the registry's parser, the reference model and the
// kernels alike: b in 1..8, c finite and > 0, norm=q8-reciprocal only with p=u8; with c_int, also c_int in
// [1, kCintMax]. Throws std::invalid_argument naming the parameter and the value.
void validate(const IndexSoftmaxParams& params);
void validate(const IndexSoftmaxParams& params, std::int64_t c_int);

// The names of the rules, as the registry's parameters cint, lut, index and norm take them and to_string prints them:
// one table per enum, so that every value the registry offers is one to_string names, and the other way round.
inline constexpr Choice<CintRounding> kCintRoundings[] = {
    {"round", CintRounding::round}, {"trunc", CintRounding::trunc}, {"floor", CintRounding::floor}};
inline constexpr Choice<LutRounding> kLutRoundings[] = {{"floor", LutRounding::floor}, {"round", LutRounding::round}};
inline constexpr Choice<IndexRule> kIndexRules[] = {
    {"floor", IndexRule::floor}, {"round", IndexRule::round}, {"floor-f32", IndexRule::floor_f32},
    {"q26-round", IndexRule::q26_round}, {"q26-floor", IndexRule::q26_floor}};
inline constexpr Choice<Normalization> kNormalizations[] = {
    {"floor", Normalization::floor}, {"f32-rne", Normalization::f32_rne},
    {"q8-reciprocal", Normalization::q8_reciprocal}};

std::string_view to_string(CintRounding r);
std::string_view to_string(LutRounding r);
std::string_view to_string(IndexRule r);
std::string_view to_string(Normalization r);

// c_int = rounding(c / alpha), saturated to [1, kCintMax]. Throws std::invalid_argument unless c > 0 and alpha > 0
// are finite.
std::int64_t cint_from_alpha(double c, double alpha, CintRounding rounding);

}  // namespace qattn
