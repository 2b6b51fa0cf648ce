#include "qattn/reference/int_pipelines.h"

#include "qattn/error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/exp_f32.h"
#include "qattn/quantize.h"
#include "qattn/reference/softmax.h"

namespace qattn::ref {
namespace {

void check_shapes(const MatrixView& q, const MatrixView& k, const MatrixView& v) {
  if (q.cols() != k.cols() || k.rows() != v.rows())
    throw std::invalid_argument("attention: shapes q [" + std::to_string(q.rows()) + ", " + std::to_string(q.cols()) +
                                "], k [" + std::to_string(k.rows()) + ", " + std::to_string(k.cols()) + "], v [" +
                                std::to_string(v.rows()) + ", " + std::to_string(v.cols()) + "] do not fit");
}

// O = fl32(PV * s_v / p_scale), the product in double.
RowMatrixXd dequantize_output(const MatrixView& pv, double s_v, int p_scale) {
  RowMatrixXd o(pv.rows(), pv.cols());
  RowMatrixXd storage;
  const double* pvd = packed_rows(pv, storage);
  for (Eigen::Index i = 0; i < pv.size(); ++i)
    o.data()[i] = static_cast<float>(pvd[i] * s_v / p_scale);
  return o;
}

}  // namespace

namespace {

template <class View>
Int8Matrix quantize_view(const View& x, Int8Rounding rounding) {
  using Scalar = typename View::Scalar;
  Int8Matrix r;
  std::vector<std::int8_t> q(static_cast<std::size_t>(x.size()));
  Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> storage;
  r.scale = quantize_int8_symmetric(std::span<const Scalar>(packed_rows(x, storage), q.size()), std::span<std::int8_t>(q),
                                    rounding);
  r.values.resize(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.size(); ++i) r.values.data()[i] = q[static_cast<std::size_t>(i)];
  return r;
}

template <class View>
KeyBlocks quantize_blocks(const View& k, Eigen::Index rows, Int8Rounding rounding) {
  if (rows < 1) throw std::invalid_argument("int_attention: k-group must be >= 1 keys");
  KeyBlocks b;
  b.codes.values.resize(k.rows(), k.cols());
  for (Eigen::Index r0 = 0; r0 < k.rows(); r0 += rows) {
    const Eigen::Index n = std::min(rows, k.rows() - r0);
    const Int8Matrix block = quantize_view(View(k.middleRows(r0, n)), rounding);
    b.codes.values.middleRows(r0, n) = block.values;
    b.scales.push_back(block.scale);
  }
  b.ratios = key_group_ratios(b.scales);
  return b;
}

}  // namespace

Int8Matrix quantize_symmetric_int8(const MatrixView& x, Int8Rounding rounding) { return quantize_view(x, rounding); }

RowMatrixXi32 int_matmul_abt(const RowMatrixXi32& a, const RowMatrixXi32& b) {
  RowMatrixXi32 c(a.rows(), b.rows());
  for (Eigen::Index i = 0; i < a.rows(); ++i)
    for (Eigen::Index j = 0; j < b.rows(); ++j) {
      std::int64_t s = 0;
      for (Eigen::Index t = 0; t < a.cols(); ++t) s += std::int64_t{a(i, t)} * b(j, t);
      if (s > std::numeric_limits<std::int32_t>::max() || s < std::numeric_limits<std::int32_t>::min())
        throw std::overflow_error("int_matmul_abt: result leaves int32");
      c(i, j) = static_cast<std::int32_t>(s);
    }
  return c;
}

RowMatrixXd int_matmul_ab(const RowMatrixXi32& a, const RowMatrixXi32& b) {
  // Row by row: a(i, t) times row t of b, added into int64 sums (exact, so the order of the additions does not
  // matter); b is read along its rows, and the zeros of a (most of an integer P) are skipped.
  RowMatrixXd c(a.rows(), b.cols());
  std::vector<std::int64_t> sums(static_cast<std::size_t>(b.cols()));
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    std::fill(sums.begin(), sums.end(), 0);
    for (Eigen::Index t = 0; t < a.cols(); ++t) {
      const std::int64_t x = a(i, t);
      if (x == 0) continue;
      const std::int32_t* row = b.data() + t * b.cols();
      for (std::size_t j = 0; j < sums.size(); ++j) sums[j] += x * row[j];
    }
    for (Eigen::Index j = 0; j < b.cols(); ++j) c(i, j) = static_cast<double>(sums[static_cast<std::size_t>(j)]);
  }
  return c;
}

