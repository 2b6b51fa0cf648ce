// The float32 softmax of the fast Quant-Only pipeline, defined once so that the reference model can use exactly the
// same function (reference/int_pipelines.h, QuantOnlySoftmax::lanes16) and the ladder stays bit-exact.
//
// exp_f32_poly(x), x <= 0, every operation one binary32 rounding (round to nearest even), no fused multiply-add:
//   x <- max(x, -80)                          e^-80 = 1.8e-35: below it the result is that of -80 (absolute error
//                                             < 1.8e-35); every result stays a normal float
//   n = rne(x * log2e)                        log2e = fl32(1 / ln 2)
//   r = (x - n * ln2_hi) - n * ln2_lo         ln2_hi = 355/512 (9 bits: n * ln2_hi is exact), ln2_lo = fl32(ln 2 - ln2_hi)
//   p = 1 + r (c1 + r (c2 + r (c3 + r (c4 + r (c5 + r c6)))))   c_k = fl32(1 / k!), Horner from the inside out
//   result = p * 2^n                          exact (a normal float times a power of two in range)
// exp(-inf) = 0. Error against e^x: declared below 4 ulp over [-80, 0]; tests/unit/exp_f32_test.cc measures 2.89 ulp
// (at x = -5.198) on every 97th float of the range.
//
// softmax_row_lanes16: s[j] for j < n with visible[j] (all if null); m = max; e_j = exp_f32_poly(s_j - m) (the
// difference rounded to float); the sum in the order a 16-lane vector unit produces it: 16 partial sums
// part[l] = sum over j = l, l + 16, l + 32, ... in increasing j (masked entries add +0, which changes nothing),
// then folded in halves: part[i] += part[i + 8] (i < 8), part[i] += part[i + 4] (i < 4), part[i] += part[i + 2]
// (i < 2), total = part[0] + part[1]; p_j = e_j / total. A row with nothing visible gives all zeros.
#pragma once

#include <cstddef>

namespace qattn {

float exp_f32_poly(float x);

void softmax_row_lanes16(const float* s, const bool* visible, std::ptrdiff_t n, float* p);

// The constants above, for the SIMD variants and the tests.
struct ExpF32Constants {
  static constexpr float kLog2e = 1.44269502f;       // fl32(1 / ln 2)
  static constexpr float kLn2Hi = 0.693359375f;      // 355 / 512
  static constexpr float kLn2Lo = -2.12194442e-4f;   // fl32(ln 2 - 355/512)
  static constexpr float kMin = -80.0f;
  static constexpr float kC[7] = {1.0f, 1.0f, 0.5f, 1.66666672e-1f, 4.16666679e-2f, 8.33333377e-3f, 1.38888892e-3f};
};

}  // namespace qattn
