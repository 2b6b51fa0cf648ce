// AVX-512 IndexSoftmax row, the same integers as index_softmax_s32_u8__scalar. The maximum in four chains, then:
// b <= 5 on an integer index path (the presets' case), 64 logits per step (SmallLutRow):
//   idx as below; on the Q26 rules (K - max(a, m - c_int) q26) >> 26 in uint32 with K = m q26 [+ 2^25], one
//   instruction fewer than Δ' first (SmallLutRow's constructor says why it is exact)
//   packed to bytes (vpackusdw, vpackuswb, vpermd; vpminub to 2^b - 1 only where an index can pass 31, the table
//   repeating its last entry above 2^b - 1) and held in P's bytes
//   E = LUT[idx] by a 32-entry byte table (two vpshufb and a blend on bit 4), S = sum E by vpsadbw in int64 lanes
//   P = T[idx] with T[i] = N(LUT[i]): the normalisation below applied once to the 32 entries. N is a function of E
//   alone for a given S, so this is N(E) element for element.
// Otherwise 16 logits per step:
//   Δ' = min(m - a, c_int)               int32 (|m - a| <= 2 127^2 d < 2^31 for d < 66000)
//   idx by the index rule in int32        where the bounds below hold (every c_int < 2^22 at the floor and round
//                                         rules; c_int q26 + 2^25 < 2^32 at the Q26 rules, every c_int for b <= 5):
//     floor / round: q0 = trunc(fl32(n) fl32(1/D)) is within 1 of floor(n / D) (relative error <= 3 2^-24 on a
//                    quotient <= 2^b), then one exact correction by the remainder n - q0 D in int32
//                    (n = Δ' (T-1), D = c_int; or n = 2 Δ' (T-1) + c_int, D = 2 c_int; n, q0 D < 2^31)
//     Q26 rules:     (Δ' q26 [+ 2^25]) >> 26 with vpmulld, exact in uint32 under the bound
//   idx by the index rule in double       otherwise: every numerator is an integer < 2^41 and every divisor < 2^31, so the
//                                         quotient is exact or at least 2^-39 (relative) from the next integer:
//                                         floor of the correctly rounded double quotient is the exact floor
//                                         (q26 rules: (Δ' m [+ 2^25]) 2^-26, a power-of-two scaling, exact)
//   E = LUT[idx]                          vpermt2d for b <= 5 (32 entries), vpgatherdd above
//   S = sum E                             int32 lanes (255 L / 16 each), reduced to int64
//   P: floor by FloorDivider16 with vpmuludq (n = s_P E < 2^16, multiplier < 2^18: exact 64-bit products);
//      f32-rne by vdivps + round-to-nearest-even; q8 reciprocal (E ns + 128) >> 8 in int32.
// Rows with a padding mask and the float32 index rule (floor-f32) run the scalar spec.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "qattn/index_rule_lanes.h"
#include "qattn/kernels.h"
#include "qattn/reciprocal_division.h"
#include "qattn/softmax_row_entry.h"

