// AVX-512 dequantisation of O, 8 lanes of double: vcvtdq2pd (exact), vmulpd, vdivpd, vcvtpd2ps, each rounding to
// nearest as the scalar spec's multiply, divide and narrowing do (the default MXCSR; nothing here changes it).
#include <immintrin.h>

#include "qattn/kernels.h"

namespace qattn::kernels {

void dequantise_s32_f32__avx512(const std::int32_t* acc, Index rows, Index cols, Index acc_stride, double out_scale,
                                int p_scale, float* o, Index o_stride) {
  const __m512d scale = _mm512_set1_pd(out_scale), divisor = _mm512_set1_pd(static_cast<double>(p_scale));
  for (Index i = 0; i < rows; ++i) {
    const std::int32_t* a = acc + i * acc_stride;
    float* out = o + i * o_stride;
    for (Index c = 0; c < cols; c += 8) {
      const Index n = cols - c < 8 ? cols - c : 8;
      const __mmask8 k = static_cast<__mmask8>((1u << n) - 1u);
      const __m512d x = _mm512_cvtepi32_pd(_mm256_maskz_loadu_epi32(k, a + c));
      _mm256_mask_storeu_ps(out + c, k, _mm512_cvtpd_ps(_mm512_div_pd(_mm512_mul_pd(x, scale), divisor)));
    }
  }
}

}  // namespace qattn::kernels
