// The FP4 block steps of the flash loop (flash_call.h): NVFP4 and MXFP4 blocks, the block-scaled step's terms.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "flash_call.h"
#include "qattn/reference/lowp_float.h"

namespace qattn::ref::flash_detail {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QATTN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QATTN_CLONES
#endif

// The block-scaled step's terms of one group for n outputs: sum[j] (4 times the exact sum of products: twice the E2M1
// values each) times a's scale / 4 and b's scales, and the exponents a_exp + b_exp[j] (-126 where a scale is zero;
// a_exp -100000 for a zero a scale).
QATTN_CLONES void nvf4_terms(const float* sum, float a_scale, std::int32_t a_exp, const float* b_scale,
                             const std::int32_t* b_exp, double* term, std::int32_t* term_e, std::size_t n) {
  const double a = static_cast<double>(a_scale * 0.25f);
  for (std::size_t j = 0; j < n; ++j) {
    term[j] = static_cast<double>(sum[j]) * a * static_cast<double>(b_scale[j]);
    term_e[j] = b_scale[j] == 0 ? -126 : std::max(a_exp + b_exp[j], std::int32_t{-126});
  }
}

// sum[c] = sum over j < n of p[j] v[j * stride + c]: the small integers of twice the E2M1 values, exact in float.
QATTN_CLONES void nvf4_group_sums(const float* p, std::size_t n, const float* v, std::size_t stride, std::size_t cols,
                                  float* sum) {
  std::fill(sum, sum + cols, 0.0f);
  for (std::size_t j = 0; j < n; ++j) {
    const float pj = p[j];
    if (pj == 0) continue;
    const float* vr = v + j * stride;
    for (std::size_t c = 0; c < cols; ++c) sum[c] += pj * vr[c];
  }
}

// P~ of n <= 16 keys over its block scale sc: twice the E2M1 codes into twice, and p = the decoded values times the
// block's E4M3 scale.
QATTN_CLONES void nvf4_p_block(float* p, std::size_t n, float sc, float scale, float* twice) {
  for (std::size_t j = 0; j < n; ++j) {
    const float tw = e2m1_twice(p[j] / sc);  // 0 / 0 in a block of masked keys: NaN, to 6 (scale 0)
    twice[j] = tw;
    p[j] = tw * 0.5f * scale;
  }
}


// One MXFP4 block of 32 values (OCP MX v1.0): the scale 2^X, X = floor(log2 amax) - 2 (E2M1's emax) within
// [-127, 127] (-127 for an all-zero block), the codes E2M1(x / 2^X) (exact division), written as twice their values;
// returns 2^X.
float mxfp4_block(const float* x, float* twice) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const int e = amax == 0 ? -127 : std::clamp(std::ilogb(amax) - 2, -127, 127);
  const float scale = std::ldexp(1.0f, e);
  for (int i = 0; i < 32; ++i) twice[i] = e2m1_twice(x[i] / scale);
  return scale;
}

// One NVFP4 block of n <= 16 values x[i * stride]: the E4M3 scale SF = E4M3(fl32(amax / 6)) (nearest even,
// saturating), the codes E2M1(fl32(x fl32(1 / SF))), 0 where SF = 0, written as twice their values; returns SF.
float nvfp4_block(const float* x, std::size_t n, std::size_t stride, float* twice, std::size_t twice_stride) {
  float amax = 0;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i * stride]));
  const float sf = e4m3_round_saturate(amax / 6.0f);
  const float inv = sf == 0 ? 0.0f : 1.0f / sf;
  for (std::size_t i = 0; i < n; ++i) twice[i * twice_stride] = e2m1_twice(x[i * stride] * inv);
  return sf;
}

}  // namespace qattn::ref::flash_detail
