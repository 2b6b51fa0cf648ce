// Packing of K^T and V into the groups-of-4 layout of kernels.h, with zero padding and column sums: O(L d) work
// beside the O(L^2 d) GEMMs. The fused driver packs key ranges on its workers (pack_k_keys, pack_v_keys), the
// padding once. On x86-64 both use SSE2 (the baseline: no ISA file, no
// dispatch): K^T as 4 x 4 transposes of 4-byte groups with row sums by psadbw, V as byte and 16-bit interleaves of 4
// rows with the column sums in the same loop; elsewhere, and for the tails, one 4-byte group at a time. Only the
// padding is zeroed. At L = 2048, d = 128 on Zen 5: 0.030 + 0.034 ms with the compiler's loops (its sum loops stayed
// scalar: int8_t may alias the int32 sums), 0.010 + 0.013 ms now.
#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>  // x86-64 baseline: no ISA flags, no dispatch
#endif

#include "qattn/kernels.h"

namespace qattn::kernels {

static_assert(std::endian::native == std::endian::little, "pack_v writes a group of 4 bytes as one word");

void pack_k_padding(Index keys, Index d4, Index keys16, std::int8_t* packed, std::int32_t* sum) {
  for (Index g = 0; g < d4 / 4; ++g) std::fill(packed + (g * keys16 + keys) * 4, packed + (g + 1) * keys16 * 4, std::int8_t{0});
  std::fill(sum + keys, sum + keys16, 0);
}

void pack_k_keys(const std::int8_t* k, Index begin, Index end, Index d, Index keys16, std::int8_t* packed,
                 std::int32_t* sum) {
  // The tail bytes of the last group of d: zero where these keys' d % 4 bytes do not reach.
  if (d % 4 != 0) std::fill(packed + ((d / 4) * keys16 + begin) * 4, packed + ((d / 4) * keys16 + end) * 4, std::int8_t{0});
  for (Index j = begin; j < end; ++j) {
    const std::int8_t* row = k + j * d;
    std::int32_t s = 0;
    Index t = 0;
#if defined(__SSE2__)
    // psadbw sums unsigned bytes: x ^ 0x80 = x + 128, so the 16 signed bytes sum to that minus 16 128.
    __m128i wide = _mm_setzero_si128();
    for (; t + 16 <= d; t += 16) {
      const __m128i x = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + t)), _mm_set1_epi8(-128));
      wide = _mm_add_epi64(wide, _mm_sad_epu8(x, _mm_setzero_si128()));
    }
    s = static_cast<std::int32_t>(_mm_cvtsi128_si64(wide) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(wide, wide)) - 128 * t);
#endif
    for (; t < d; ++t) s += row[t];
    sum[j] = s;
  }
  // Group g of key j: packed row g, bytes 4 j .. 4 j + 3. Keys in fours, then the keys left over.
  const Index groups = d / 4;  // whole groups of 4 along d; a tail of d % 4 bytes goes byte by byte
  const auto one_key = [&](Index j, Index g0) {
    const std::int8_t* row = k + j * d;
    for (Index g = g0; g < groups; ++g) std::memcpy(packed + (g * keys16 + j) * 4, row + g * 4, 4);
    for (Index t = groups * 4; t < d; ++t) packed[(t / 4) * keys16 * 4 + j * 4 + t % 4] = row[t];
  };
  Index j = begin;
  for (; j + 4 <= end; j += 4) {
    Index g = 0;
#if defined(__SSE2__)
    // A 4 x 4 transpose of 4-byte groups: each store is 16 bytes of one packed row.
    for (; g + 4 <= groups; g += 4) {
      const auto load = [&](Index r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + (j + r) * d + g * 4)); };
      const __m128i r0 = load(0), r1 = load(1), r2 = load(2), r3 = load(3);
      const __m128i lo01 = _mm_unpacklo_epi32(r0, r1), hi01 = _mm_unpackhi_epi32(r0, r1);
      const __m128i lo23 = _mm_unpacklo_epi32(r2, r3), hi23 = _mm_unpackhi_epi32(r2, r3);
      const __m128i out[4] = {_mm_unpacklo_epi64(lo01, lo23), _mm_unpackhi_epi64(lo01, lo23),
                              _mm_unpacklo_epi64(hi01, hi23), _mm_unpackhi_epi64(hi01, hi23)};
      for (int t = 0; t < 4; ++t) _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + ((g + t) * keys16 + j) * 4), out[t]);
    }
#endif
    for (Index r = 0; r < 4; ++r) one_key(j + r, g);
  }
  for (; j < end; ++j) one_key(j, 0);
}


void pack_k_transposed(const std::int8_t* k, Index keys, Index d, Index d4, Index keys16,
                       std::int8_t* packed, std::int32_t* sum) {
  pack_k_padding(keys, d4, keys16, packed, sum);
  pack_k_keys(k, 0, keys, d, keys16, packed, sum);
}

void pack_v_padding(Index keys, Index keys4, Index dv16, std::int8_t* packed) {
  std::fill(packed + (keys + 3) / 4 * dv16 * 4, packed + keys4 * dv16, std::int8_t{0});
}

