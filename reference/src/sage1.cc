#include "qattn/reference/sage1.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/mma.h"

namespace qattn::ref {
namespace {

// A value as an error message shows it: 9 significant digits, exponent where large or small.
std::string shown(double x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr Eigen::Index kStep = 16;  // keys per HMMA.16816 step
constexpr float kLog2e = 1.44269504f;  // the official quantiser's constant

inline float exp2_f32(float x) { return static_cast<float>(std::exp2(static_cast<double>(x))); }

// x read as float32; values beyond float32 are refused, naming the tensor.
float to_f32(double x, const char* name, Eigen::Index i, Eigen::Index j) {
  const float f = static_cast<float>(x);
  if (!std::isfinite(f))
    throw InputError(name, "[" + std::to_string(i) + ", " + std::to_string(j) + "]",
                     shown(x) + " is beyond float32, in which sage1 quantises " + name);
  return f;
}

// Step (2): INT8 codes per block of `block` rows, scale fl32(max|x| / 127), half away from zero as the official
// quantiser (+0.5 sign in float32, then the cast toward zero). An all-zero block has codes 0 and scale 0.
void quantize_blocks(const std::vector<float>& x, Eigen::Index rows, Eigen::Index cols, Eigen::Index block,
                     RowMatrixXi32& codes, std::vector<float>& scales) {
  codes.resize(rows, cols);
  scales.assign(static_cast<std::size_t>((rows + block - 1) / block), 0.0f);
  for (Eigen::Index b0 = 0; b0 < rows; b0 += block) {
    const Eigen::Index b1 = std::min(rows, b0 + block);
    float amax = 0;
    for (Eigen::Index i = b0 * cols; i < b1 * cols; ++i) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(i)]));
    const float s = amax / 127.0f;
    scales[static_cast<std::size_t>(b0 / block)] = s;
    for (Eigen::Index i = b0; i < b1; ++i)
      for (Eigen::Index c = 0; c < cols; ++c) {
        const float xv = x[static_cast<std::size_t>(i * cols + c)];
        if (s == 0) {
          codes(i, c) = 0;
          continue;
        }
        const float y = xv / s;
        codes(i, c) = static_cast<std::int32_t>(y + (y >= 0 ? 0.5f : -0.5f));
      }
  }
}

class Sage1Call final : public PreparedCall {
 public:
  Sage1Call(const MatrixView& q, const MatrixView& k_in, const MatrixView& v, double scale, const AttentionMask& mask,
            const Sage1Params& p)
      : PreparedCall(q.rows()), p(p), mask(mask), lq(q.rows()), lk(k_in.rows()), d(q.cols()), dv(v.cols()) {
    {  // steps (1) and (2); what they make is released once qk holds the codes (as int8 and float)
      // (1) smoothing, in float64, then float32
      RowMatrixXd k = k_in;
      if (p.smooth_k && lk > 0) k.rowwise() -= k_in.colwise().mean();
      // (2) Q scaled into base 2, Q and K' per block
      const float factor = static_cast<float>(scale * static_cast<double>(kLog2e));
      std::vector<float> xq(static_cast<std::size_t>(lq * d)), xk(static_cast<std::size_t>(lk * d));
      for (Eigen::Index i = 0; i < lq; ++i)
        for (Eigen::Index c = 0; c < d; ++c) {
          const float x = to_f32(q(i, c), "Q", i, c) * factor;
          if (!std::isfinite(x)) throw_logit_overflow("sage1", "float32", i, 0);
          xq[static_cast<std::size_t>(i * d + c)] = x;
        }
      for (Eigen::Index j = 0; j < lk; ++j)
        for (Eigen::Index c = 0; c < d; ++c) xk[static_cast<std::size_t>(j * d + c)] = to_f32(k(j, c), "K", j, c);
      RowMatrixXi32 qq, kq;
      quantize_blocks(xq, lq, d, p.block_q, qq, q_scale);
      quantize_blocks(xk, lk, d, p.block_k, kq, k_scale);
      qk = std::make_unique<IntMatmulAbt>(qq, kq);
    }
    // (5) V in binary16, with its exponents for the HMMA step
    v16.resize(static_cast<std::size_t>(lk * dv));
    v16e.resize(v16.size());
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < dv; ++c) {
        const double x = round_to_binary16(v(j, c));
        if (!std::isfinite(x))
          throw InputError("V", "[" + std::to_string(j) + ", " + std::to_string(c) + "]",
                           shown(v(j, c)) + " is beyond binary16 (65504), in which sage1 holds V");
        const auto at = static_cast<std::size_t>(j * dv + c);
        v16[at] = static_cast<float>(x);
        v16e[at] = hmma_f16_exponent(v16[at]);
      }
  }

 private:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index rows) const override;

  const Sage1Params p;
  const AttentionMask& mask;
  const Eigen::Index lq, lk, d, dv;
  std::unique_ptr<IntMatmulAbt> qk;  // Q^ K^T, a block of rows at a time (it holds the codes)
  std::vector<float> q_scale, k_scale, v16;
  std::vector<std::int8_t> v16e;
};

