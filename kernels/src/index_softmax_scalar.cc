// The scalar spec of IndexSoftmax on one row of INT32 logits (docs/methods/index-softmax.md, steps 1-6). Per row:
// the maximum, Δ' = min(m - a, c_int), the index rule, E = LUT[idx], S = sum E in int64, then the normalisation:
// floor by the certified multiply-shift FloorDivider16 (qattn/reciprocal_division.h), the float32 quotient rounded
// half to even, or the Q8 reciprocal.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "qattn/kernels.h"
#include "qattn/reciprocal_division.h"

namespace qattn::kernels {

IndexSoftmaxTables IndexSoftmaxTables::make(const IndexSoftmaxParams& params, std::int64_t c_int) {
  validate(params, c_int);
  IndexSoftmaxTables t;
  t.params = params;
  t.c_int = c_int;
  const int last = (1 << params.bits) - 1;
  t.q26 = ((std::int64_t{last} << 27) + c_int) / (2 * c_int);  // floor(last 2^26 / c_int + 1/2), exact
  for (int i = 0; i <= last; ++i) {
    const double x = 255.0 * std::exp(-params.c * i / last);  // Eq. 13 in double
    t.lut[i] = static_cast<std::uint8_t>(params.lut_rounding == LutRounding::floor ? std::floor(x) : std::nearbyint(x));
  }
  t.lut[0] = 255;
  t.lut[last] = 0;
  return t;
}

std::int64_t index_softmax_index(std::int64_t delta, const IndexSoftmaxTables& t) {
  const std::int64_t last = (1 << t.params.bits) - 1, c = t.c_int;
  switch (t.params.index_rule) {
    case IndexRule::floor: return delta * last / c;
    case IndexRule::round: return (2 * delta * last + c) / (2 * c);
    case IndexRule::floor_f32: return static_cast<std::int64_t>(static_cast<float>(delta * last) / static_cast<float>(c));
    case IndexRule::q26_round: return (delta * t.q26 + (std::int64_t{1} << 25)) >> 26;
    case IndexRule::q26_floor: return (delta * t.q26) >> 26;
  }
  return 0;
}

void index_softmax_s32_u8__scalar(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                  const IndexSoftmaxTables& t, std::uint8_t* p) {
  std::fill(p, p + keys, std::uint8_t{0});
  limit = std::clamp<Index>(limit, 0, keys);
  std::int64_t m = std::numeric_limits<std::int64_t>::min();
  for (Index j = 0; j < limit; ++j)
    if (!valid || valid[j]) m = std::max<std::int64_t>(m, s[j]);
  if (m == std::numeric_limits<std::int64_t>::min()) return;  // nothing visible: zeros, no division
  const std::int64_t last = (1 << t.params.bits) - 1, c = t.c_int;
  std::int64_t sum = 0;
  for (Index j = 0; j < limit; ++j) {  // E into p for now (E <= 255)
    if (valid && !valid[j]) continue;
    const std::int64_t idx = index_softmax_index(std::min<std::int64_t>(m - s[j], c), t);
    p[j] = t.lut[std::clamp<std::int64_t>(idx, 0, last)];
    sum += p[j];
  }
  index_normalise_u8(p, limit, sum, t.params);
}

std::int64_t index_exp_s32_u8__scalar(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                      const IndexSoftmaxTables& t, std::uint8_t* e) {
  const std::int64_t last = (1 << t.params.bits) - 1;
  std::int64_t sum = 0;
  for (Index j = 0; j < n; ++j) {
    if (valid && !valid[j]) {
      e[j] = 0;
      continue;
    }
    const std::int64_t idx = index_softmax_index(std::min<std::int64_t>(std::int64_t{anchor} - s[j], t.c_int), t);
    e[j] = t.lut[std::clamp<std::int64_t>(idx, 0, last)];
    sum += e[j];
  }
  return sum;
}

void index_normalise_u8(std::uint8_t* p, Index limit, std::int64_t sum, const IndexSoftmaxParams& params) {
  const int ps = params.p_scale();
  switch (params.normalization) {
    case Normalization::floor: {
      const FloorDivider16 div = FloorDivider16::make(static_cast<std::uint64_t>(sum));  // sum >= 255
      for (Index j = 0; j < limit; ++j) p[j] = static_cast<std::uint8_t>(div.divide(std::uint32_t(ps) * p[j]));
      break;
    }
    case Normalization::f32_rne: {
      const float fs = static_cast<float>(sum);
      for (Index j = 0; j < limit; ++j)
        p[j] = static_cast<std::uint8_t>(std::nearbyint(static_cast<float>(ps * p[j]) / fs));
      break;
    }
    case Normalization::q8_reciprocal: {
      if (sum == ps) break;  // P = E
      const std::int64_t ns = (512 * std::int64_t{ps} + sum) / (2 * sum);
      for (Index j = 0; j < limit; ++j) p[j] = static_cast<std::uint8_t>((p[j] * ns + 128) >> 8);
      break;
    }
  }
}


}  // namespace qattn::kernels
