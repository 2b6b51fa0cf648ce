#include "qattn/reference/index_softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace qattn::ref {

std::vector<std::uint8_t> index_lut(int bits, double c, LutRounding rounding) {
  IndexSoftmaxParams params;
  params.bits = bits;
  params.c = c;
  validate(params);
  const int last = (1 << bits) - 1;
  std::vector<std::uint8_t> lut(static_cast<std::size_t>(last) + 1);
  for (int i = 0; i <= last; ++i) {
    const double v = 255.0 * std::exp(-c * i / last);
    lut[i] = static_cast<std::uint8_t>(rounding == LutRounding::floor ? std::floor(v) : std::nearbyint(v));
  }
  lut[0] = 255;
  lut[last] = 0;
  return lut;
}

std::int64_t cint_from_scales(double c, double s_q, double s_k, std::int64_t d, CintRounding rounding) {
  if (d < 1) throw std::invalid_argument("c_int: d must be >= 1");
  if (!(s_q > 0) || !(s_k > 0)) throw std::invalid_argument("c_int: scales must be > 0");
  if (!(c > 0) || !std::isfinite(c)) throw std::invalid_argument("c_int: c must be finite and > 0");
  const double x = c * std::sqrt(static_cast<double>(d)) / (s_q * s_k);
  // Same rounding and saturation as cint_from_alpha, applied to the upstream expression.
  return cint_from_alpha(x, 1.0, rounding);
}

std::int64_t q26_multiplier(std::int64_t c_int, int bits) {
  const std::int64_t n = (std::int64_t{(1 << bits) - 1}) << 26;
  return (2 * n + c_int) / (2 * c_int);  // floor(n / c_int + 1/2), exact
}

int index_of(std::int64_t delta, std::int64_t c_int, int bits, IndexRule rule) {
  const std::int64_t last = (1 << bits) - 1;
  std::int64_t idx = 0;
  switch (rule) {
    case IndexRule::floor: idx = delta * last / c_int; break;
    case IndexRule::round: idx = (2 * delta * last + c_int) / (2 * c_int); break;
    case IndexRule::floor_f32: {
      const float num = static_cast<float>(delta * last);  // int64 -> float32, round to nearest even
      idx = static_cast<std::int64_t>(num / static_cast<float>(c_int));  // float32 division, then truncation
      break;
    }
    case IndexRule::q26_round: idx = (delta * q26_multiplier(c_int, bits) + (std::int64_t{1} << 25)) >> 26; break;
    case IndexRule::q26_floor: idx = (delta * q26_multiplier(c_int, bits)) >> 26; break;
  }
  return static_cast<int>(std::clamp<std::int64_t>(idx, 0, last));
}

std::int32_t normalize(std::int32_t e, std::int64_t row_sum, int p_scale, Normalization rule) {
  switch (rule) {
    case Normalization::floor: return static_cast<std::int32_t>(std::int64_t{p_scale} * e / row_sum);
    case Normalization::f32_rne: {
      const float q = static_cast<float>(p_scale * e) / static_cast<float>(row_sum);
      return static_cast<std::int32_t>(std::nearbyint(q));  // default FE_TONEAREST: ties to even
    }
    case Normalization::q8_reciprocal: {
      if (row_sum == p_scale) return e;
      const std::int64_t ns = (2 * 256 * std::int64_t{p_scale} + row_sum) / (2 * row_sum);
      return static_cast<std::int32_t>((e * ns + 128) >> 8);
    }
  }
  return 0;
}

void index_softmax_row(const std::int32_t* logits, const bool* valid, Eigen::Index length, std::int64_t c_int,
                       const IndexSoftmaxParams& params, const std::vector<std::uint8_t>& lut, std::int32_t* p_out,
                       IndexSoftmaxTrace* trace) {
  validate(params, c_int);
  if (lut.size() != (std::size_t{1} << params.bits)) throw std::invalid_argument("index_softmax: LUT size != 2^bits");
  if (trace) {
    trace->idx.assign(length, -1);
    trace->e.assign(length, 0);
    trace->row_sum = 0;
    trace->q8_ns = -1;
  }
  std::int64_t m = std::numeric_limits<std::int64_t>::min();
  for (Eigen::Index j = 0; j < length; ++j)
    if (!valid || valid[j]) m = std::max<std::int64_t>(m, logits[j]);
  std::fill(p_out, p_out + length, 0);
  if (m == std::numeric_limits<std::int64_t>::min()) return;  // fully masked (or empty): zeros, no division

  std::vector<std::int32_t> e(length, 0);
  std::int64_t s = 0;
  for (Eigen::Index j = 0; j < length; ++j) {
    if (valid && !valid[j]) continue;
    const std::int64_t delta = std::min<std::int64_t>(m - logits[j], c_int);
    const int idx = index_of(delta, c_int, params.bits, params.index_rule);
    e[j] = lut[idx];
    s += e[j];
    if (trace) trace->idx[j] = idx;
  }
  // S >= LUT[0] = 255 > 0: the maximum entry always has Δ' = 0 and index 0.
  for (Eigen::Index j = 0; j < length; ++j) p_out[j] = normalize(e[j], s, params.p_scale(), params.normalization);
  if (trace) {
    trace->e.assign(e.begin(), e.end());
    trace->row_sum = s;
    if (params.normalization == Normalization::q8_reciprocal && s != params.p_scale())
      trace->q8_ns = (2 * 256 * std::int64_t{params.p_scale()} + s) / (2 * s);
  }
}