AttentionResult quant_only_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                     const AttentionMask& mask, QuantOnlySoftmax softmax) {
  check_shapes(q, k, v);
  const Int8Matrix qi = quantize_symmetric_int8(q), ki = quantize_symmetric_int8(k), vi = quantize_symmetric_int8(v);
  const RowMatrixXi32 a = int_matmul_abt(qi.values, ki.values);
  const float logit_scale = static_cast<float>(qi.scale * ki.scale * scale);
  RowMatrixXf s(a.rows(), a.cols());
  for (Eigen::Index i = 0; i < a.size(); ++i) {
    s.data()[i] = static_cast<float>(a.data()[i]) * logit_scale;
    if (!std::isfinite(s.data()[i])) throw_logit_overflow("quant-only", "float32", i / s.cols(), i % s.cols());
  }
  if (!mask.empty()) {
    const RowMatrixXb visible = mask.visible(s.rows(), s.cols());
    for (Eigen::Index i = 0; i < s.size(); ++i)
      if (!visible.data()[i]) s.data()[i] = -std::numeric_limits<float>::infinity();
  }
  RowMatrixXf p(s.rows(), s.cols());
  if (softmax == QuantOnlySoftmax::reference) {
    p = softmax_ref_rows(s);
  } else {
    for (Eigen::Index i = 0; i < s.rows(); ++i) softmax_row_lanes16(s.row(i).data(), nullptr, s.cols(), p.row(i).data());
  }
  AttentionResult r;
  r.p_int.resize(p.rows(), p.cols());
  for (Eigen::Index i = 0; i < p.size(); ++i)
    r.p_int.data()[i] = static_cast<std::int32_t>(std::nearbyint(127.0f * p.data()[i]));  // fl32 product, RNE
  r.p_scale = 127;
  r.p_dtype = DType::i8;
  r.p = r.p_int.cast<double>() / 127.0;
  r.o = dequantize_output(int_matmul_ab(r.p_int, vi.values), vi.scale, 127);
  return r;
}

std::int64_t intattention_cint(double s_q, double s_k, double scale, const IndexSoftmaxParams& params,
                               CintEvaluation cint_eval) {
  // The logit scale alpha (float64) or c / alpha (float32, the official code's order) must be a positive finite
  // number; inputs so large that it is not are refused (OverflowRule::refuse).
  const double alpha = s_q * s_k * scale;
  if (!(std::isfinite(alpha) && alpha > 0))
    throw InputError("logits", "alpha", "the logit scale s_Q s_K scale = " + std::to_string(alpha) +
                                            " is not a finite number > 0 in float64 (docs/non-finite.md)");
  if (cint_eval == CintEvaluation::f64) return cint_from_alpha(params.c, alpha, params.cint_rounding);
  const float x = ((static_cast<float>(params.c) / static_cast<float>(s_q)) / static_cast<float>(s_k)) /
                  static_cast<float>(scale);
  if (!(std::isfinite(x) && x > 0))
    throw InputError("logits", "c / alpha", "c / (s_Q s_K scale) is not a finite number > 0 in float32, in which "
                                            "this preset derives c_int (docs/non-finite.md)");
  return cint_from_alpha(static_cast<double>(x), 1.0, params.cint_rounding);
}

KeyBlocks quantize_key_blocks(const MatrixView& k, Eigen::Index rows, Int8Rounding rounding) {
  return quantize_blocks(k, rows, rounding);
}
KeyBlocks quantize_key_blocks(const MatrixViewF& k, Eigen::Index rows, Int8Rounding rounding) {
  return quantize_blocks(k, rows, rounding);
}

