// AVX2 IndexSoftmax row, 8 logits per step, the same integers as index_softmax_s32_u8__scalar:
//   Δ' = min(m - a, c_int)               int32 (|m - a| <= 2 127^2 d < 2^31 for d < 66000)
//   idx on the Q26 rules where c_int q26 + 2^25 < 2^32 (every c_int for b <= 5): (Δ' q26 [+ 2^25]) >> 26 with
//                                         vpmulld, exact in uint32 under that bound
//   idx by the index rule in double       otherwise: two __m256d of 4 lanes; the exactness argument of
//                                         index_softmax_avx512.cc holds unchanged (integer numerators < 2^41,
//                                         divisors < 2^31, Q26 products < 2^53)
//   E = LUT[idx]                          vpgatherdd from the table widened to int32, stored as bytes in P (E <= 255)
//                                         by index_exp_s32_u8__avx2, which the row calls with its maximum
//   S = sum E                             int32 lanes (255 L / 8 each), reduced to int64
//   P: floor by FloorDivider16 with vpmuludq on the even and the odd lanes (n = s_P E < 2^16, multiplier <= 2^17 + 1:
//      exact 64-bit products); f32-rne by vdivps and vcvtps2dq (round to nearest even, the default MXCSR mode);
//      q8 reciprocal (E ns + 128) >> 8 in int32.
// The row's tail (fewer than 8 entries), rows with a padding mask and the float32 index rule (floor-f32) run the
// scalar spec's arithmetic. No std:: algorithm that loops is instantiated here (this file is built with -mavx2, and
// a vectorised inline instantiation could be the one the linker keeps for baseline callers).
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "qattn/index_rule_lanes.h"
#include "qattn/kernels.h"
#include "qattn/reciprocal_division.h"
#include "qattn/softmax_row_entry.h"

namespace qattn::kernels {
namespace {

// floor(q) of 4 doubles in [0, 2^31), min(., last), as int32.
inline __m128i index_quad(__m128i delta, const IndexSoftmaxTables& t) {
  const __m256d q = index_rule_lanes(_mm256_cvtepi32_pd(delta), t);
  return _mm256_cvttpd_epi32(_mm256_min_pd(q, _mm256_set1_pd((1 << t.params.bits) - 1)));  // trunc == floor, q >= 0
}

// The low byte of each of 8 int32 lanes (each in [0, 255]) to p[0, 8).
inline void store_bytes8(std::uint8_t* p, __m256i q) {
  const __m256i bytes = _mm256_shuffle_epi8(q, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const std::uint32_t lo = static_cast<std::uint32_t>(_mm256_extract_epi32(bytes, 0));
  const std::uint32_t hi = static_cast<std::uint32_t>(_mm256_extract_epi32(bytes, 4));
  std::memcpy(p, &lo, 4);
  std::memcpy(p + 4, &hi, 4);
}

// The row's normalisation (6), P = N(E) for a given S: its constants made once per row, then 8 values at a time or
// one (the same integers).
class Normaliser {
 public:
  Normaliser(std::int64_t sum, const IndexSoftmaxParams& params)
      : rule_(params.normalization), ps_(params.p_scale()) {
    vps_ = _mm256_set1_epi32(static_cast<std::int32_t>(ps_));
    if (rule_ == Normalization::floor) {
      div_ = FloorDivider16::make(static_cast<std::uint64_t>(sum));
      mul_ = _mm256_set1_epi64x(static_cast<long long>(div_.multiplier));
      shift_ = _mm_cvtsi32_si128(div_.shift);
    } else if (rule_ == Normalization::f32_rne) {
      fs_ = static_cast<float>(sum);
    } else {
      const bool identity = sum == ps_;
      ns_ = identity ? 256 : static_cast<std::int32_t>((512 * std::int64_t{ps_} + sum) / (2 * sum));
      half_ = identity ? 0 : 128;
      mul_ = _mm256_set1_epi32(ns_);
    }
  }
  // N of 8 values of E (int32 lanes, each <= 255), in the low byte of each lane.
  __m256i operator()(__m256i e) const {
    switch (rule_) {
      case Normalization::floor: {
        const __m256i n = _mm256_mullo_epi32(e, vps_);
        const __m256i even = _mm256_srl_epi64(_mm256_mul_epu32(n, mul_), shift_);                         // lanes 0 2 4 6
        const __m256i odd = _mm256_srl_epi64(_mm256_mul_epu32(_mm256_srli_epi64(n, 32), mul_), shift_);  // lanes 1 3 5 7
        return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
      }
      case Normalization::f32_rne:  // < 2^16: exact
        return _mm256_cvtps_epi32(_mm256_div_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(e, vps_)), _mm256_set1_ps(fs_)));
      default: return _mm256_srli_epi32(_mm256_add_epi32(_mm256_mullo_epi32(e, mul_), _mm256_set1_epi32(half_)), 8);
    }
  }
  std::uint8_t operator()(std::uint8_t e) const {
    switch (rule_) {
      case Normalization::floor: return static_cast<std::uint8_t>((std::uint64_t{ps_} * e * div_.multiplier) >> div_.shift);
      case Normalization::f32_rne: return static_cast<std::uint8_t>(std::nearbyint(static_cast<float>(ps_ * e) / fs_));
      default: return static_cast<std::uint8_t>((e * ns_ + half_) >> 8);
    }
  }

