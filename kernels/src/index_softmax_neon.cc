// NEON IndexSoftmax row (baseline Armv8-A Advanced SIMD), 16 logits per step, the same integers as
// index_softmax_s32_u8__scalar:
//   Δ' = min(m - a, c_int)               int32 (|m - a| <= 2 127^2 d < 2^31 for d < 66000)
//   idx by the index rule                 Q26 rules with q26 < 2^32 (every c_int >= 4 at b = 8): integers, umull;
//                                         otherwise float64x2 lanes, where the exactness argument of
//                                         index_softmax_avx512.cc holds unchanged (integer numerators < 2^41,
//                                         divisors < 2^31, Q26 products < 2^53)
//   E = LUT[idx]                          idx narrowed to u8, then the 256-entry table as four 64-byte tbl lookups
//                                         (tbl returns 0 for an index out of its 64 entries, so the four are OR-ed)
//   S = sum E                             u8 -> u16 -> u32 pairwise adds, reduced to int64
//   P: floor by FloorDivider16 with umull (n = s_P E < 2^16, multiplier <= 2^17 + 1: exact 64-bit products) and a
//      variable right shift; f32-rne by fdiv and fcvtns (round to nearest, ties to even); q8 (E ns + 128) >> 8.
// E is kept in p between the passes (E <= 255). The row's tail (fewer than 16
// entries), rows with a padding mask and the float32 index rule (floor-f32) run the scalar spec's arithmetic.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "qattn/kernels.h"
#include "qattn/reciprocal_division.h"
#include "qattn/softmax_row_entry.h"