namespace qattn::kernels {
namespace {

inline __mmask16 tail_mask(Index j, Index limit) {
  const Index n = std::clamp<Index>(limit - j, 0, 16);
  return static_cast<__mmask16>((1u << n) - 1u);
}

// floor(x) of 8 non-negative doubles below 2^31, as int32.
inline __m256i floor_to_i32(__m512d x) { return _mm512_cvttpd_epi32(x); }

// The integer index paths and when they apply (the header's bounds).
enum class IntIndexPath { none, quotient, q26 };

IntIndexPath int_index_path(const IndexSoftmaxTables& t) {
  switch (t.params.index_rule) {
    case IndexRule::floor:
    case IndexRule::round: return t.c_int < (std::int64_t{1} << 22) ? IntIndexPath::quotient : IntIndexPath::none;
    case IndexRule::q26_round:
    case IndexRule::q26_floor:
      return t.c_int * t.q26 + (std::int64_t{1} << 25) < (std::int64_t{1} << 32) ? IntIndexPath::q26 : IntIndexPath::none;
    default: return IntIndexPath::none;
  }
}

// The constants of one row's integer index path.
struct IntIndex {
  IntIndexPath path;
  __m512i last, numerator_scale, numerator_add, divisor, q26, q26_add;
  __m512 reciprocal;
  static IntIndex make(const IndexSoftmaxTables& t) {
    // In int64: c_int reaches 2^30, so 2 c_int does not fit int32. The quotient constants are used only on the
    // quotient path (c_int < 2^22), where every one of them fits.
    const std::int64_t last = (std::int64_t{1} << t.params.bits) - 1, c = t.c_int;
    const bool round = t.params.index_rule == IndexRule::round;
    const std::int64_t divisor = round ? 2 * c : c;
    IntIndex k;
    k.path = int_index_path(t);
    const bool quotient = k.path == IntIndexPath::quotient;
    k.last = _mm512_set1_epi32(static_cast<std::int32_t>(last));
    k.numerator_scale = _mm512_set1_epi32(static_cast<std::int32_t>(round ? 2 * last : last));
    k.numerator_add = _mm512_set1_epi32(quotient && round ? static_cast<std::int32_t>(c) : 0);
    k.divisor = _mm512_set1_epi32(quotient ? static_cast<std::int32_t>(divisor) : 1);
    k.reciprocal = _mm512_set1_ps(quotient ? 1.0f / static_cast<float>(divisor) : 1.0f);
    k.q26 = _mm512_set1_epi32(static_cast<std::int32_t>(static_cast<std::uint32_t>(t.q26)));
    k.q26_add = _mm512_set1_epi32(t.params.index_rule == IndexRule::q26_round ? 1 << 25 : 0);
    return k;
  }
};

// The index of 16 clipped differences; kClamp = false leaves out the final min with 2^b - 1: the Q26 quotient is then
// <= 63 (a uint32 shifted right by 26) and the exact floor quotient <= 2^b - 1, so a caller that clamps bytes may.
template <bool kClamp = true>
inline __m512i index_of_int(__m512i delta, const IntIndex& k) {
  if (k.path == IntIndexPath::q26) {  // uint32 arithmetic: no wrap under the bound
    const __m512i q = _mm512_srli_epi32(_mm512_add_epi32(_mm512_mullo_epi32(delta, k.q26), k.q26_add), 26);
    return kClamp ? _mm512_min_epu32(q, k.last) : q;
  }
  const __m512i n = _mm512_add_epi32(_mm512_mullo_epi32(delta, k.numerator_scale), k.numerator_add);
  __m512i q = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_cvtepi32_ps(n), k.reciprocal));
  const __m512i r = _mm512_sub_epi32(n, _mm512_mullo_epi32(q, k.divisor));
  q = _mm512_mask_sub_epi32(q, _mm512_cmplt_epi32_mask(r, _mm512_setzero_si512()), q, _mm512_set1_epi32(1));
  q = _mm512_mask_add_epi32(q, _mm512_cmpge_epi32_mask(r, k.divisor), q, _mm512_set1_epi32(1));
  return kClamp ? _mm512_min_epi32(q, k.last) : q;
}

inline __m512i index_of(__m512i delta, const IndexSoftmaxTables& t) {
  const __m512d last = _mm512_set1_pd((1 << t.params.bits) - 1);
  __m256i halves[2];
  for (int h = 0; h < 2; ++h) {
    const __m512d dd = _mm512_cvtepi32_pd(h == 0 ? _mm512_castsi512_si256(delta) : _mm512_extracti64x4_epi64(delta, 1));
    halves[h] = floor_to_i32(_mm512_min_pd(index_rule_lanes(dd, t), last));
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(halves[0]), halves[1], 1);
}

// 16 bytes of E, zero-extended to int32 lanes (lanes past the mask read 0).
inline __m512i load_e(const std::uint8_t* e, __mmask16 k) { return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, e)); }