AttentionResult Sage1Call::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  const bool unmasked = mask.empty();
  const RowMatrixXb visible = unmasked ? RowMatrixXb() : mask.rows(r0, rows, lq).visible(rows, lk);
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  const Eigen::Index bk = p.block_k;
  // pad=upstream: the keys of the last block past L_k exist, with logit 0 and V = 0
  const Eigen::Index lk_padded = p.pad_upstream ? (lk + bk - 1) / bk * bk : lk;
  const Eigen::Index blocks = (lk_padded + bk - 1) / bk;
  // Rows go in chunks: each key block serves every row of the chunk before the next block, so the block's V16
  // stays in cache. Each row's operations, and their order, are those of the row alone.
  constexpr Eigen::Index kChunkRows = 32;
  RowMatrixXf s(kChunkRows, lk_padded), p16(kChunkRows, lk_padded), acc(kChunkRows, dv), m_block(kChunkRows, blocks);
  std::vector<float> m(kChunkRows), l(kChunkRows), block(static_cast<std::size_t>(dv));
  std::vector<char> any(kChunkRows);
  for (Eigen::Index c0 = r0; c0 < r0 + rows; c0 += kChunkRows) {
    const Eigen::Index n = std::min(kChunkRows, r0 + rows - c0);
    const RowMatrixXi32 a = qk->rows(c0, n);  // exact
    // (3) base-2 logits
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, at = i - r0;
      const float sq = q_scale[static_cast<std::size_t>(i / p.block_q)];
      for (Eigen::Index j = 0; j < lk; ++j) {
        if (!unmasked && !visible(at, j)) {
          s(t, j) = kNegInf;
          continue;
        }
        s(t, j) = static_cast<float>(a(t, j)) * sq * k_scale[static_cast<std::size_t>(j / bk)];
        if (!std::isfinite(s(t, j))) throw_logit_overflow("sage1", "float32", i, j);
      }
      for (Eigen::Index j = lk; j < lk_padded; ++j) s(t, j) = 0.0f;
    }
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 1.0f);  // as upstream; the first block's rescale is 0
    std::fill(any.begin(), any.end(), 0);
    acc.setZero();
    // (4)-(5) online softmax over key blocks
    for (Eigen::Index b = 0; b < blocks; ++b) {
      const Eigen::Index b0 = b * bk, b1 = std::min(lk_padded, b0 + bk);
      const Eigen::Index real_end = std::min(lk, b1);  // padded keys have V = 0: their products vanish
      for (Eigen::Index t = 0; t < n; ++t) {
        const float* sr = &s(t, 0);
        float* pr = &p16(t, 0);
        float m_new = m[t];
        for (Eigen::Index j = b0; j < b1; ++j) m_new = std::max(m_new, sr[j]);
        m_block(t, b) = m_new;
        if (m_new == kNegInf) continue;  // nothing visible yet (the official kernel would form NaN here)
        any[t] = 1;
        float l_blk = 0;
        for (Eigen::Index j = b0; j < b1; ++j) {
          const float pt = exp2_f32(sr[j] - m_new);  // exp2(-inf) = 0 on masked pairs
          l_blk += pt;
          pr[j] = static_cast<float>(round_to_binary16(pt));
        }
        const float alpha = exp2_f32(m[t] - m_new);
        l[t] = l[t] * alpha + l_blk;
        float* o = &acc(t, 0);
        for (Eigen::Index c = 0; c < dv; ++c) o[c] *= alpha;
        if (p.accumulation == Sage1Accumulation::f16) {
          std::fill(block.begin(), block.end(), 0.0f);
          for (Eigen::Index s0 = b0; s0 < real_end; s0 += kStep)
            hmma_f16_acc16_step(block.data(), pr + s0, static_cast<std::size_t>(std::min(kStep, real_end - s0)),
                                v16.data() + s0 * dv, v16e.data() + s0 * dv, static_cast<std::size_t>(dv),
                                static_cast<std::size_t>(dv));
          for (Eigen::Index c = 0; c < dv; ++c) o[c] += block[c];
        } else {
          for (Eigen::Index c = 0; c < dv; ++c) {
            float x = o[c];
            for (Eigen::Index j = b0; j < real_end; ++j) x += pr[j] * v16[static_cast<std::size_t>(j * dv + c)];
            o[c] = x;
          }
        }
        m[t] = m_new;
      }
    }
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, at = i - r0;
      if (!any[t]) continue;  // fully masked row: O = 0, P = 0
      for (Eigen::Index c = 0; c < dv; ++c) {
        const float o = acc(t, c) / l[t];
        if (!std::isfinite(o))
          throw InputError("V", "values",
                           "row " + std::to_string(i) + ": P V overflows sage1's FP16 accumulator (a block's sum "
                           "beyond 65504); the kernel would return inf there (docs/pipelines/sage1.md)");
        r.o(at, c) = p.output_fp16 ? round_to_binary16(o) : o;
      }
      // P: P16 2^(m_block - m) / l, the factor once per key block (the same bits as per key)
      for (Eigen::Index b = 0; b < blocks; ++b) {
        if (m_block(t, b) == kNegInf) continue;
        const double e = std::exp2(static_cast<double>(m_block(t, b)) - m[t]);
        for (Eigen::Index j = b * bk; j < std::min(lk, (b + 1) * bk); ++j)
          if (s(t, j) != kNegInf && p16(t, j) != 0) r.p(at, j) = p16(t, j) * e / l[t];
      }
    }
  }
  return r;
}

}  // namespace

AttentionResult sage1_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const Sage1Params& p) {
  if (q.rows() == 0) return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  return prepare_sage1(q, k, v, scale, mask, p)->rows(0, q.rows());
}

std::unique_ptr<PreparedCall> prepare_sage1(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                            double scale, const AttentionMask& mask, const Sage1Params& p) {
  require_attention_shapes(q, k, v);
  return std::make_unique<Sage1Call>(q, k, v, scale, mask, p);
}

}  // namespace qattn::ref
