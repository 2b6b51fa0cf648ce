#include "qattn/reference/int_pipelines.h"

#include "qattn/error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/exp_f32.h"
#include "qattn/quantize.h"
#include "qattn/reference/softmax.h"

namespace qattn::ref {
namespace {

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

namespace {

// max |x| over x, in int64 (|INT32_MIN| fits).
std::int64_t max_abs(const RowMatrixXi32& x) {
  std::int64_t m = 0;
  for (Eigen::Index i = 0; i < x.size(); ++i) m = std::max(m, std::abs(std::int64_t{x.data()[i]}));
  return m;
}

// The bound max|a| max|b| (terms) on every partial sum of one entry of an integer product, whatever the order.
double sum_bound(const RowMatrixXi32& a, const RowMatrixXi32& b, Eigen::Index terms) {
  return static_cast<double>(max_abs(a)) * static_cast<double>(max_abs(b)) * static_cast<double>(terms);
}

// Below 2^24 (2^53) every partial sum, in any order and with fused multiply-adds, is an integer that float (double)
// holds exactly, so Eigen's float (double) GEMM on the integer values computes the exact integer sums.
constexpr double kFloatExact = 0x1p24, kDoubleExact = 0x1p53;

}  // namespace

RowMatrixXi32 int_matmul_abt(const RowMatrixXi32& a, const RowMatrixXi32& b) {
  const double bound = sum_bound(a, b, a.cols());
  if (bound < kFloatExact) return (a.cast<float>() * b.cast<float>().transpose()).cast<std::int32_t>();
  if (bound < static_cast<double>(std::numeric_limits<std::int32_t>::max()))
    return (a.cast<double>() * b.cast<double>().transpose()).cast<std::int32_t>();
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

IntMatmulAbt::IntMatmulAbt(const RowMatrixXi32& a, const RowMatrixXi32& b) {
  const double bound = sum_bound(a, b, a.cols());
  path_ = bound < kFloatExact ? 0 : bound < static_cast<double>(std::numeric_limits<std::int32_t>::max()) ? 1 : 2;
  a_int8_ = a.size() == 0 || (a.minCoeff() >= std::numeric_limits<std::int8_t>::min() &&
                              a.maxCoeff() <= std::numeric_limits<std::int8_t>::max());
  if (a_int8_) a8_ = a.cast<std::int8_t>();
  else a32_ = a;
  if (path_ == 0) bf_ = b.cast<float>();
  if (path_ == 1) bd_ = b.cast<double>();
  if (path_ == 2) b32_ = b;
}

RowMatrixXi32 IntMatmulAbt::rows(Eigen::Index r0, Eigen::Index n) const {
  const auto a_rows = [&]<typename T>(T) -> Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> {
    if (a_int8_) return a8_.middleRows(r0, n).template cast<T>();
    return a32_.middleRows(r0, n).template cast<T>();
  };
  if (path_ == 0) return (a_rows(float{}) * bf_.transpose()).cast<std::int32_t>();
  if (path_ == 1) return (a_rows(double{}) * bd_.transpose()).cast<std::int32_t>();
  return int_matmul_abt(a_rows(std::int32_t{}), b32_);
}

namespace {

// max over the rows of a of sum_t |a_it|, in int64 (exact for fewer than 2^32 columns).
std::int64_t max_row_abs_sum(const RowMatrixXi32& a) {
  std::int64_t m = 0;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    std::int64_t s = 0;
    for (Eigen::Index t = 0; t < a.cols(); ++t) s += std::abs(std::int64_t{a(i, t)});
    m = std::max(m, s);
  }
  return m;
}

}  // namespace

IntMatmulAb::IntMatmulAb(const RowMatrixXi32& b) : b_max_(max_abs(b)) {
  if (b_max_ <= (std::int64_t{1} << 24)) bf_ = b.cast<float>();  // every entry exact in float
  else b32_ = b;
}

RowMatrixXd IntMatmulAb::operator()(const RowMatrixXi32& a) const {
  // Monotone rounding keeps the double product on the right side of the powers of two it is compared with.
  const double bound = static_cast<double>(max_row_abs_sum(a)) * static_cast<double>(b_max_);
  const bool held_float = b32_.size() == 0;
  if (bound < kFloatExact && held_float) return (a.cast<float>() * bf_).cast<double>();  // exact: see kFloatExact
  if (bound < kDoubleExact) {
    if (held_float) return a.cast<double>() * bf_.cast<double>();
    return a.cast<double>() * b32_.cast<double>();
  }
  // Row by row: a(i, t) times row t of b, added into int64 sums (exact, so the order of the additions does not
  // matter); b is read along its rows, and the zeros of a (most of an integer P) are skipped.
  const Eigen::Index cols = held_float ? bf_.cols() : b32_.cols();
  RowMatrixXd c(a.rows(), cols);
  std::vector<std::int64_t> sums(static_cast<std::size_t>(cols));
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    std::fill(sums.begin(), sums.end(), 0);
    for (Eigen::Index t = 0; t < a.cols(); ++t) {
      const std::int64_t x = a(i, t);
      if (x == 0) continue;
      if (held_float) {
        const float* row = bf_.data() + t * cols;
        for (std::size_t j = 0; j < sums.size(); ++j) sums[j] += x * static_cast<std::int64_t>(row[j]);
      } else {
        const std::int32_t* row = b32_.data() + t * cols;
        for (std::size_t j = 0; j < sums.size(); ++j) sums[j] += x * row[j];
      }
    }
    for (Eigen::Index j = 0; j < cols; ++j) c(i, j) = static_cast<double>(sums[static_cast<std::size_t>(j)]);
  }
  return c;
}

RowMatrixXd int_matmul_ab(const RowMatrixXi32& a, const RowMatrixXi32& b) { return IntMatmulAb(b)(a); }

namespace {

// The query rows [r0, r0 + n) of a call's mask, as booleans; empty for no mask.
RowMatrixXb visible_rows(const AttentionMask& mask, Eigen::Index r0, Eigen::Index n, Eigen::Index lq, Eigen::Index lk) {
  return mask.empty() ? RowMatrixXb() : mask.rows(r0, n, lq).visible(n, lk);
}

class QuantOnlyCall final : public PreparedCall {
 public:
  QuantOnlyCall(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale, const AttentionMask& mask,
                QuantOnlySoftmax softmax)
      : PreparedCall(q.rows()), mask_(mask), softmax_(softmax) {
    require_attention_shapes(q, k, v);
    // The codes are held once, by the two products, in the types their GEMMs read (int8 Q, float K and V); the
    // int32 codes are released as soon as each product holds its copy.
    {
      const Int8Matrix qi = quantize_symmetric_int8(q), ki = quantize_symmetric_int8(k);
      logit_scale_ = static_cast<float>(qi.scale * ki.scale * scale);
      qk_.emplace(qi.values, ki.values);
    }
    const Int8Matrix vi = quantize_symmetric_int8(v);
    v_scale_ = vi.scale;
    pv_.emplace(vi.values);
  }