// The row maximum, four chains of 16 lanes.
std::int32_t row_max(const std::int32_t* s, Index limit) {
  const __m512i lowest = _mm512_set1_epi32(std::numeric_limits<std::int32_t>::min());
  __m512i m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
  Index j = 0;
  for (; j + 64 <= limit; j += 64) {
    m0 = _mm512_max_epi32(m0, _mm512_loadu_si512(s + j));
    m1 = _mm512_max_epi32(m1, _mm512_loadu_si512(s + j + 16));
    m2 = _mm512_max_epi32(m2, _mm512_loadu_si512(s + j + 32));
    m3 = _mm512_max_epi32(m3, _mm512_loadu_si512(s + j + 48));
  }
  for (; j < limit; j += 16) m0 = _mm512_mask_max_epi32(m0, tail_mask(j, limit), m0, _mm512_maskz_loadu_epi32(tail_mask(j, limit), s + j));
  return _mm512_reduce_max_epi32(_mm512_max_epi32(_mm512_max_epi32(m0, m1), _mm512_max_epi32(m2, m3)));
}

// The row's normalisation (6), P = N(E) for a given S: its constants made once per row, then 16 values at a time:
//   floor by FloorDivider16 with vpmuludq (n = s_P E < 2^16, multiplier < 2^18: exact 64-bit products);
//   f32-rne by vdivps + round-to-nearest-even; q8 reciprocal (E ns + 128) >> 8 in int32.
class Normaliser {
 public:
  Normaliser(std::int64_t sum, const IndexSoftmaxParams& params) : rule_(params.normalization) {
    const int ps = params.p_scale();
    ps_ = _mm512_set1_epi32(ps);
    if (rule_ == Normalization::floor) {
      const FloorDivider16 div = FloorDivider16::make(static_cast<std::uint64_t>(sum));
      mul_ = _mm512_set1_epi64(static_cast<long long>(div.multiplier));
      shift_ = _mm_cvtsi32_si128(div.shift);
    } else if (rule_ == Normalization::f32_rne) {
      sum_ = _mm512_set1_ps(static_cast<float>(sum));
    } else {
      const bool identity = sum == ps;
      mul_ = _mm512_set1_epi32(identity ? 256 : static_cast<std::int32_t>((512 * std::int64_t{ps} + sum) / (2 * sum)));
      half_ = _mm512_set1_epi32(identity ? 0 : 128);
    }
  }
  // N of 16 values of E (int32 lanes, each <= 255) as 16 bytes.
  __m128i operator()(__m512i e) const {
    if (rule_ == Normalization::floor) {
      const __m512i x = _mm512_mullo_epi32(e, ps_);
      const __m512i lo = _mm512_srl_epi64(_mm512_mul_epu32(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(x)), mul_), shift_);
      const __m512i hi =
          _mm512_srl_epi64(_mm512_mul_epu32(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(x, 1)), mul_), shift_);
      return _mm512_cvtepi32_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1));
    }
    if (rule_ == Normalization::f32_rne) {
      const __m512 x = _mm512_cvtepi32_ps(_mm512_mullo_epi32(e, ps_));  // < 2^16: exact
      return _mm512_cvtepi32_epi8(
          _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(x, sum_), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    }
    return _mm512_cvtepi32_epi8(_mm512_srli_epi32(_mm512_add_epi32(_mm512_mullo_epi32(e, mul_), half_), 8));
  }
  // N of 32 table entries (bytes), as 32 bytes.
  __m256i table(__m256i e) const {
    return _mm256_inserti128_si256(_mm256_castsi128_si256((*this)(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(e)))),
                                   (*this)(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(e, 1))), 1);
  }

 private:
  Normalization rule_;
  __m512i ps_, mul_ = _mm512_setzero_si512(), half_ = _mm512_setzero_si512();
  __m128i shift_ = _mm_setzero_si128();
  __m512 sum_ = _mm512_setzero_ps();
};

