// AVX2 Quant-Only softmax row, the same floats as softmax_s32_f32_u8__scalar, 16 logits per step in two ymm halves:
//   x = fl32(S) * alpha (vcvtdq2ps rounds like static_cast<float>); lanes at or past `limit` are left out (their e
//   is +0, as the spec's masked entries add +0)
//   exp_f32_poly step by step (qattn/exp_f32.h): vroundps to nearest even, separate vmulps/vaddps (no FMA), and
//   p 2^n as p times the float whose bits are (n + 127) << 23: n >= -116 (x >= -80), so 2^n is a normal float and
//   the product is exact, as vscalefps is in the AVX-512 row
//   the spec's 16 partial sums are the lanes of two accumulators, lanes 0-7 (j mod 16 < 8) and 8-15; the fold adds
//   the high one onto the low one, then halves three times: the documented order
//   p = e / total (vdivps), P8 = rne(127 p) (vcvtps2dq in the default rounding mode)
// Rows with a padding mask run the scalar spec.
#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "qattn/exp_f32.h"
#include "qattn/exp_poly_lanes.h"
#include "qattn/kernels.h"
#include "qattn/softmax_row_entry.h"

namespace qattn::kernels {
namespace {

inline __m256 exp_poly(__m256 x) {
  using K = ExpF32Constants;
  x = _mm256_max_ps(x, _mm256_set1_ps(K::kMin));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(K::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 p = exp_poly_reduced(x, n);
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// Lanes j + l < limit of 8 logits from j.
inline __m256i lanes_below(Index j, Index limit) {
  const Index left = std::min<Index>(limit - j, 8);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace

void softmax_s32_f32_u8__avx2(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                              float* scratch, std::uint8_t* p) {
  limit = vector_f32_row_limit(s, valid, limit, keys, alpha, scratch, p);
  if (limit == 0) return;
  const __m256 va = _mm256_set1_ps(alpha), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const auto logits = [&](Index j, __m256i k) { return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_maskload_epi32(s + j, k)), va); };
  __m256 vmax = ninf;
  for (Index j = 0; j < limit; j += 8) {
    const __m256i k = lanes_below(j, limit);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, logits(j, k), _mm256_castsi256_ps(k)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = lanes[0];
  for (const float x : lanes) m = x > m ? x : m;
  const __m256 vm = _mm256_set1_ps(m);
  __m256 part[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // the spec's lanes 0-7 and 8-15
  for (Index j = 0; j < limit; j += 8) {
    const __m256i k = lanes_below(j, limit);
    const __m256 e = _mm256_and_ps(exp_poly(_mm256_sub_ps(logits(j, k), vm)), _mm256_castsi256_ps(k));
    part[(j / 8) % 2] = _mm256_add_ps(part[(j / 8) % 2], e);
    _mm256_maskstore_ps(scratch + j, k, e);
  }
  // Fold 16 -> 8 -> 4 -> 2 -> 1.
  const __m256 h8 = _mm256_add_ps(part[0], part[1]);
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  const float total = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  const __m256 vt = _mm256_set1_ps(total), v127 = _mm256_set1_ps(127.0f);
  const Index body = limit / 8 * 8;
  for (Index j = 0; j < body; j += 8) {
    const __m256i p8 = _mm256_cvtps_epi32(_mm256_mul_ps(v127, _mm256_div_ps(_mm256_loadu_ps(scratch + j), vt)));
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(p8), _mm256_extracti128_si256(p8, 1));  // 0..127
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p + j), _mm_packus_epi16(w, w));
  }
  for (Index j = body; j < limit; ++j) {
    const __m256i p8 = _mm256_cvtps_epi32(_mm256_mul_ps(v127, _mm256_div_ps(_mm256_set1_ps(scratch[j]), vt)));
    p[j] = static_cast<std::uint8_t>(_mm256_cvtsi256_si32(p8));
  }
}

}  // namespace qattn::kernels
