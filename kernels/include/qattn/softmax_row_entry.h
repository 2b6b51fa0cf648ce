// The entry every vector IndexSoftmax row kernel (index_softmax_s32_u8__avx2, __avx512, __neon and the AVX-512 row
// given its maximum) shares before step (1), and the one of the vector float softmax rows (softmax_s32_f32_u8__avx2,
// __avx512). Of internal linkage in every file that includes it (qattn/thread_buffer.h
// says why), and written without std:: algorithms for the same reason.
#pragma once

#include <cstring>

#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {  // NOLINT(google-build-namespaces): one private copy per ISA file, on purpose

// A row with a padding mask (valid non-null), or under the floor-f32 index rule, runs the scalar spec whole; any other
// row has its limit clamped to [0, keys] and P zeroed from there to keys. Returns the clamped limit: 0 where the row
// is complete already (the scalar spec ran it, or nothing is visible and P is all zeros).
inline Index vector_row_limit(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                              const IndexSoftmaxTables& t, std::uint8_t* p) {
  if (valid || t.params.index_rule == IndexRule::floor_f32) {
    index_softmax_s32_u8__scalar(s, valid, limit, keys, t, p);
    return 0;
  }
  limit = limit < 0 ? 0 : (limit > keys ? keys : limit);
  std::memset(p + limit, 0, static_cast<std::size_t>(keys - limit));
  return limit;
}

// The float softmax row's entry: a row with a padding mask runs the scalar spec whole; any other row has its limit
// clamped to [0, keys] and P zeroed over all keys. Returns the clamped limit: 0 where the row is complete already.
inline Index vector_f32_row_limit(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                                  float* scratch, std::uint8_t* p) {
  if (valid) {
    softmax_s32_f32_u8__scalar(s, valid, limit, keys, alpha, scratch, p);
    return 0;
  }
  limit = limit < 0 ? 0 : (limit > keys ? keys : limit);
  std::memset(p, 0, static_cast<std::size_t>(keys));
  return limit;
}

}  // namespace
}  // namespace qattn::kernels