  AttentionResult compute(Eigen::Index r0, Eigen::Index n) const {
    const RowMatrixXi32 a = qk_->rows(r0, n);
    RowMatrixXf s(a.rows(), a.cols());
    for (Eigen::Index i = 0; i < a.size(); ++i) {
      s.data()[i] = static_cast<float>(a.data()[i]) * logit_scale_;
      if (!std::isfinite(s.data()[i])) throw_logit_overflow("quant-only", "float32", r0 + i / s.cols(), i % s.cols());
    }
    const RowMatrixXb visible = visible_rows(mask_, r0, n, query_rows(), s.cols());
    for (Eigen::Index i = 0; i < visible.size(); ++i)
      if (!visible.data()[i]) s.data()[i] = -std::numeric_limits<float>::infinity();
    RowMatrixXf p(s.rows(), s.cols());
    if (softmax_ == QuantOnlySoftmax::reference) {
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
    r.o = dequantize_output((*pv_)(r.p_int), v_scale_, 127);
    return r;
  }

 protected:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const override { return compute(r0, n); }

 private:
  const AttentionMask& mask_;
  QuantOnlySoftmax softmax_;
  std::optional<IntMatmulAbt> qk_;  // Q's codes K's codes^T
  std::optional<IntMatmulAb> pv_;   // P8 V's codes
  float logit_scale_ = 0;
  double v_scale_ = 1;
};

}  // namespace

std::unique_ptr<PreparedCall> prepare_quant_only(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                 double scale, const AttentionMask& mask, QuantOnlySoftmax softmax) {
  return std::make_unique<QuantOnlyCall>(q, k, v, scale, mask, softmax);
}

AttentionResult quant_only_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                     const AttentionMask& mask, QuantOnlySoftmax softmax) {
  require_attention_shapes(q, k, v);
  return QuantOnlyCall(q, k, v, scale, mask, softmax).compute(0, q.rows());
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

namespace {

class IntAttentionCall final : public PreparedCall {
 public:
  IntAttentionCall(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                   const AttentionMask& mask, const IndexSoftmaxParams& params, CintEvaluation cint_eval,
                   const IntAttentionGroups& groups, Int8Rounding qround)
      : PreparedCall(q.rows()), mask_(mask), params_(params), groups_(groups), lk_(k.rows()) {
    require_attention_shapes(q, k, v);
    if (groups.q_rows < 0 || groups.k_rows < 0) throw std::invalid_argument("int_attention: q_rows and k_rows must be >= 0");
    if (groups.v == VGroup::key_block && groups.k_rows == 0)
      throw std::invalid_argument("int_attention: V scales per key block need K in blocks (k-group > 0)");
    k_blocks_ = groups.k_rows > 0 && k.rows() > 0;
    if (k_blocks_) kb_ = quantize_key_blocks(k, groups.k_rows, qround);
    ki_ = k_blocks_ ? kb_.codes : quantize_symmetric_int8(k, qround);
    // One Q scale and one c_int (per key block) per query group
    q_group_ = groups.q_rows == 0 ? std::max<Eigen::Index>(q.rows(), 1) : groups.q_rows;
    for (Eigen::Index g0 = 0; g0 < q.rows(); g0 += q_group_) {
      const Eigen::Index n = std::min(q_group_, q.rows() - g0);
      Group g{quantize_symmetric_int8(q.middleRows(g0, n), qround), 0, {}};
      if (k_blocks_) g.clip = key_group_clip(kb_, groups.k_rows, g.q.scale, scale, params, cint_eval, groups.group_max);
      else g.c_int = intattention_cint(g.q.scale, ki_.scale, scale, params, cint_eval);
      q_groups_.push_back(std::move(g));
    }
    switch (groups.v) {
      case VGroup::tensor: v_.push_back(quantize_symmetric_int8(v, qround)); break;
      case VGroup::channel:
        for (Eigen::Index c = 0; c < v.cols(); ++c) v_.push_back(quantize_symmetric_int8(v.col(c), qround));
        break;
      case VGroup::key_block:
        for (Eigen::Index j0 = 0; j0 < v.rows(); j0 += groups.k_rows)
          v_.push_back(quantize_symmetric_int8(v.middleRows(j0, std::min(groups.k_rows, v.rows() - j0)), qround));
        break;
    }
    dv_ = v.cols();
  }

  AttentionResult compute(Eigen::Index r0, Eigen::Index n) const {
    AttentionResult r;
    r.p_int.resize(n, lk_);
    r.p_scale = params_.p_scale();
    r.p_dtype = params_.p_format == PFormat::u8 ? DType::u8 : DType::i8;
    const RowMatrixXb visible = visible_rows(mask_, r0, n, query_rows(), lk_);
    for (Eigen::Index i0 = r0; i0 < r0 + n;) {  // the part of each query group inside the block
      const Group& g = q_groups_[static_cast<std::size_t>(i0 / q_group_)];
      const Eigen::Index g0 = i0 / q_group_ * q_group_, i1 = std::min({g0 + q_group_, r0 + n, query_rows()});
      const RowMatrixXi32 a = int_matmul_abt(g.q.values.middleRows(i0 - g0, i1 - i0), ki_.values);
      const RowMatrixXb vis = visible.size() ? RowMatrixXb(visible.middleRows(i0 - r0, i1 - i0)) : RowMatrixXb();
      r.p_int.middleRows(i0 - r0, i1 - i0) =
          k_blocks_ ? index_softmax_grouped(a, g.clip, params_, vis) : index_softmax(a, g.c_int, params_, vis);
      i0 = i1;
    }
    r.p = r.p_int.cast<double>() / r.p_scale;
    switch (groups_.v) {
      case VGroup::tensor: r.o = dequantize_output(int_matmul_ab(r.p_int, v_.front().values), v_.front().scale, r.p_scale); break;
      case VGroup::channel:
        r.o.resize(n, dv_);
        for (Eigen::Index c = 0; c < dv_; ++c) {
          const Int8Matrix& vc = v_[static_cast<std::size_t>(c)];
          r.o.col(c) = dequantize_output(int_matmul_ab(r.p_int, vc.values), vc.scale, r.p_scale);
        }
        break;
      case VGroup::key_block: {
        RowMatrixXd acc = RowMatrixXd::Zero(n, dv_);
        for (std::size_t blk = 0; blk < v_.size(); ++blk) {
          const Eigen::Index j0 = static_cast<Eigen::Index>(blk) * groups_.k_rows;
          const RowMatrixXi32 pb = r.p_int.middleCols(j0, v_[blk].values.rows());
          acc += int_matmul_ab(pb, v_[blk].values) * v_[blk].scale;  // each product one double rounding, summed in key order
        }
        r.o = dequantize_output(acc, 1.0, r.p_scale);
        break;
      }
    }
    return r;
  }

 protected:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const override { return compute(r0, n); }

 private:
  struct Group {
    Int8Matrix q;
    std::int64_t c_int;
    KeyGroupClip clip;
  };
  const AttentionMask& mask_;
  IndexSoftmaxParams params_;
  IntAttentionGroups groups_;
  Eigen::Index lk_, dv_ = 0, q_group_ = 1;
  bool k_blocks_ = false;
  KeyBlocks kb_;
  Int8Matrix ki_;
  std::vector<Group> q_groups_;
  std::vector<Int8Matrix> v_;  // per tensor (one), channel or key block
};

}  // namespace

std::unique_ptr<PreparedCall> prepare_int_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                    double scale, const AttentionMask& mask,
                                                    const IndexSoftmaxParams& params, CintEvaluation cint_eval,
                                                    const IntAttentionGroups& groups, Int8Rounding qround) {
  return std::make_unique<IntAttentionCall>(q, k, v, scale, mask, params, cint_eval, groups, qround);
}

AttentionResult int_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                              const AttentionMask& mask, const IndexSoftmaxParams& params, CintEvaluation cint_eval,
                              const IntAttentionGroups& groups, Int8Rounding qround) {
  return IntAttentionCall(q, k, v, scale, mask, params, cint_eval, groups, qround).compute(0, q.rows());
}

}  // namespace qattn::ref