void pack_v_keys(const std::int8_t* v, Index begin, Index end, Index dv, Index dv16, std::int8_t* packed,
                 std::int32_t* sum) {
  // Zeros where no column writes: columns past dv in the groups of whole keys, and the whole of a last, partial group.
  const Index whole = begin + (end - begin) / 4 * 4;
  if (dv < dv16)
    for (Index g = begin / 4; g < whole / 4; ++g) std::fill(packed + (g * dv16 + dv) * 4, packed + (g + 1) * dv16 * 4, std::int8_t{0});
  if (whole < end) std::fill(packed + (whole / 4) * dv16 * 4, packed + (whole / 4 + 1) * dv16 * 4, std::int8_t{0});
  // Group j4 holds keys 4 j4 .. 4 j4 + 3: column c's 4 bytes side by side, as one little-endian word.
  for (Index j0 = begin; j0 < whole; j0 += 4) {
    const std::uint8_t* r0 = reinterpret_cast<const std::uint8_t*>(v + j0 * dv);
    const std::uint8_t *r1 = r0 + dv, *r2 = r1 + dv, *r3 = r2 + dv;
    std::int8_t* out = packed + (j0 / 4) * dv16 * 4;
    Index c = 0;
#if defined(__SSE2__)
    // 16 columns at a time: bytes of rows 0/1 and 2/3 interleaved, then their 16-bit pairs: the words in order.
    for (; c + 16 <= dv; c += 16) {
      const auto load = [&](const std::uint8_t* r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + c)); };
      const __m128i x0 = load(r0), x1 = load(r1), x2 = load(r2), x3 = load(r3);
      const __m128i lo01 = _mm_unpacklo_epi8(x0, x1), hi01 = _mm_unpackhi_epi8(x0, x1);
      const __m128i lo23 = _mm_unpacklo_epi8(x2, x3), hi23 = _mm_unpackhi_epi8(x2, x3);
      const __m128i words[4] = {_mm_unpacklo_epi16(lo01, lo23), _mm_unpackhi_epi16(lo01, lo23),
                                _mm_unpacklo_epi16(hi01, hi23), _mm_unpackhi_epi16(hi01, hi23)};
      for (int t = 0; t < 4; ++t) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (c + 4 * t) * 4), words[t]);
      // Column sums: the 4 rows in int16 (|sum| <= 512), then added to sum[c .. c + 15] in int32.
      const auto widen_lo = [](__m128i x) { return _mm_srai_epi16(_mm_unpacklo_epi8(x, x), 8); };
      const auto widen_hi = [](__m128i x) { return _mm_srai_epi16(_mm_unpackhi_epi8(x, x), 8); };
      const __m128i lo = _mm_add_epi16(_mm_add_epi16(widen_lo(x0), widen_lo(x1)), _mm_add_epi16(widen_lo(x2), widen_lo(x3)));
      const __m128i hi = _mm_add_epi16(_mm_add_epi16(widen_hi(x0), widen_hi(x1)), _mm_add_epi16(widen_hi(x2), widen_hi(x3)));
      const __m128i parts[4] = {_mm_srai_epi32(_mm_unpacklo_epi16(lo, lo), 16), _mm_srai_epi32(_mm_unpackhi_epi16(lo, lo), 16),
                                _mm_srai_epi32(_mm_unpacklo_epi16(hi, hi), 16), _mm_srai_epi32(_mm_unpackhi_epi16(hi, hi), 16)};
      for (int t = 0; t < 4; ++t) {
        __m128i* at = reinterpret_cast<__m128i*>(sum + c + 4 * t);
        _mm_storeu_si128(at, _mm_add_epi32(_mm_loadu_si128(at), parts[t]));
      }
    }
#endif
    for (; c < dv; ++c) {
      sum[c] += std::int32_t{static_cast<std::int8_t>(r0[c])} + static_cast<std::int8_t>(r1[c]) +
                static_cast<std::int8_t>(r2[c]) + static_cast<std::int8_t>(r3[c]);
      const std::uint32_t word = std::uint32_t{r0[c]} | std::uint32_t{r1[c]} << 8 | std::uint32_t{r2[c]} << 16 |
                                 std::uint32_t{r3[c]} << 24;
      std::memcpy(out + c * 4, &word, 4);
    }
  }
  for (Index j = whole; j < end; ++j)  // the last, partial group
    for (Index c = 0; c < dv; ++c) {
      packed[(j / 4) * dv16 * 4 + c * 4 + j % 4] = v[j * dv + c];
      sum[c] += v[j * dv + c];
    }
}


void pack_v(const std::int8_t* v, Index keys, Index dv, Index keys4, Index dv16,
            std::int8_t* packed, std::int32_t* sum) {
  std::fill(sum, sum + dv16, 0);
  pack_v_padding(keys, keys4, dv16, packed);
  pack_v_keys(v, 0, keys, dv, dv16, packed, sum);
}

}  // namespace qattn::kernels
