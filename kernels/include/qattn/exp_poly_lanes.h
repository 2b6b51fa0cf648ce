// exp_f32_poly's reduction and polynomial (qattn/exp_f32.h) on lanes of floats, shared by the AVX2 (__m256) and
// AVX-512 (__m512) Quant-Only rows; each row rounds n = rne(x log2 e) and scales by 2^n with its own instructions.
// GCC's vector operators on these types are the vmulps / vsubps / vaddps the intrinsics name, one rounding each in
// this order (no contraction: -ffp-contract=off), so every lane equals the scalar spec's float expression. Of internal
// linkage in every file that includes it (qattn/thread_buffer.h says why).
#pragma once

#include "qattn/exp_f32.h"

namespace qattn::kernels {
namespace {  // NOLINT(google-build-namespaces): one private copy per ISA file, on purpose

// r = (x - n ln2_hi) - n ln2_lo, then p = c6 r^6 + ... + c0 by Horner's rule: p ~ e^x / 2^n.
template <typename VecF>
inline VecF exp_poly_reduced(VecF x, VecF n) {
  using K = ExpF32Constants;
  const VecF r = (x - n * K::kLn2Hi) - n * K::kLn2Lo;
  VecF p = VecF{} + K::kC[6];  // the constant in every lane (0 + c6 is c6 exactly)
  for (int k = 5; k >= 0; --k) p = p * r + K::kC[k];
  return p;
}

}  // namespace
}  // namespace qattn::kernels