 private:
  Normalization rule_;
  std::uint32_t ps_;
  __m256i vps_, mul_ = _mm256_setzero_si256();
  __m128i shift_ = _mm_setzero_si128();
  FloorDivider16 div_{};
  float fs_ = 1;
  std::int32_t ns_ = 0, half_ = 0;
};

// (6) on n bytes of E in place: P = N(E), the row's normalisation with S = sum.
void normalise(std::uint8_t* p, Index n, std::int64_t sum, const IndexSoftmaxParams& params) {
  const Normaliser normalised(sum, params);
  const Index body = n / 8 * 8;
  for (Index j = 0; j < body; j += 8)
    store_bytes8(p + j, normalised(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j)))));
  for (Index j = body; j < n; ++j) p[j] = normalised(p[j]);
}

// 32 int32 lanes (each in [0, 255]) to 32 bytes in order: packus interleaves by 128-bit lane, vpermd undoes it.
inline __m256i pack_bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d)),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 entries as bytes, looked up 32 indices (each <= 31) at a time: vpshufb reads the low 4 bits within each 128-bit
// lane of a table held in both lanes, and bit 4 of the index (moved to bit 7 by a 16-bit shift, which leaves every
// byte's bit 7 to that byte's own bit 4) picks the half.
struct ByteTable32 {
  __m256i lo, hi;
  static ByteTable32 make(__m256i t) { return {_mm256_permute2x128_si256(t, t, 0x00), _mm256_permute2x128_si256(t, t, 0x11)}; }
  __m256i lookup(__m256i idx) const {
    return _mm256_blendv_epi8(_mm256_shuffle_epi8(lo, idx), _mm256_shuffle_epi8(hi, idx), _mm256_slli_epi16(idx, 3));
  }
};

