#include "qattn/reference/sage2.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"

namespace qattn::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float fp22(double x) {
  return static_cast<float>(lowp_round(x, fp22_accumulator(), LowpRounding::rz, LowpOverflow::non_saturating));
}

// Rounds P~ (fp32) to the P format.
float round_p(float x, SagePFormat f) {
  switch (f) {
    case SagePFormat::e4m3: return e4m3_round_saturate(x);
    case SagePFormat::e5m2: return static_cast<float>(lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate));
    case SagePFormat::int8: return std::nearbyint(x);
    case SagePFormat::fp16: return static_cast<float>(round_to_binary16(x));
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

namespace {

// One call in two parts that follow the paper's Algorithm 1 step by step, so each line can be read against the
// equation it models (docs/pipelines/sage2.md). The constructor is the first pass over the whole call: smoothing,
// the quantisation of Q' and K', V per channel; rows() is the block loop with its online softmax, FP8 P and the PV
// accumulator for any rows, each row alone (Method::prepare, docs/streaming.md).
}  // namespace

// Step (0): Q and K in place through the change of basis p.qk_transform names (Q K^T unchanged in exact arithmetic).
void sage2_transform_qk(RowMatrixXd& q, RowMatrixXd& k, const Sage2Params& p) {
  const Eigen::Index d = q.cols();
  switch (p.qk_transform) {
    case SageQkTransform::none: return;
    case SageQkTransform::hadamard: {
      if (d == 0 || (d & (d - 1)) != 0)
        throw InputError("Q", "shape", "head dimension " + std::to_string(d) +
                                           " is not a power of 2, which sage2's qk-transform=hadamard needs");
      std::mt19937_64 gen(p.hadamard_seed);
      std::vector<double> sign(static_cast<std::size_t>(d));
      for (double& s : sign) s = (gen() >> 63) != 0 ? -1.0 : 1.0;
      const double norm = 1.0 / std::sqrt(static_cast<double>(d));
      for (RowMatrixXd* m : {&q, &k})
        for (Eigen::Index i = 0; i < m->rows(); ++i) {
          double* x = m->row(i).data();
          for (Eigen::Index c = 0; c < d; ++c) x[c] *= sign[static_cast<std::size_t>(c)];
          for (Eigen::Index span = 1; span < d; span *= 2)  // butterflies, spans 1, 2, 4, ...
            for (Eigen::Index b = 0; b < d; b += 2 * span)
              for (Eigen::Index c = b; c < b + span; ++c) {
                const double u = x[c], w = x[c + span];
                x[c] = u + w, x[c + span] = u - w;
              }
          for (Eigen::Index c = 0; c < d; ++c) x[c] *= norm;
        }
      return;
    }
    case SageQkTransform::smoothquant:
    case SageQkTransform::qserve: {
      for (Eigen::Index c = 0; c < d; ++c) {
        const double qmax = q.rows() ? q.col(c).cwiseAbs().maxCoeff() : 0.0;
        const double kmax = k.rows() ? k.col(c).cwiseAbs().maxCoeff() : 0.0;
        double s = 1;  // Q_c / s, K_c * s
        if (p.qk_transform == SageQkTransform::smoothquant && qmax > 0 && kmax > 0)
          s = std::pow(qmax, p.alpha) / std::pow(kmax, 1 - p.alpha);
        if (p.qk_transform == SageQkTransform::qserve && kmax > 0) s = 1 / std::pow(kmax, p.alpha);
        q.col(c) /= s;
        k.col(c) *= s;
      }
      if (!q.allFinite() || !k.allFinite())
        throw InputError("Q", "values", "a channel scale of sage2's qk-transform overflows float64; rescale the inputs");
      return;
    }
  }
}

namespace {

class Sage2Call final : public PreparedCall {
 public:
  Sage2Call(const MatrixView& q_in, const MatrixView& k_in, const MatrixView& v_in, double scale,
            const AttentionMask& mask, const Sage2Params& p)
      : PreparedCall(q_in.rows()), p(p), scale(scale), mask(mask), lq(q_in.rows()), lk(k_in.rows()),
        d(q_in.cols()), dv(v_in.cols()), mma_model(mma_preset("h100-mma-e4m3")), k_in(k_in) {
    const bool hardware = p.accumulation == SageAccumulation::wgmma || p.accumulation == SageAccumulation::wgmma_single ||
                          p.accumulation == SageAccumulation::mma;
    if (hardware && p.p_format != SagePFormat::e4m3)
      throw std::invalid_argument("sage2: the H100 accumulators (wgmma, wgmma-single, mma) take E4M3 P and V (p=e4m3)");
    // Each step's float64 copies are released once the next holds what it needs: the call is held for a whole head
    // (O(L) each, docs/streaming.md), and its first pass should not hold several copies of Q, K and V at once.
    {
      // (0) the baselines' change of basis, (1) smoothing
      k = k_in;
      RowMatrixXd q = q_in;
      sage2_transform_qk(q, k, p);
      if (p.smooth_k && lk > 0) k.rowwise() -= column_mean(k).row(0);
      if (p.smooth_q) {
        q_block_mean.resize((lq + p.groups.block_q - 1) / p.groups.block_q, d);
        for (Eigen::Index b0 = 0; b0 < lq; b0 += p.groups.block_q) {
          const Eigen::Index n = std::min<Eigen::Index>(p.groups.block_q, lq - b0);
          q_block_mean.row(b0 / p.groups.block_q) = q.middleRows(b0, n).colwise().mean();
          for (Eigen::Index i = b0; i < b0 + n; ++i) q.row(i) -= q_block_mean.row(b0 / p.groups.block_q);
        }
      }
      // (2) quantise Q', K'; qk holds the codes (int8 and float) from here
      qq = sage_quantize(q, true, p.granularity, p.qk_bits, p.rounding, p.groups);
      kq = sage_quantize(k, false, p.granularity, p.qk_bits, p.rounding, p.groups);
      qk = std::make_unique<IntMatmulAbt>(qq.values, kq.values);
      qq.values.resize(0, 0);
      kq.values.resize(0, 0);
      // Delta S reads K' only with smooth_q. Without a change of basis K' is K_in - mean (or K_in), which the call
      // forms again from the caller's K and the mean, the same doubles, instead of holding a copy.
      if (p.smooth_q && p.qk_transform == SageQkTransform::none && p.smooth_k && lk > 0) k_mean = column_mean(k_in).row(0);
      if (!p.smooth_q || p.qk_transform == SageQkTransform::none) k.resize(0, 0);
    }
    // (1) V's smoothing, then (5) V per channel, rounded in place: v8 holds V - mean, then V8's values
    v_mean = Eigen::RowVectorXd::Zero(dv);
    v8 = v_in;
    if (p.smooth_v && lk > 0) {
      v_mean = v_in.colwise().mean();
      v8.rowwise() -= v_mean;
    }
    v_scale.resize(dv);
    for (Eigen::Index c = 0; c < dv; ++c) {
      const double amax = lk ? v8.col(c).cwiseAbs().maxCoeff() : 0.0;
      const double range = p.p_format == SagePFormat::e4m3 ? 448 : p.p_format == SagePFormat::e5m2 ? 57344 : 127;
      v_scale(c) = p.p_format == SagePFormat::fp16 ? 1.0 : (amax > 0 ? amax / range : 1.0);
      for (Eigen::Index j = 0; j < lk; ++j) {
        const double x = v8(j, c) / v_scale(c);
        switch (p.p_format) {
          case SagePFormat::e4m3: v8(j, c) = lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate); break;
          case SagePFormat::e5m2: v8(j, c) = lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate); break;
          case SagePFormat::int8: v8(j, c) = std::clamp(std::nearbyint(x), -127.0, 127.0); break;
          case SagePFormat::fp16: v8(j, c) = round_to_binary16(x); break;
        }
      }
    }
    key_block = p.key_block();
    // V8 as the hardware paths read it: float values (wgmma) or E4M3 codes by column (mma).
    if (p.accumulation == SageAccumulation::wgmma || p.accumulation == SageAccumulation::wgmma_single) {
      v8_codes.resize(static_cast<std::size_t>(lk * dv));
      for (Eigen::Index j = 0; j < lk; ++j)
        for (Eigen::Index c = 0; c < dv; ++c)
          v8_codes[static_cast<std::size_t>(j * dv + c)] = static_cast<std::uint8_t>(lowp_encode(v8(j, c), fp8_e4m3fn()));
    } else if (p.accumulation == SageAccumulation::mma) {
      v8c.resize(dv, lk);
      for (Eigen::Index j = 0; j < lk; ++j)
        for (Eigen::Index c = 0; c < dv; ++c) v8c(c, j) = static_cast<std::uint16_t>(lowp_encode(v8(j, c), fp8_e4m3fn()));
    }
    // What the block loop does not read is released: the call is held for a whole head (O(L) each, docs/streaming.md).
    if (hardware) v8.resize(0, 0);
  }

 private:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index rows) const override;

  static constexpr Eigen::Index kStep = 32;  // keys per fused step: wgmma's k of 32, mma.sync.m16n8k32's k
  const Sage2Params p;
  const double scale;
  const AttentionMask& mask;
  const Eigen::Index lq, lk, d, dv;
  const MmaModel& mma_model;
  const MatrixView k_in;     // the caller's K
  RowMatrixXd k;             // K' (smoothed), kept for Delta S with smooth_q and a change of basis only
  Eigen::RowVectorXd k_mean;  // smooth_q and smooth_k without a change of basis: K' = K_in - k_mean
  RowMatrixXd q_block_mean;  // row b: the mean subtracted from the queries of block b (smooth_q)
  Eigen::RowVectorXd v_mean, v_scale;
  SageQuantized qq, kq;  // their scales and groups (qk holds the codes)
  std::unique_ptr<IntMatmulAbt> qk;  // Q^ K^T, a block of rows at a time
  RowMatrixXd v8;  // V8's values, for the accumulators other than wgmma and mma
  Eigen::Index key_block = 64;
  // V8 as the hardware paths read it: E4M3 codes by row (wgmma: decoded a key block at a time into the values and
  // field exponents its step reads) or by column (mma).
  std::vector<std::uint8_t> v8_codes;
  Eigen::Matrix<std::uint16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> v8c;
};