// (6) on n bytes of E in place: P = N(E), the row's normalisation with S = sum.
void normalise(std::uint8_t* p, Index n, std::int64_t sum, const IndexSoftmaxParams& params) {
  const Normaliser normalised(sum, params);
  for (Index j = 0; j < n; j += 16) _mm_mask_storeu_epi8(p + j, tail_mask(j, n), normalised(load_e(p + j, tail_mask(j, n))));
}

// The first 32 entries of the LUT as a table that needs no clamp to 2^b - 1: entries past it repeat LUT[2^b - 1].
__m256i clamped_lut32(const IndexSoftmaxTables& t) {
  const int last = (1 << t.params.bits) - 1;
  const __mmask32 kept = last >= 31 ? ~__mmask32{0} : (__mmask32{1} << (last + 1)) - 1;
  return _mm256_mask_blend_epi8(kept, _mm256_set1_epi8(static_cast<char>(t.lut[last])), _mm256_maskz_loadu_epi8(kept, t.lut));
}

// The constants of a row's index on the Q26 rules, (K - max(a, lo) q26) >> 26 in uint32 with K = m q26 + h: the
// same as (Δ' q26 + h) >> 26 with Δ' = min(m - a, c) = m - max(a, m - c). The true value is < 2^32 (the path's bound)
// and the uint32 result is congruent to it mod 2^32, so they are equal. lo = m - c, or INT32_MIN where that is below
// it (then max(a, lo) = a and m - a < c).
struct Q26Row {
  __m512i k, lo;
  Q26Row(std::int32_t m, const IndexSoftmaxTables& t) {
    const std::uint32_t h = t.params.index_rule == IndexRule::q26_round ? 1u << 25 : 0u;
    k = _mm512_set1_epi32(static_cast<std::int32_t>(static_cast<std::uint32_t>(m) * static_cast<std::uint32_t>(t.q26) + h));
    lo = _mm512_set1_epi32(static_cast<std::int32_t>(std::max<std::int64_t>(std::int64_t{m} - t.c_int, std::numeric_limits<std::int32_t>::min())));
  }
  // (K - max(a, lo) q26) mod 2^32: the index in bits 26-31.
  __m512i scaled(__m512i a, __m512i q26) const { return _mm512_sub_epi32(k, _mm512_mullo_epi32(_mm512_max_epi32(a, lo), q26)); }
};

// The largest Q26 index of a table, at Δ' = c_int.
std::int64_t largest_q26_index(const IndexSoftmaxTables& t) {
  return (t.c_int * t.q26 + (t.params.index_rule == IndexRule::q26_round ? std::int64_t{1} << 25 : 0)) >> 26;
}

// A 32-entry byte table, looked up 64 bytes at a time with two vpshufb (AVX512BW; no VBMI needed).
struct ByteTable32 {
  __m512i lo, hi;  // entries 0-15 and 16-31, in every 128-bit lane
  static ByteTable32 make(__m256i t) {
    return {_mm512_broadcast_i32x4(_mm256_castsi256_si128(t)), _mm512_broadcast_i32x4(_mm256_extracti128_si256(t, 1))};
  }
  __m512i lookup(__m512i idx) const {  // bytes in [0, 31]: bit 7 clear, bit 4 picks the half
    const __mmask64 high = _mm512_test_epi8_mask(idx, _mm512_set1_epi8(16));
    return _mm512_mask_blend_epi8(high, _mm512_shuffle_epi8(lo, idx), _mm512_shuffle_epi8(hi, idx));
  }
};