// Steps (2)-(6) for b <= 5 on the Q26 rules where c_int q26 + 2^25 < 2^32, 32 logits per step (the AVX-512 row's
// SmallLutRow on 256-bit vectors): idx = (K - max(a, lo) q26) >> 26 in uint32 with K = m q26 + h and lo = m - c_int
// saturated at INT32_MIN (index_softmax_avx512.cc says why this equals (Δ' q26 + h) >> 26), packed to bytes
// (vpackusdw, vpackuswb, vpermd undoing their lane interleave; vpminub to 2^b - 1 only where an index can pass 31,
// the table repeating its last entry above 2^b - 1) and held in P; S = sum LUT[idx] by vpsadbw; then P = T[idx] with
// T[i] = N(LUT[i]). The last limit mod 32 entries take the scalar index. Indices and the table fit bytes: idx <= 63.
void small_lut_row(const std::int32_t* s, Index limit, std::int32_t m, const IndexSoftmaxTables& t, std::uint8_t* p) {
  const int last = (1 << t.params.bits) - 1;
  // The first 2^b entries of the LUT (t.lut has 256), then LUT[2^b - 1] repeated.
  const __m256i kept = _mm256_cmpgt_epi8(_mm256_set1_epi8(static_cast<char>(last + 1)),
                                         _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                                          19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31));
  const __m256i lut = _mm256_blendv_epi8(_mm256_set1_epi8(static_cast<char>(t.lut[last])),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.lut)), kept);
  const ByteTable32 e_table = ByteTable32::make(lut);
  const std::uint32_t q26 = static_cast<std::uint32_t>(t.q26);
  const std::uint32_t h = t.params.index_rule == IndexRule::q26_round ? 1u << 25 : 0u;
  const __m256i vk = _mm256_set1_epi32(static_cast<std::int32_t>(static_cast<std::uint32_t>(m) * q26 + h));
  const __m256i vlo = _mm256_set1_epi32(static_cast<std::int32_t>(
      std::int64_t{m} - t.c_int < std::numeric_limits<std::int32_t>::min() ? std::numeric_limits<std::int32_t>::min()
                                                                          : std::int64_t{m} - t.c_int));
  const __m256i vq26 = _mm256_set1_epi32(static_cast<std::int32_t>(q26));
  const bool clamp = ((t.c_int * t.q26 + h) >> 26) > 31;
  const __m256i vlast = _mm256_set1_epi8(static_cast<char>(last));
  const auto index8 = [&](const std::int32_t* a) {
    const __m256i x = _mm256_max_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)), vlo);
    return _mm256_srli_epi32(_mm256_sub_epi32(vk, _mm256_mullo_epi32(x, vq26)), 26);
  };
  __m256i vsum = _mm256_setzero_si256();
  const Index body = limit / 32 * 32;
  for (Index j = 0; j < body; j += 32) {
    __m256i idx = pack_bytes32(index8(s + j), index8(s + j + 8), index8(s + j + 16), index8(s + j + 24));
    if (clamp) idx = _mm256_min_epu8(idx, vlast);
    vsum = _mm256_add_epi64(vsum, _mm256_sad_epu8(e_table.lookup(idx), _mm256_setzero_si256()));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), idx);
  }
  alignas(32) std::int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vsum);
  std::int64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (Index j = body; j < limit; ++j) {
    const std::int64_t delta = std::int64_t{m} - s[j];
    std::int64_t idx = index_softmax_index(delta < t.c_int ? delta : t.c_int, t);
    idx = idx < 0 ? 0 : (idx > last ? last : idx);
    p[j] = static_cast<std::uint8_t>(idx);
    sum += t.lut[idx];
  }
  // T = N(LUT), in registers (and in memory for the scalar tail)
  const Normaliser normalised(sum, t.params);
  const __m128i lut_lo = _mm256_castsi256_si128(lut), lut_hi = _mm256_extracti128_si256(lut, 1);
  const __m256i p32 = pack_bytes32(normalised(_mm256_cvtepu8_epi32(lut_lo)), normalised(_mm256_cvtepu8_epi32(_mm_srli_si128(lut_lo, 8))),
                                   normalised(_mm256_cvtepu8_epi32(lut_hi)), normalised(_mm256_cvtepu8_epi32(_mm_srli_si128(lut_hi, 8))));
  alignas(32) std::uint8_t table[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(table), p32);
  const ByteTable32 p_table = ByteTable32::make(p32);
  for (Index j = 0; j < body; j += 32) {
    __m256i* q = reinterpret_cast<__m256i*>(p + j);
    _mm256_storeu_si256(q, p_table.lookup(_mm256_loadu_si256(q)));
  }
  for (Index j = body; j < limit; ++j) p[j] = table[p[j]];
}

}  // namespace