RowMatrixXi32 index_softmax(const Eigen::Ref<const RowMatrixXi32>& logits, std::int64_t c_int, const IndexSoftmaxParams& params,
                            const RowMatrixXb& valid) {
  if (valid.size() != 0 && (valid.rows() != logits.rows() || valid.cols() != logits.cols()))
    throw std::invalid_argument("index_softmax: mask shape differs from logits");
  const std::vector<std::uint8_t> lut = index_lut(params.bits, params.c, params.lut_rounding);
  RowMatrixXi32 p(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r)
    index_softmax_row(logits.row(r).data(), valid.size() ? valid.row(r).data() : nullptr, logits.cols(), c_int, params,
                      lut, p.row(r).data());
  return p;
}

void index_softmax_grouped_row(const std::int32_t* logits, const bool* valid, Eigen::Index length,
                               const KeyGroupClip& clip, const IndexSoftmaxParams& params,
                               const std::vector<std::uint8_t>& lut, std::int32_t* p_out) {
  const Eigen::Index blocks = clip.block < 1 ? 0 : (length + clip.block - 1) / clip.block;
  if (clip.block < 1 || static_cast<Eigen::Index>(clip.ratio.size()) != blocks ||
      static_cast<Eigen::Index>(clip.c_int.size()) != blocks)
    throw std::invalid_argument("index_softmax_grouped: " + std::to_string(length) + " keys in blocks of " +
                                std::to_string(clip.block) + " need one ratio and one c_int per block");
  for (const std::int64_t c : clip.c_int) validate(params, c);
  if (lut.size() != (std::size_t{1} << params.bits)) throw std::invalid_argument("index_softmax: LUT size != 2^bits");
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
  // (1) each block's maximum m_j, and the row's mu = max_j rho_j m_j
  std::vector<std::int64_t> m(static_cast<std::size_t>(blocks), kNone);
  std::int64_t mu = kNone;
  for (Eigen::Index j = 0; j < length; ++j)
    if (!valid || valid[j]) m[j / clip.block] = std::max<std::int64_t>(m[j / clip.block], logits[j]);
  for (Eigen::Index g = 0; g < blocks; ++g)
    if (m[g] != kNone) mu = std::max(mu, clip.ratio[g] * m[g]);
  std::fill(p_out, p_out + length, 0);
  if (mu == kNone) return;  // fully masked: zeros, no division
  // (2)-(5) per block: the clipped distance, the index into the one table, E, the row sum
  const int last = (1 << params.bits) - 1;
  std::vector<std::int32_t> e(length, 0);
  std::int64_t s = 0;
  for (Eigen::Index j = 0; j < length; ++j) {
    if (valid && !valid[j]) continue;
    const Eigen::Index g = j / clip.block;
    const std::int64_t c = clip.c_int[g];
    int idx = 0;
    if (clip.rule == GroupMax::global) {
      const std::int64_t delta = std::max<std::int64_t>(0, key_group_anchor(mu, clip.ratio[g]) - logits[j]);
      idx = index_of(std::min(delta, c), c, params.bits, params.index_rule);
    } else {
      const int k = key_group_offset(mu - clip.ratio[g] * m[g], clip.offset_scale, params.bits);
      idx = std::min(index_of(std::min<std::int64_t>(m[g] - logits[j], c), c, params.bits, params.index_rule) + k, last);
    }
    e[j] = lut[idx];
    s += e[j];
  }
  // (6) Eq. 15 over the whole row. S >= 255: the entry that attains mu has distance 0 (M_j = m_j in its block; k_j = 0).
  for (Eigen::Index j = 0; j < length; ++j) p_out[j] = normalize(e[j], s, params.p_scale(), params.normalization);
}

RowMatrixXi32 index_softmax_grouped(const Eigen::Ref<const RowMatrixXi32>& logits, const KeyGroupClip& clip,
                                    const IndexSoftmaxParams& params, const RowMatrixXb& valid) {
  if (valid.size() != 0 && (valid.rows() != logits.rows() || valid.cols() != logits.cols()))
    throw std::invalid_argument("index_softmax: mask shape differs from logits");
  const std::vector<std::uint8_t> lut = index_lut(params.bits, params.c, params.lut_rounding);
  RowMatrixXi32 p(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r)
    index_softmax_grouped_row(logits.row(r).data(), valid.size() ? valid.row(r).data() : nullptr, logits.cols(), clip,
                              params, lut, p.row(r).data());
  return p;
}

Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> index_softmax_fp(
    const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>& logits, const IndexSoftmaxParams& params) {
  const std::vector<std::uint8_t> lut = index_lut(params.bits, params.c, params.lut_rounding);
  const int last = (1 << params.bits) - 1;
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> p =
      Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>::Zero(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (Eigen::Index j = 0; j < logits.cols(); ++j) {
      const double x = logits(r, j);
      if (std::isnan(x) || x == std::numeric_limits<double>::infinity())
        throw std::invalid_argument("index_softmax_fp: NaN or +inf logit");
      m = std::max(m, x);
    }
    if (m == -std::numeric_limits<double>::infinity()) continue;
    double s = 0;
    for (Eigen::Index j = 0; j < logits.cols(); ++j) {
      if (logits(r, j) == -std::numeric_limits<double>::infinity()) continue;
      const double delta = std::min(m - logits(r, j), params.c);
      const int idx = std::clamp(static_cast<int>(delta * last / params.c), 0, last);
      p(r, j) = lut[idx];
      s += lut[idx];
    }
    p.row(r) /= s;
  }
  return p;
}

}  // namespace qattn::ref