// Steps (2)-(6) for b <= 5 on an integer index path, 64 logits per step. The indices (<= 31) are packed to bytes and
// held in P's bytes; S sums E = LUT[idx] (a byte table) with vpsadbw; then each byte becomes T[idx], where
// T[i] = N(LUT[i]) is the row's normalisation applied by normalise() to the 32 entries: P = N(E) as in (6).
class SmallLutRow {
 public:
  SmallLutRow(std::int32_t m, const IndexSoftmaxTables& t)
      : t_(t), k_(IntIndex::make(t)), vm_(_mm512_set1_epi32(m)), vc_(_mm512_set1_epi32(static_cast<std::int32_t>(t.c_int))),
        q26_(m, t), lut_(clamped_lut32(t)), last_(_mm512_set1_epi8(static_cast<char>((1 << t.params.bits) - 1))),
        e_table_(ByteTable32::make(lut_)) {
    // An index up to 31 needs no clamp to 2^b - 1 (the table repeats its last entry); a Q26 index can pass 31 only
    // where its largest one, at Δ' = c_int, does.
    clamp_ = k_.path == IntIndexPath::q26 && largest_q26_index(t) > 31;
  }

  void run(const std::int32_t* s, Index limit, std::uint8_t* p) const {
    __m512i vsum = _mm512_setzero_si512();
    Index j = 0;
    for (; j + 64 <= limit; j += 64) {
      const __m512i idx = indices(s + j, 4 * 16);
      vsum = _mm512_add_epi64(vsum, _mm512_sad_epu8(e_table_.lookup(idx), _mm512_setzero_si512()));
      _mm512_storeu_si512(p + j, idx);
    }
    if (j < limit) {
      const __mmask64 k = limit - j == 64 ? ~__mmask64{0} : (__mmask64{1} << (limit - j)) - 1;
      const __m512i idx = indices(s + j, limit - j);
      vsum = _mm512_add_epi64(vsum, _mm512_sad_epu8(_mm512_maskz_mov_epi8(k, e_table_.lookup(idx)), _mm512_setzero_si512()));
      _mm512_mask_storeu_epi8(p + j, k, idx);
    }
    const ByteTable32 p_table = ByteTable32::make(Normaliser(_mm512_reduce_add_epi64(vsum), t_.params).table(lut_));
    for (j = 0; j + 64 <= limit; j += 64) _mm512_storeu_si512(p + j, p_table.lookup(_mm512_loadu_si512(p + j)));
    if (j < limit) {
      const __mmask64 k = (__mmask64{1} << (limit - j)) - 1;
      _mm512_mask_storeu_epi8(p + j, k, p_table.lookup(_mm512_maskz_loadu_epi8(k, p + j)));
    }
  }

 private:
  // The indices of n <= 64 logits as bytes in order (lanes past n: whatever the zeros read give; masked by the caller).
  __m512i indices(const std::int32_t* s, Index n) const {
    __m512i idx[4];
    const bool q26 = k_.path == IntIndexPath::q26;
    for (int v = 0; v < 4; ++v) {
      const __m512i a = n >= 16 * (v + 1) ? _mm512_loadu_si512(s + 16 * v) : _mm512_maskz_loadu_epi32(tail_mask(16 * v, n), s + 16 * v);
      idx[v] = q26 ? _mm512_srli_epi32(q26_.scaled(a, k_.q26), 26)
                   : index_of_int<false>(_mm512_min_epi32(_mm512_sub_epi32(vm_, a), vc_), k_);
    }
    // packus interleaves the four vectors by 128-bit lane (lane L holds elements 4L..4L+3 of each); vpermd undoes it.
    const __m512i packed = _mm512_packus_epi16(_mm512_packus_epi32(idx[0], idx[1]), _mm512_packus_epi32(idx[2], idx[3]));
    const __m512i ordered =
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), packed);
    // The exact floor quotient is <= 2^b - 1 <= 31; a Q26 index is <= 31 unless clamp_ says otherwise.
    return clamp_ ? _mm512_min_epu8(ordered, last_) : ordered;
  }

  const IndexSoftmaxTables& t_;
  IntIndex k_;
  __m512i vm_, vc_;
  Q26Row q26_;
  __m256i lut_;
  __m512i last_;
  ByteTable32 e_table_;
  bool clamp_ = false;
};

