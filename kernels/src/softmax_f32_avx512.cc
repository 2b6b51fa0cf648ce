// AVX-512 Quant-Only softmax row, 16 lanes, the same floats as softmax_s32_f32_u8__scalar:
//   x = fl32(S) * alpha (vcvtdq2ps rounds like static_cast<float>), masked lanes -inf
//   exp_f32_poly step by step (qattn/exp_f32.h): vrndscaleps to nearest even, separate vmulps/vaddps (no FMA),
//   vscalefps for p 2^n (exact: n >= -116, the result is a normal float)
//   the 16 partial sums are the vector accumulator's lanes; the fold adds the high half onto the low one, three
//   times, then lane 0 + lane 1: the documented order (float addition is commutative, so low + high == high + low)
//   p = e / total (vdivps), P8 = rne(127 p)
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

inline __mmask16 tail_mask(Index j, Index limit) {
  const Index n = std::clamp<Index>(limit - j, 0, 16);
  return static_cast<__mmask16>((1u << n) - 1u);
}

inline __m512 exp_poly(__m512 x) {
  using K = ExpF32Constants;
  x = _mm512_max_ps(x, _mm512_set1_ps(K::kMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(K::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_scalef_ps(exp_poly_reduced(x, n), n);
}

}  // namespace

void softmax_s32_f32_u8__avx512(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                                float* scratch, std::uint8_t* p) {
  limit = vector_f32_row_limit(s, valid, limit, keys, alpha, scratch, p);
  if (limit == 0) return;
  const __m512 va = _mm512_set1_ps(alpha), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmax = ninf;
  for (Index j = 0; j < limit; j += 16) {
    const __mmask16 k = tail_mask(j, limit);
    const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, s + j)), va);
    vmax = _mm512_mask_max_ps(vmax, k, vmax, x);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, vmax);
  float m = lanes[0];
  for (const float x : lanes) m = x > m ? x : m;
  const __m512 vm = _mm512_set1_ps(m);
  __m512 part = _mm512_setzero_ps();
  for (Index j = 0; j < limit; j += 16) {
    const __mmask16 k = tail_mask(j, limit);
    const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, s + j)), va);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_poly(_mm512_sub_ps(x, vm)));
    part = _mm512_add_ps(part, e);
    _mm512_mask_storeu_ps(scratch + j, k, e);
  }
  // keys beyond limit add +0 in the scalar spec: no change. Fold 16 -> 8 -> 4 -> 2 -> 1.
  __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(part), _mm512_extractf32x8_ps(part, 1));
  __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  const float total = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  const __m512 vt = _mm512_set1_ps(total), v127 = _mm512_set1_ps(127.0f);
  for (Index j = 0; j < limit; j += 16) {
    const __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(tail_mask(j, limit), scratch + j), vt);
    const __m512i p8 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v127, q), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_mask_storeu_epi8(p + j, tail_mask(j, limit), _mm512_cvtepi32_epi8(p8));
  }
}

}  // namespace qattn::kernels