AttentionResult Sage2Call::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  const bool unmasked = mask.empty();
  const RowMatrixXb visible = unmasked ? RowMatrixXb() : mask.rows(r0, rows, lq).visible(rows, lk);
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  const float range = p_range(p.p_format);
  const Eigen::Index blocks = (lk + key_block - 1) / key_block;
  // Rows go in chunks: each key block serves every row of the chunk before the next block, so the block's V8 stays
  // in cache. Each row's operations, and their order, are those of the row alone, so the chunk's size changes no
  // bit: 64 rows up to 8192 keys, 32 beyond (the chunk's logits and P~ are 2 x rows x L_k floats).
  const Eigen::Index kChunkRows = lk <= 8192 ? 64 : 32;
  RowMatrixXf s(kChunkRows, lk), p8(kChunkRows, lk), out(kChunkRows, dv), m_block(kChunkRows, blocks);
  std::vector<float> m(static_cast<std::size_t>(kChunkRows)), l(static_cast<std::size_t>(kChunkRows)),
      block(static_cast<std::size_t>(dv)), group_factor(kq.scales.size());
  const bool wgmma = p.accumulation == SageAccumulation::wgmma || p.accumulation == SageAccumulation::wgmma_single;
  // V8 decoded for the wgmma step: all of it once per call where it is at most 2^20 values (5 MiB), else one key
  // block at a time for each chunk.
  const bool decode_all = wgmma && lk * dv <= (Eigen::Index{1} << 20);
  std::vector<float> v8f(!wgmma ? 0 : static_cast<std::size_t>(decode_all ? lk * dv : key_block * dv));
  std::vector<std::int8_t> v8e(v8f.size());
  if (decode_all) e4m3_decode(v8_codes.data(), v8f.size(), v8f.data(), v8e.data());
  // Delta S of one query block against every key, fp32: fl32((mean_b . K'_j) scale), formed once per block.
  std::vector<float> delta_s(p.smooth_q ? static_cast<std::size_t>(lk) : 0);
  Eigen::Index delta_block = -1;
  const auto form_delta_s = [&](Eigen::Index b) {
    const auto mean = q_block_mean.row(b);
    for (Eigen::Index j = 0; j < lk; ++j) {
      double dot;
      if (k.size()) dot = mean.dot(k.row(j));
      else if (k_mean.size()) dot = mean.dot(k_in.row(j) - k_mean);
      else dot = mean.dot(k_in.row(j));
      delta_s[static_cast<std::size_t>(j)] = static_cast<float>(dot * scale);
    }
    delta_block = b;
  };
  for (Eigen::Index c0 = r0; c0 < r0 + rows; c0 += kChunkRows) {
    const Eigen::Index n = std::min(kChunkRows, r0 + rows - c0);
    const RowMatrixXi32 acc_int = qk->rows(c0, n);  // exact
    // (3) logits; the factor fl32(s_Q s_K scale) once per K group (the same bits as per key)
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, at = i - r0;
      for (std::size_t g = 0; g < kq.scales.size(); ++g)
        group_factor[g] = static_cast<float>(qq.scales[qq.group[i]] * kq.scales[g] * scale);
      if (p.smooth_q && i / p.groups.block_q != delta_block) form_delta_s(i / p.groups.block_q);
      for (Eigen::Index j = 0; j < lk; ++j) {
        if (!unmasked && !visible(at, j)) {
          s(t, j) = kNegInf;
          continue;
        }
        s(t, j) = static_cast<float>(acc_int(t, j)) * group_factor[kq.group[j]];
        if (p.smooth_q) s(t, j) += delta_s[static_cast<std::size_t>(j)];  // Delta S, fp32
        if (!std::isfinite(s(t, j))) throw_logit_overflow("sage2", "float32", i, j);
      }
    }
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.0f);
    out.setZero();
    // (4)-(6) online softmax over key blocks
    for (Eigen::Index b = 0; b < blocks; ++b) {
      const Eigen::Index b0 = b * key_block, b1 = std::min<Eigen::Index>(lk, b0 + key_block);
      if (wgmma && !decode_all)
        e4m3_decode(v8_codes.data() + b0 * dv, static_cast<std::size_t>((b1 - b0) * dv), v8f.data(), v8e.data());
      const std::size_t v8_at = decode_all ? static_cast<std::size_t>(b0 * dv) : 0;  // block b's first value
      for (Eigen::Index t = 0; t < n; ++t) {
        float m_new = m[t];
        for (Eigen::Index j = b0; j < b1; ++j) m_new = std::max(m_new, s.data()[t * lk + j]);
        m_block(t, b) = m_new;
        if (m_new == kNegInf) continue;  // nothing visible yet
        const float rescale = m[t] == kNegInf ? 0.0f : std::exp(m[t] - m_new);
        l[t] *= rescale;
        float* pr = &p8(t, 0);
        const float* sr = &s(t, 0);
        for (Eigen::Index j = b0; j < b1; ++j) {
          const float pt = sr[j] == kNegInf ? 0.0f : range * std::exp(sr[j] - m_new);
          l[t] += pt;  // the row sum takes P~ before rounding (upstream)
          pr[j] = pt;
        }
        if (p.p_format == SagePFormat::e4m3)  // the hot case without the format switch, so that it vectorises
          for (Eigen::Index j = b0; j < b1; ++j) pr[j] = e4m3_round_saturate(pr[j]);
        else
          for (Eigen::Index j = b0; j < b1; ++j) pr[j] = round_p(pr[j], p.p_format);
        float* o = &out(t, 0);
        switch (p.accumulation) {
          case SageAccumulation::wgmma:  // a fresh accumulator per block, promoted to the fp32 output
            std::fill(block.begin(), block.end(), 0.0f);
            for (Eigen::Index s0 = b0; s0 < b1; s0 += kStep)
              wgmma_e4m3_step(block.data(), pr + s0, static_cast<std::size_t>(std::min(kStep, b1 - s0)),
                              v8f.data() + v8_at + (s0 - b0) * dv, v8e.data() + v8_at + (s0 - b0) * dv, static_cast<std::size_t>(dv),
                              static_cast<std::size_t>(dv));
            for (Eigen::Index c = 0; c < dv; ++c) o[c] = o[c] * rescale + block[c];
            break;
          case SageAccumulation::wgmma_single:  // one accumulator, rescaled in fp32, then the next steps' fused term
            for (Eigen::Index c = 0; c < dv; ++c) o[c] *= rescale;
            for (Eigen::Index s0 = b0; s0 < b1; s0 += kStep)
              wgmma_e4m3_step(o, pr + s0, static_cast<std::size_t>(std::min(kStep, b1 - s0)),
                              v8f.data() + v8_at + (s0 - b0) * dv, v8e.data() + v8_at + (s0 - b0) * dv, static_cast<std::size_t>(dv),
                              static_cast<std::size_t>(dv));
            break;
          case SageAccumulation::mma: {  // a fresh buffer per block; each 32 keys: two HMMA halves, then + buffer
            std::array<std::uint16_t, kStep> pc{}, vc{};
            for (Eigen::Index c = 0; c < dv; ++c) {
              float buffer = 0;
              for (Eigen::Index s0 = b0; s0 < b1; s0 += kStep) {
                const Eigen::Index cnt = std::min(kStep, b1 - s0);
                pc.fill(0), vc.fill(0);  // a short last chunk is padded with zero products, as the kernel pads
                for (Eigen::Index j = 0; j < cnt; ++j)
                  pc[j] = static_cast<std::uint16_t>(lowp_encode(pr[s0 + j], fp8_e4m3fn())), vc[j] = v8c(c, s0 + j);
                buffer = mma_dot(mma_model, pc, vc, buffer);
              }
              o[c] = o[c] * rescale + buffer;
            }
            break;
          }
          default:  // the per-product FP22 bound and fp32, one output column at a time
            for (Eigen::Index c = 0; c < dv; ++c) {
              if (p.accumulation == SageAccumulation::two_level_fp22) {
                float block_fp22 = 0;  // a fresh FP22 buffer per block
                for (Eigen::Index j = b0; j < b1; ++j) block_fp22 = fp22(static_cast<double>(block_fp22) + pr[j] * v8(j, c));
                o[c] = o[c] * rescale + block_fp22;
              } else if (p.accumulation == SageAccumulation::fp22) {
                float acc = fp22(static_cast<double>(o[c]) * rescale);
                for (Eigen::Index j = b0; j < b1; ++j) acc = fp22(static_cast<double>(acc) + pr[j] * v8(j, c));
                o[c] = acc;
              } else {
                float acc = o[c] * rescale;
                for (Eigen::Index j = b0; j < b1; ++j) acc += static_cast<float>(pr[j] * v8(j, c));
                o[c] = acc;
              }
            }
        }
        m[t] = m_new;
      }
    }
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index at = c0 + t - r0;
      if (l[t] == 0) continue;  // fully masked row: P = 0, O = 0
      for (Eigen::Index c = 0; c < dv; ++c)
        r.o(at, c) = static_cast<float>(out(t, c) * v_scale(c) / l[t] + v_mean(c));
      // P: P8 e^{m_block - m} / l, the factor once per key block (the same bits as per key)
      for (Eigen::Index b = 0; b < blocks; ++b) {
        if (m_block(t, b) == kNegInf) continue;
        const double e = std::exp(static_cast<double>(m_block(t, b)) - m[t]);
        for (Eigen::Index j = b * key_block; j < std::min<Eigen::Index>(lk, (b + 1) * key_block); ++j)
          if (s(t, j) != kNegInf) r.p(at, j) = p8(t, j) * e / l[t];
      }
    }
  }
  return r;
}


}  // namespace

AttentionResult sage2_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage2Params& p) {
  if (q.rows() == 0) return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  return prepare_sage2(q, k, v, scale, mask, p)->rows(0, q.rows());
}

std::unique_ptr<PreparedCall> prepare_sage2(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                            double scale, const AttentionMask& mask, const Sage2Params& p) {
  require_attention_shapes(q, k, v);
  return std::make_unique<Sage2Call>(q, k, v, scale, mask, p);
}

}  // namespace qattn::ref