void index_softmax_s32_u8__avx2(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                const IndexSoftmaxTables& t, std::uint8_t* p) {
  limit = vector_row_limit(s, valid, limit, keys, t, p);
  if (limit == 0) return;
  const Index body = limit / 8 * 8;
  // (1) the maximum
  __m256i vmax = _mm256_set1_epi32(std::numeric_limits<std::int32_t>::min());
  for (Index j = 0; j < body; j += 8)
    vmax = _mm256_max_epi32(vmax, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + j)));
  alignas(32) std::int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  std::int32_t m = lanes[0];
  for (const std::int32_t x : lanes) m = x > m ? x : m;
  for (Index j = body; j < limit; ++j) m = s[j] > m ? s[j] : m;
  const bool q26_rule = t.params.index_rule == IndexRule::q26_round || t.params.index_rule == IndexRule::q26_floor;
  const std::int64_t h = t.params.index_rule == IndexRule::q26_round ? std::int64_t{1} << 25 : 0;
  if (t.params.bits <= 5 && q26_rule && t.c_int * t.q26 + h < (std::int64_t{1} << 32)) {
    small_lut_row(s, limit, m, t, p);
    return;
  }
  // (2)-(5) Δ', index, E (held in P's bytes, E <= 255), the sum; (6) the normalisation in place
  normalise(p, limit, index_exp_s32_u8__avx2(s, nullptr, limit, m, t, p), t.params);
}

std::int64_t index_exp_s32_u8__avx2(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                    const IndexSoftmaxTables& t, std::uint8_t* e) {
  if (valid || t.params.index_rule == IndexRule::floor_f32) return index_exp_s32_u8__scalar(s, valid, n, anchor, t, e);
  // Steps (2)-(5) with `anchor` for m; E stored as bytes. The Q26 rules take the integer path where its bound holds.
  const Index body = n / 8 * 8;
  const __m256i vm = _mm256_set1_epi32(anchor), vc = _mm256_set1_epi32(static_cast<std::int32_t>(t.c_int));
  const bool q26_rule = t.params.index_rule == IndexRule::q26_round || t.params.index_rule == IndexRule::q26_floor;
  const std::int64_t h = t.params.index_rule == IndexRule::q26_round ? std::int64_t{1} << 25 : 0;
  const bool q26_int = q26_rule && t.c_int * t.q26 + h < (std::int64_t{1} << 32);
  const __m256i vq26 = _mm256_set1_epi32(static_cast<std::int32_t>(static_cast<std::uint32_t>(t.q26)));
  const __m256i vh = _mm256_set1_epi32(static_cast<std::int32_t>(h));
  const __m256i vlast = _mm256_set1_epi32((1 << t.params.bits) - 1);
  alignas(32) std::int32_t lut32[256];
  for (int i = 0; i < 256; ++i) lut32[i] = t.lut[i];
  __m256i vsum = _mm256_setzero_si256();
  for (Index j = 0; j < body; j += 8) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + j));
    const __m256i delta = _mm256_min_epi32(_mm256_sub_epi32(vm, a), vc);
    // Integer Q26: Δ' q26 + h < 2^32 (0 <= Δ' <= c_int), so the low 32 bits of vpmulld, read as uint32, are exact.
    const __m256i idx = q26_int ? _mm256_min_epu32(_mm256_srli_epi32(_mm256_add_epi32(_mm256_mullo_epi32(delta, vq26), vh), 26), vlast)
                                : _mm256_set_m128i(index_quad(_mm256_extracti128_si256(delta, 1), t),
                                                   index_quad(_mm256_castsi256_si128(delta), t));
    const __m256i ev = _mm256_i32gather_epi32(lut32, idx, 4);
    vsum = _mm256_add_epi32(vsum, ev);
    store_bytes8(e + j, ev);
  }
  alignas(32) std::int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vsum);
  std::int64_t sum = 0;
  for (const std::int32_t x : lanes) sum += x;
  return sum + index_exp_s32_u8__scalar(s + body, nullptr, n - body, anchor, t, e + body);
}

}  // namespace qattn::kernels