KeyGroupClip key_group_clip(const KeyBlocks& k, Eigen::Index rows, double s_q, double scale,
                            const IndexSoftmaxParams& params, CintEvaluation cint_eval, GroupMax rule) {
  KeyGroupClip clip;
  clip.block = rows;
  clip.ratio = k.ratios;
  clip.rule = rule;
  double s_max = 0;
  for (const double s_k : k.scales) {
    clip.c_int.push_back(intattention_cint(s_q, s_k, scale, params, cint_eval));
    s_max = std::max(s_max, s_k);
  }
  clip.offset_scale = key_group_offset_scale(s_q, s_max, scale, params.bits, params.c);
  return clip;
}

AttentionResult int_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                              const AttentionMask& mask, const IndexSoftmaxParams& params, CintEvaluation cint_eval,
                              const IntAttentionGroups& groups, Int8Rounding qround) {
  check_shapes(q, k, v);
  if (groups.q_rows < 0 || groups.k_rows < 0) throw std::invalid_argument("int_attention: q_rows and k_rows must be >= 0");
  if (groups.v == VGroup::key_block && groups.k_rows == 0)
    throw std::invalid_argument("int_attention: V scales per key block need K in blocks (k-group > 0)");
  const bool k_blocks = groups.k_rows > 0 && k.rows() > 0;
  const KeyBlocks kb = k_blocks ? quantize_key_blocks(k, groups.k_rows, qround) : KeyBlocks{};
  const Int8Matrix ki = k_blocks ? kb.codes : quantize_symmetric_int8(k, qround);
  const RowMatrixXb visible = mask.empty() ? RowMatrixXb() : mask.visible(q.rows(), k.rows());
  AttentionResult r;
  r.p_int.resize(q.rows(), k.rows());
  r.p_scale = params.p_scale();
  r.p_dtype = params.p_format == PFormat::u8 ? DType::u8 : DType::i8;
  const Eigen::Index rows = groups.q_rows == 0 ? std::max<Eigen::Index>(q.rows(), 1) : groups.q_rows;
  for (Eigen::Index r0 = 0; r0 < q.rows(); r0 += rows) {  // one Q scale, one c_int (per key block) per query group
    const Eigen::Index n = std::min(rows, q.rows() - r0);
    const Int8Matrix qi = quantize_symmetric_int8(q.middleRows(r0, n), qround);
    const RowMatrixXi32 a = int_matmul_abt(qi.values, ki.values);
    const RowMatrixXb vis = visible.size() ? RowMatrixXb(visible.middleRows(r0, n)) : RowMatrixXb();
    if (k_blocks) {
      const KeyGroupClip clip = key_group_clip(kb, groups.k_rows, qi.scale, scale, params, cint_eval, groups.group_max);
      r.p_int.middleRows(r0, n) = index_softmax_grouped(a, clip, params, vis);
    } else {
      r.p_int.middleRows(r0, n) = index_softmax(a, intattention_cint(qi.scale, ki.scale, scale, params, cint_eval), params, vis);
    }
  }
  r.p = r.p_int.cast<double>() / r.p_scale;
  switch (groups.v) {
    case VGroup::tensor: {
      const Int8Matrix vi = quantize_symmetric_int8(v, qround);
      r.o = dequantize_output(int_matmul_ab(r.p_int, vi.values), vi.scale, r.p_scale);
      break;
    }
    case VGroup::channel:
      r.o.resize(q.rows(), v.cols());
      for (Eigen::Index c = 0; c < v.cols(); ++c) {
        const Int8Matrix vc = quantize_symmetric_int8(v.col(c), qround);
        r.o.col(c) = dequantize_output(int_matmul_ab(r.p_int, vc.values), vc.scale, r.p_scale);
      }
      break;
    case VGroup::key_block: {
      RowMatrixXd acc = RowMatrixXd::Zero(q.rows(), v.cols());
      for (Eigen::Index j0 = 0; j0 < v.rows(); j0 += groups.k_rows) {
        const Eigen::Index n = std::min(groups.k_rows, v.rows() - j0);
        const Int8Matrix vb = quantize_symmetric_int8(v.middleRows(j0, n), qround);
        const RowMatrixXi32 pb = r.p_int.middleCols(j0, n);
        acc += int_matmul_ab(pb, vb.values) * vb.scale;  // each product one double rounding, summed in key order
      }
      r.o = dequantize_output(acc, 1.0, r.p_scale);
      break;
    }
  }
  return r;
}

}  // namespace qattn::ref