// Steps (2)-(5) on s[0, n) against m (the row's maximum, or a key block's anchor): Δ' = min(m - s_j, c_int), its
// index (the integer path where int_index has one), E = LUT[index] stored as bytes in e (E <= 255: a row holds them
// in P's bytes until (6)); returns sum E.
std::int64_t exp_bytes(const std::int32_t* s, Index n, const IndexSoftmaxTables& t, std::int32_t m,
                       const IntIndex& int_index, std::uint8_t* e) {
  const bool integer_index = int_index.path != IntIndexPath::none;
  const bool small_lut = t.params.bits <= 5;
  const __m512i vm = _mm512_set1_epi32(m), vc = _mm512_set1_epi32(static_cast<std::int32_t>(t.c_int));
  alignas(64) std::int32_t lut32[256];
  for (int i = 0; i < 256; ++i) lut32[i] = t.lut[i];
  const __m512i lut_lo = _mm512_load_si512(lut32), lut_hi = _mm512_load_si512(lut32 + 16);
  __m512i vsum = _mm512_setzero_si512();
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(j, n);
    const __m512i a = _mm512_maskz_loadu_epi32(k, s + j);
    const __m512i delta = _mm512_min_epi32(_mm512_sub_epi32(vm, a), vc);
    const __m512i idx = integer_index ? index_of_int(delta, int_index)
                                      : _mm512_max_epi32(index_of(delta, t), _mm512_setzero_si512());
    const __m512i ev = small_lut ? _mm512_maskz_permutex2var_epi32(k, lut_lo, idx, lut_hi)
                                 : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, lut32, 4);
    vsum = _mm512_add_epi32(vsum, ev);
    _mm_mask_storeu_epi8(e + j, k, _mm512_cvtepi32_epi8(ev));
  }
  alignas(64) std::int32_t lanes[16];
  _mm512_store_si512(lanes, vsum);
  std::int64_t sum = 0;
  for (const std::int32_t x : lanes) sum += x;
  return sum;
}

// The row from step (2) on, with its maximum m over s[0, limit) (limit >= 1, no padding mask, an index rule other than
// floor-f32).
void row_from_max(const std::int32_t* s, Index limit, const IndexSoftmaxTables& t, std::int32_t m, std::uint8_t* p) {
  const IntIndex int_index = IntIndex::make(t);
  const bool integer_index = int_index.path != IntIndexPath::none;
  const bool small_lut = t.params.bits <= 5;
  if (small_lut && integer_index) {
    SmallLutRow(m, t).run(s, limit, p);
    return;
  }
  normalise(p, limit, exp_bytes(s, limit, t, m, int_index, p), t.params);  // (2)-(5), then (6)
}

}  // namespace

void index_softmax_s32_u8__avx512(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                  const IndexSoftmaxTables& t, std::uint8_t* p) {
  limit = vector_row_limit(s, valid, limit, keys, t, p);
  if (limit == 0) return;
  row_from_max(s, limit, t, row_max(s, limit), p);  // (1) the maximum, then (2)-(6)
}

void index_softmax_max_s32_u8__avx512(const std::int32_t* s, Index limit, Index keys, const IndexSoftmaxTables& t,
                                      std::int32_t m, std::uint8_t* p) {
  limit = vector_row_limit(s, nullptr, limit, keys, t, p);
  if (limit == 0) return;
  row_from_max(s, limit, t, m, p);
}

std::int64_t index_exp_s32_u8__avx512(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                      const IndexSoftmaxTables& t, std::uint8_t* e) {
  if (valid || t.params.index_rule == IndexRule::floor_f32) return index_exp_s32_u8__scalar(s, valid, n, anchor, t, e);
  return exp_bytes(s, n, t, anchor, IntIndex::make(t), e);  // steps (2)-(5) with the caller's anchor for m
}

}  // namespace qattn::kernels
