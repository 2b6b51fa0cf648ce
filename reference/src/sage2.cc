#include "qattn/reference/sage2.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "qattn/float_format.h"
#include "qattn/reference/lowp_float.h"

namespace qattn::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float fp22(double x) {
  return static_cast<float>(lowp_round(x, fp22_accumulator(), LowpRounding::rz, LowpOverflow::non_saturating));
}

// Rounds P~ (fp32) to the P format.
float round_p(float x, SagePFormat f) {
  switch (f) {
    case SagePFormat::e4m3: return static_cast<float>(lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate));
    case SagePFormat::e5m2: return static_cast<float>(lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate));
    case SagePFormat::int8: return std::nearbyint(x);
    case SagePFormat::fp16: return static_cast<float>(round_to_format(x, kBinary16));
  }
  return x;
}

// Largest P~ of the format (the factor that puts e^{S - m} in range): 448 for E4M3, 57344 for E5M2, 127 for INT8, 1.
float p_range(SagePFormat f) {
  switch (f) {
    case SagePFormat::e4m3: return 448.0f;
    case SagePFormat::e5m2: return 57344.0f;
    case SagePFormat::int8: return 127.0f;
    case SagePFormat::fp16: return 1.0f;
  }
  return 1.0f;
}

RowMatrixXd column_mean(const MatrixView& x) { return x.colwise().mean(); }

}  // namespace