namespace qattn::kernels {
namespace {

// The loop-invariant constants of the index rules, as doubles.
struct IndexConstants {
  double last, c, q26;
};

// floor(q) of two doubles in [0, 2^31), min(., last), as int64 lanes. The rule is a template parameter so that the
// row loop of each rule is branch-free.
template <IndexRule kRule>
inline int64x2_t index_pair(int32x2_t delta, const IndexConstants& k) {
  const float64x2_t dd = vcvtq_f64_s64(vmovl_s32(delta));
  float64x2_t q;
  if constexpr (kRule == IndexRule::floor) q = vdivq_f64(vmulq_n_f64(dd, k.last), vdupq_n_f64(k.c));
  else if constexpr (kRule == IndexRule::round)
    q = vdivq_f64(vaddq_f64(vmulq_n_f64(dd, 2 * k.last), vdupq_n_f64(k.c)), vdupq_n_f64(2 * k.c));
  else if constexpr (kRule == IndexRule::q26_round) q = vmulq_n_f64(vaddq_f64(vmulq_n_f64(dd, k.q26), vdupq_n_f64(0x1p25)), 0x1p-26);
  else q = vmulq_n_f64(vmulq_n_f64(dd, k.q26), 0x1p-26);  // q26_floor
  return vcvtq_s64_f64(vminq_f64(q, vdupq_n_f64(k.last)));  // truncation == floor for q >= 0
}

// The Q26 rules in integers when q26 < 2^32: umull (Δ' < 2^31 times q26 < 2^32, exact in 64 bits), the rounding
// half 2^25 (q26_round), >> 26, min(., last). Equal to the scalar spec's (Δ' q26 [+ 2^25]) >> 26 by construction.
template <bool kRound>
inline uint32x4_t index_q26_int(uint32x4_t delta, uint32x2_t q26, uint32x4_t last) {
  uint64x2_t lo = vmull_u32(vget_low_u32(delta), q26), hi = vmull_u32(vget_high_u32(delta), q26);
  if constexpr (kRound) {
    lo = vaddq_u64(lo, vdupq_n_u64(std::uint64_t{1} << 25));
    hi = vaddq_u64(hi, vdupq_n_u64(std::uint64_t{1} << 25));
  }
  return vminq_u32(vcombine_u32(vshrn_n_u64(lo, 26), vshrn_n_u64(hi, 26)), last);  // quotient <= last + c_int 2^-27 <= last + 8: shrn keeps it
}

// 16 indices (each in [0, last]) as bytes. kIntQ26: the Q26 rules through index_q26_int (q26 < 2^32).
template <IndexRule kRule, bool kIntQ26 = false>
inline uint8x16_t indices16(const std::int32_t* s, int32x4_t vm, int32x4_t vc, const IndexConstants& k) {
  int32x4_t idx[4];
  for (int v = 0; v < 4; ++v) {
    const int32x4_t delta = vminq_s32(vsubq_s32(vm, vld1q_s32(s + 4 * v)), vc);
    if constexpr (kIntQ26) {
      idx[v] = vreinterpretq_s32_u32(index_q26_int<kRule == IndexRule::q26_round>(
          vreinterpretq_u32_s32(delta), vdup_n_u32(static_cast<std::uint32_t>(k.q26)),
          vdupq_n_u32(static_cast<std::uint32_t>(k.last))));
    } else {
      const int64x2_t lo = index_pair<kRule>(vget_low_s32(delta), k), hi = index_pair<kRule>(vget_high_s32(delta), k);
      idx[v] = vcombine_s32(vmovn_s64(lo), vmovn_s64(hi));
    }
  }
  const uint16x8_t a = vcombine_u16(vqmovun_s32(idx[0]), vqmovun_s32(idx[1]));
  const uint16x8_t b = vcombine_u16(vqmovun_s32(idx[2]), vqmovun_s32(idx[3]));
  return vcombine_u8(vqmovn_u16(a), vqmovn_u16(b));
}

inline uint8x16_t lookup256(const uint8x16x4_t lut[4], uint8x16_t idx) {
  const uint8x16_t k64 = vdupq_n_u8(64);
  uint8x16_t e = vqtbl4q_u8(lut[0], idx);
  idx = vsubq_u8(idx, k64);
  e = vorrq_u8(e, vqtbl4q_u8(lut[1], idx));
  idx = vsubq_u8(idx, k64);
  e = vorrq_u8(e, vqtbl4q_u8(lut[2], idx));
  idx = vsubq_u8(idx, k64);
  return vorrq_u8(e, vqtbl4q_u8(lut[3], idx));
}

// Steps (2)-(5) over the 16-wide body of the row: E into p, the sum of E.
template <IndexRule kRule, bool kIntQ26 = false>
std::int64_t e_pass(const std::int32_t* s, Index body, std::int32_t m, const IndexSoftmaxTables& t, std::uint8_t* p) {
  const IndexConstants k{static_cast<double>((1 << t.params.bits) - 1), static_cast<double>(t.c_int),
                         static_cast<double>(t.q26)};
  const int32x4_t vm = vdupq_n_s32(m), vc = vdupq_n_s32(static_cast<std::int32_t>(t.c_int));
  uint8x16x4_t lut[4];
  for (int part = 0; part < 4; ++part) lut[part] = vld1q_u8_x4(t.lut + 64 * part);
  uint32x4_t vsum = vdupq_n_u32(0);
  for (Index j = 0; j < body; j += 16) {
    const uint8x16_t e = lookup256(lut, indices16<kRule, kIntQ26>(s + j, vm, vc, k));
    vsum = vpadalq_u16(vsum, vpaddlq_u8(e));
    vst1q_u8(p + j, e);
  }
  return static_cast<std::int64_t>(vaddlvq_u32(vsum));
}

// ps E for 4 lanes of E (bytes widened), as u32.
inline uint32x4_t times_ps(uint16x4_t e, std::uint32_t ps) { return vmull_n_u16(e, static_cast<std::uint16_t>(ps)); }

// The 16-byte body of the floor and f32-rne normalisations: each chunk of E widened to four u32 quarters
// n = ps E, `quotient` maps a quarter to its four P values (< 2^16), and the chunk is narrowed back in place.
template <class Quotient>
inline void normalise_chunks(std::uint8_t* p, Index body, std::uint32_t ps, Quotient quotient) {
  for (Index j = 0; j < body; j += 16) {
    const uint8x16_t e = vld1q_u8(p + j);
    uint16x4_t q[4];
    const uint16x8_t halves[2] = {vmovl_u8(vget_low_u8(e)), vmovl_u8(vget_high_u8(e))};
    for (int v = 0; v < 4; ++v)
      q[v] = quotient(times_ps(v % 2 == 0 ? vget_low_u16(halves[v / 2]) : vget_high_u16(halves[v / 2]), ps));
    vst1q_u8(p + j, vcombine_u8(vmovn_u16(vcombine_u16(q[0], q[1])), vmovn_u16(vcombine_u16(q[2], q[3]))));
  }
}

// e_pass of the table's index rule over s[0, body) against m; the Q26 rules take the integer product path where
// q26 < 2^32.
std::int64_t e_pass_by_rule(const std::int32_t* s, Index body, std::int32_t m, const IndexSoftmaxTables& t,
                            std::uint8_t* e) {
  const bool int_q26 = t.q26 < (std::int64_t{1} << 32);
  switch (t.params.index_rule) {
    case IndexRule::floor: return e_pass<IndexRule::floor>(s, body, m, t, e);
    case IndexRule::round: return e_pass<IndexRule::round>(s, body, m, t, e);
    case IndexRule::q26_round:
      return int_q26 ? e_pass<IndexRule::q26_round, true>(s, body, m, t, e)
                     : e_pass<IndexRule::q26_round>(s, body, m, t, e);
    default:  // q26_floor (floor_f32 never reaches here)
      return int_q26 ? e_pass<IndexRule::q26_floor, true>(s, body, m, t, e)
                     : e_pass<IndexRule::q26_floor>(s, body, m, t, e);
  }
}

}  // namespace

void index_softmax_s32_u8__neon(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                const IndexSoftmaxTables& t, std::uint8_t* p) {
  limit = vector_row_limit(s, valid, limit, keys, t, p);
  if (limit == 0) return;
  const Index body = limit / 16 * 16;
  // (1) the maximum
  int32x4_t vmax = vdupq_n_s32(std::numeric_limits<std::int32_t>::min());
  for (Index j = 0; j < body; j += 4) vmax = vmaxq_s32(vmax, vld1q_s32(s + j));
  std::int32_t m = vmaxvq_s32(vmax);
  for (Index j = body; j < limit; ++j) m = std::max(m, s[j]);
  std::int64_t sum = e_pass_by_rule(s, body, m, t, p);  // (2)-(5) Δ', index, E (into p), the sum
  const std::int64_t last = (1 << t.params.bits) - 1;
  for (Index j = body; j < limit; ++j) {
    p[j] = t.lut[std::clamp<std::int64_t>(index_softmax_index(std::min<std::int64_t>(std::int64_t{m} - s[j], t.c_int), t), 0, last)];
    sum += p[j];
  }
  // (6) normalisation, in place on E
  const auto ps = static_cast<std::uint32_t>(t.params.p_scale());
  switch (t.params.normalization) {
    case Normalization::floor: {
      const FloorDivider16 div = FloorDivider16::make(static_cast<std::uint64_t>(sum));
      const uint32x2_t mul = vdup_n_u32(static_cast<std::uint32_t>(div.multiplier));
      const int64x2_t shift = vdupq_n_s64(-div.shift);
      normalise_chunks(p, body, ps, [&](uint32x4_t n) {
        const uint64x2_t lo = vshlq_u64(vmull_u32(vget_low_u32(n), mul), shift);
        const uint64x2_t hi = vshlq_u64(vmull_u32(vget_high_u32(n), mul), shift);
        return vmovn_u32(vcombine_u32(vmovn_u64(lo), vmovn_u64(hi)));
      });
      for (Index j = body; j < limit; ++j) p[j] = static_cast<std::uint8_t>(div.divide(ps * p[j]));
      break;
    }
    case Normalization::f32_rne: {
      const float fs = static_cast<float>(sum);
      const float32x4_t vfs = vdupq_n_f32(fs);
      normalise_chunks(p, body, ps, [&](uint32x4_t n) {
        return vmovn_u32(vcvtnq_u32_f32(vdivq_f32(vcvtq_f32_u32(n), vfs)));  // n < 2^16: exact in float
      });
      for (Index j = body; j < limit; ++j)
        p[j] = static_cast<std::uint8_t>(std::nearbyint(static_cast<float>(ps * p[j]) / fs));
      break;
    }
    case Normalization::q8_reciprocal: {
      if (sum == ps) break;  // P = E
      const std::int64_t ns = (512 * std::int64_t{ps} + sum) / (2 * sum);  // <= 256
      const uint16x8_t vns = vdupq_n_u16(static_cast<std::uint16_t>(ns));
      for (Index j = 0; j < body; j += 16) {
        const uint8x16_t e = vld1q_u8(p + j);
        // E ns + 128 <= 255 * 256 + 128 < 2^16: u16 lanes, then >> 8
        const uint16x8_t lo = vmlaq_u16(vdupq_n_u16(128), vmovl_u8(vget_low_u8(e)), vns);
        const uint16x8_t hi = vmlaq_u16(vdupq_n_u16(128), vmovl_u8(vget_high_u8(e)), vns);
        vst1q_u8(p + j, vcombine_u8(vshrn_n_u16(lo, 8), vshrn_n_u16(hi, 8)));
      }
      for (Index j = body; j < limit; ++j) p[j] = static_cast<std::uint8_t>((p[j] * ns + 128) >> 8);
      break;
    }
  }
}

std::int64_t index_exp_s32_u8__neon(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                    const IndexSoftmaxTables& t, std::uint8_t* e) {
  if (valid || t.params.index_rule == IndexRule::floor_f32) return index_exp_s32_u8__scalar(s, valid, n, anchor, t, e);
  // Steps (2)-(5) of the row kernel above with the caller's anchor for m.
  const Index body = n / 16 * 16;
  const std::int64_t sum = e_pass_by_rule(s, body, anchor, t, e);
  return sum + index_exp_s32_u8__scalar(s + body, nullptr, n - body, anchor, t, e + body);
}

}  // namespace qattn::kernels
