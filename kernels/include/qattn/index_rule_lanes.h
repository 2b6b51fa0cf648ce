// The index rule of the IndexSoftmax rows (step 3 of the spec, before the clamp) on lanes of clipped distances
// 0 <= delta <= c_int held as doubles, shared by the AVX2 (__m256d) and AVX-512 (__m512d) rows; the caller clamps
// to 2^b - 1 and truncates. GCC's vector operators on these types are the vmulpd / vaddpd / vdivpd the intrinsics
// name, one rounding each in this order (no contraction: -ffp-contract=off), so the lanes equal the scalar spec's
// double expressions; index_softmax_avx512.cc states why they are exact. Of internal linkage in every file that
// includes it (qattn/thread_buffer.h says why).
#pragma once

#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {  // NOLINT(google-build-namespaces): one private copy per ISA file, on purpose

template <typename VecD>
inline VecD index_rule_lanes(VecD delta, const IndexSoftmaxTables& t) {
  const double last = (1 << t.params.bits) - 1, c = static_cast<double>(t.c_int), m = static_cast<double>(t.q26);
  switch (t.params.index_rule) {
    case IndexRule::floor: return delta * last / c;
    case IndexRule::round: return (delta * (2 * last) + c) / (2 * c);
    case IndexRule::q26_round: return (delta * m + 0x1p25) * 0x1p-26;
    default: return delta * m * 0x1p-26;  // q26_floor (floor_f32 never reaches here)
  }
}

}  // namespace
}  // namespace qattn::kernels