// One function of about 100 lines on purpose: it follows the paper's Algorithm 1 step by step (smoothing, per-thread
// quantisation, the block loop with its online softmax, FP8 P and V, the FP22 accumulator), so each line can be read
// against the equation it models (docs/pipelines/sage2.md).
AttentionResult sage2_attention(const MatrixView& q_in, const MatrixView& k_in, const MatrixView& v_in, double scale,
                                const AttentionMask& mask, const Sage2Params& p) {
  if (q_in.cols() != k_in.cols() || k_in.rows() != v_in.rows())
    throw std::invalid_argument("sage2: shapes of q, k, v do not fit");
  const Eigen::Index lq = q_in.rows(), lk = k_in.rows(), d = q_in.cols(), dv = v_in.cols();
  // (1) smoothing
  RowMatrixXd k = k_in, q = q_in, v = v_in;
  if (p.smooth_k && lk > 0) k.rowwise() -= column_mean(k_in).row(0);
  RowMatrixXd q_block_mean = RowMatrixXd::Zero(lq, d);  // the mean subtracted from each query (its block's)
  if (p.smooth_q)
    for (Eigen::Index b0 = 0; b0 < lq; b0 += p.groups.block_q) {
      const Eigen::Index n = std::min<Eigen::Index>(p.groups.block_q, lq - b0);
      const Eigen::RowVectorXd mean = q_in.middleRows(b0, n).colwise().mean();
      for (Eigen::Index i = b0; i < b0 + n; ++i) q_block_mean.row(i) = mean, q.row(i) -= mean;
    }
  Eigen::RowVectorXd v_mean = Eigen::RowVectorXd::Zero(dv);
  if (p.smooth_v && lk > 0) {
    v_mean = v_in.colwise().mean();
    v.rowwise() -= v_mean;
  }
  // (2) quantise Q', K'
  const SageQuantized qq = sage_quantize(q, true, p.granularity, p.qk_bits, p.rounding, p.groups);
  const SageQuantized kq = sage_quantize(k, false, p.granularity, p.qk_bits, p.rounding, p.groups);
  // (5) V per channel
  RowMatrixXd v8(lk, dv);
  Eigen::RowVectorXd v_scale(dv);
  for (Eigen::Index c = 0; c < dv; ++c) {
    const double amax = lk ? v.col(c).cwiseAbs().maxCoeff() : 0.0;
    const double range = p.p_format == SagePFormat::e4m3 ? 448 : p.p_format == SagePFormat::e5m2 ? 57344 : 127;
    v_scale(c) = p.p_format == SagePFormat::fp16 ? 1.0 : (amax > 0 ? amax / range : 1.0);
    for (Eigen::Index j = 0; j < lk; ++j) {
      const double x = v(j, c) / v_scale(c);
      switch (p.p_format) {
        case SagePFormat::e4m3: v8(j, c) = lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate); break;
        case SagePFormat::e5m2: v8(j, c) = lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate); break;
        case SagePFormat::int8: v8(j, c) = std::clamp(std::nearbyint(x), -127.0, 127.0); break;
        case SagePFormat::fp16: v8(j, c) = round_to_format(x, kBinary16); break;
      }
    }
  }
  const RowMatrixXb visible = mask.empty() ? RowMatrixXb::Constant(lq, lk, true) : mask.visible(lq, lk);
  AttentionResult r;
  r.o = RowMatrixXd::Zero(lq, dv);
  r.p = RowMatrixXd::Zero(lq, lk);
  const float range = p_range(p.p_format);
  std::vector<float> s(lk), p8(lk), m_at(lk);
  for (Eigen::Index i = 0; i < lq; ++i) {
    // (3) logits of row i
    for (Eigen::Index j = 0; j < lk; ++j) {
      if (!visible(i, j)) {
        s[j] = kNegInf;
        continue;
      }
      std::int64_t a = 0;
      for (Eigen::Index t = 0; t < d; ++t) a += std::int64_t{qq.values(i, t)} * kq.values(j, t);
      const float f = static_cast<float>(qq.scales[qq.group[i]] * kq.scales[kq.group[j]] * scale);
      s[j] = static_cast<float>(a) * f;
      if (p.smooth_q) s[j] += static_cast<float>(q_block_mean.row(i).dot(k.row(j)) * scale);  // Delta S, fp32
      if (!std::isfinite(s[j])) throw_logit_overflow("sage2", "float32", i, j);
    }
    // (4)-(6) online softmax over key blocks
    float m = kNegInf, l = 0;
    std::vector<float> out(dv, 0.0f);      // fp32 output accumulator (and the FP22 one for single-level)
    for (Eigen::Index b0 = 0; b0 < lk; b0 += p.kv_block) {
      const Eigen::Index b1 = std::min<Eigen::Index>(lk, b0 + p.kv_block);
      float m_new = m;
      for (Eigen::Index j = b0; j < b1; ++j) m_new = std::max(m_new, s[j]);
      if (m_new == kNegInf) continue;  // nothing visible yet
      const float rescale = m == kNegInf ? 0.0f : std::exp(m - m_new);
      l *= rescale;
      for (Eigen::Index j = b0; j < b1; ++j) {
        const float pt = s[j] == kNegInf ? 0.0f : range * std::exp(s[j] - m_new);
        l += pt;  // the row sum takes P~ before rounding (upstream)
        p8[j] = round_p(pt, p.p_format);
        m_at[j] = m_new;
      }
      for (Eigen::Index c = 0; c < dv; ++c) {
        switch (p.accumulation) {
          case SageAccumulation::two_level_fp22: {
            float block = 0;  // a fresh FP22 buffer per block
            for (Eigen::Index j = b0; j < b1; ++j) block = fp22(static_cast<double>(block) + p8[j] * v8(j, c));
            out[c] = out[c] * rescale + block;
            break;
          }
          case SageAccumulation::fp22: {
            float acc = fp22(static_cast<double>(out[c]) * rescale);
            for (Eigen::Index j = b0; j < b1; ++j) acc = fp22(static_cast<double>(acc) + p8[j] * v8(j, c));
            out[c] = acc;
            break;
          }
          case SageAccumulation::fp32: {
            float acc = out[c] * rescale;
            for (Eigen::Index j = b0; j < b1; ++j) acc += static_cast<float>(p8[j] * v8(j, c));
            out[c] = acc;
            break;
          }
        }
      }
      m = m_new;
    }
    if (l == 0) continue;  // fully masked row: P = 0, O = 0
    for (Eigen::Index c = 0; c < dv; ++c) r.o(i, c) = static_cast<float>(out[c] * v_scale(c) / l + v_mean(c));
    for (Eigen::Index j = 0; j < lk; ++j)
      if (s[j] != kNegInf) r.p(i, j) = p8[j] * std::exp(static_cast<double>(m_at[j]) - m) / l;
  }
  return r;
}

}  // namespace qattn::ref
