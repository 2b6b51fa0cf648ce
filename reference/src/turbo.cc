#include "qattn/reference/turbo.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace qattn::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The key side of one call as INT8 blocks: block b is rows [begin[b], begin[b + 1]) with scales k_scale[b], v_scale[b].
// Row i of the queries reads keys j < split[i] from the "settled" matrices and j >= split[i] from the "buffer" ones
// (decode: chunks compressed by the time the query arrives vs. the raw INT8 buffer; prefill: the settled ones only).
// Every entry is an INT8 code or a dequantised value clamped to [-128, 127] (flashq_decompress): held as int8.
using RowMatrixXi8 = Eigen::Matrix<std::int8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
struct KeyBlocks {
  std::vector<Eigen::Index> begin;
  std::vector<double> k_scale, v_scale;
  RowMatrixXi8 k_settled, v_settled, k_buffer, v_buffer;
};

RowMatrixXi8 to_int8(const RowMatrixXi32& x) {
  if (x.size() && (x.minCoeff() < -128 || x.maxCoeff() > 127))
    throw std::logic_error("turbo: a K/V block entry leaves int8");  // not reached: codes and clamped values
  return x.cast<std::int8_t>();
}

double sas_or_exp(double y, const TurboParams& p) { return p.exact_exp ? std::exp(-y) : sas_exp(y, p.sas); }

// Steps (2)-(5) for the query rows r0 .. r0 + rows - 1 of a block's result r (and of its visible and split),
// quantised together (q8 rows 0.., scale s_q); row_base + r0 + i is the call's row, for error messages.
void attend_rows(const RowMatrixXi32& q8, double s_q, Eigen::Index r0, const KeyBlocks& kb,
                 const std::vector<Eigen::Index>& split, const RowMatrixXb& visible, double scale, const TurboParams& p,
                 AttentionResult& r, Eigen::Index row_base) {
  const Eigen::Index rows = q8.rows(), d = q8.cols(), dv = kb.v_settled.cols();
  const std::size_t blocks = kb.begin.size() - 1;
  std::vector<float> m(rows, kNegInf), l(rows, 0.0f);
  std::vector<float> out(static_cast<std::size_t>(rows * dv), 0.0f);
  std::vector<std::vector<float>> rescales(rows, std::vector<float>(blocks, 1.0f));
  for (std::size_t b = 0; b < blocks; ++b) {
    const Eigen::Index b0 = kb.begin[b], b1 = kb.begin[b + 1], n = b1 - b0;
    const float alpha = static_cast<float>(s_q * kb.k_scale[b] * scale);
    // (2) logits and (3) the running max
    std::vector<float> s(static_cast<std::size_t>(rows * n), kNegInf), pt(s.size(), 0.0f);
    std::vector<float> m_new(m);
    for (Eigen::Index i = 0; i < rows; ++i)
      for (Eigen::Index j = b0; j < b1; ++j) {
        if (!visible(r0 + i, j)) continue;
        const RowMatrixXi8& kk = j < split[r0 + i] ? kb.k_settled : kb.k_buffer;
        std::int64_t a = 0;
        for (Eigen::Index t = 0; t < d; ++t) a += std::int64_t{q8(i, t)} * kk(j, t);
        const float x = static_cast<float>(a) * alpha;
        if (!std::isfinite(x)) throw_logit_overflow("turbo", "float32", row_base + r0 + i, j);
        s[i * n + (j - b0)] = x;
        m_new[i] = std::max(m_new[i], x);
      }
    // (3) P~, the rescale and the row sum; the tile maximum for (4)
    float tile_max = 0;
    std::vector<float> rescale(rows, 0.0f);
    for (Eigen::Index i = 0; i < rows; ++i) {
      if (m_new[i] == kNegInf) continue;  // nothing visible in this row yet
      rescale[i] = m[i] == kNegInf ? 0.0f : static_cast<float>(sas_or_exp(static_cast<double>(m_new[i] - m[i]), p));
      float sum = 0;
      for (Eigen::Index j = 0; j < n; ++j) {
        const float x = s[i * n + j];
        if (x == kNegInf) continue;
        const float e = static_cast<float>(sas_or_exp(static_cast<double>(m_new[i] - x), p));
        pt[i * n + j] = e;
        sum += e;
        tile_max = std::max(tile_max, e);
      }
      l[i] = l[i] * rescale[i] + sum;
      rescales[i][b] = rescale[i];
    }
    // (4) the tile's P~ to [0, R]
    const double s_p = static_cast<double>(tile_max) / p.int8_max;  // in double
    // (5) integer P V per row and channel, rescaled fp32 accumulation
    for (Eigen::Index i = 0; i < rows; ++i) {
      if (m_new[i] == kNegInf) continue;
      std::vector<std::int32_t> p8(n, 0);
      for (Eigen::Index j = 0; j < n; ++j) {
        if (tile_max > 0)
          p8[j] = static_cast<std::int32_t>(std::clamp(std::nearbyint(pt[i * n + j] / s_p), 0.0, double(p.int8_max)));
        r.p(r0 + i, b0 + j) = p8[j] * s_p;  // the block's weight before later rescales and the division by l
      }
      const double pv_scale = s_p * kb.v_scale[b];
      for (Eigen::Index c = 0; c < dv; ++c) {
        std::int64_t acc = 0;
        for (Eigen::Index j = 0; j < n; ++j) {
          if (p8[j] == 0) continue;
          const RowMatrixXi8& vv = b0 + j < split[r0 + i] ? kb.v_settled : kb.v_buffer;
          acc += std::int64_t{p8[j]} * vv(b0 + j, c);
        }
        float& o = out[i * dv + c];
        o = o * rescale[i] + static_cast<float>(static_cast<double>(acc) * pv_scale);
      }
      m[i] = m_new[i];
    }
  }
  for (Eigen::Index i = 0; i < rows; ++i) {
    if (l[i] == 0) {  // fully masked row: O = 0, P = 0
      r.p.row(r0 + i).setZero();
      continue;
    }
    for (Eigen::Index c = 0; c < dv; ++c) r.o(r0 + i, c) = out[i * dv + c] / l[i];
    // effective probabilities: each block's weight times the rescales applied after it, over l
    double later = 1.0;
    for (std::size_t b = blocks; b-- > 0;) {
      for (Eigen::Index j = kb.begin[b]; j < kb.begin[b + 1]; ++j) r.p(r0 + i, j) *= later / l[i];
      later *= rescales[i][b];
    }
  }
}

// INT8 blocks of B_c rows of x over [0, n) (prefill), each with its own scale.
void prefill_blocks(const MatrixView& x, Eigen::Index n, Eigen::Index bc, int range, RowMatrixXi32& q8,
                    std::vector<double>& scales) {
  for (Eigen::Index b0 = 0; b0 < n; b0 += bc) {
    const Eigen::Index m = std::min(bc, n - b0);
    const FlashQBlock blk = flashq_quantize_block(x.middleRows(b0, m), range);
    q8.middleRows(b0, m) = blk.values;
    scales.push_back(blk.scale);
  }
}

// Compresses and dequantises rows [b0, b0 + m) of q8 in place (bits < 8), counting saturations.
void compress_rows(RowMatrixXi32& q8, Eigen::Index b0, Eigen::Index m, const TurboParams& p, int bits, TurboStats& st) {
  if (bits >= 8) return;
  Eigen::Index sat = 0;
  q8.middleRows(b0, m) = flashq_decompress(flashq_compress(q8.middleRows(b0, m), bits, p.int_scale), &sat);
  st.dequant_saturated += sat;
}

void check_params(const TurboParams& p, int kv_bits) {
  if (p.block_r < 1 || p.block_c < 1 || p.buffer < 1) throw std::invalid_argument("turbo: block sizes must be >= 1");
  if (kv_bits != 8 && (kv_bits < 2 || kv_bits > 4))
    throw std::invalid_argument("turbo: kv bits must be 8, 4, 3 or 2, got " + std::to_string(kv_bits));
}

}  // namespace

Eigen::Index turbo_prefill_len(const TurboParams& p, Eigen::Index lk) {
  if (p.prefill_len >= 0) return std::min(p.prefill_len, lk);
  return std::min(lk, p.block_c * std::max<Eigen::Index>(1, lk / (2 * p.block_c)));
}

namespace {

// One call prepared: the key side (steps (1), (6), (7)) once, then any block of query rows. Prefill quantises Q in
// blocks of B_r rows from the block's first row, so blocks whose first row is a multiple of B_r (the traits'
// query_block_rows) give the rows of the whole call.
class TurboCall final : public PreparedCall {
 public:
  TurboCall(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale, const AttentionMask& mask,
            const TurboParams& p, int kv_bits)
      : PreparedCall(q.rows()), q_(q), scale_(scale), mask_(mask), p_(p), lk_(k.rows()), dv_(v.cols()) {
    check_params(p, kv_bits);
    if (q.cols() != k.cols() || k.rows() != v.rows()) throw std::invalid_argument("turbo: shapes of q, k, v do not fit");
    if (q.rows() == 0 || lk_ == 0) return;
    const Eigen::Index d = k.cols();
    RowMatrixXi32 ks(lk_, d), vs(lk_, dv_), kbuf, vbuf;  // settled and buffer, held as int8 from the end
    if (p.mode == TurboMode::prefill) {
      // (1): key blocks of B_c, INT8 each; the cache compression does not enter the prefill attention. Every query
      // reads the settled matrices (split = L_k), so no buffer is held.
      prefill_blocks(k, lk_, p.block_c, p.int8_max, ks, kb_.k_scale);
      prefill_blocks(v, lk_, p.block_c, p.int8_max, vs, kb_.v_scale);
      for (Eigen::Index b0 = 0; b0 < lk_; b0 += p.block_c) kb_.begin.push_back(b0);
      kb_.begin.push_back(lk_);
      kb_.k_settled = to_int8(ks);
      kb_.v_settled = to_int8(vs);
      return;
    }
    pl_ = turbo_prefill_len(p, lk_);
    if (pl_ < 1) throw std::invalid_argument("turbo decode: prefill-len must be >= 1 (the buffer's universal scale comes from it)");
    // (6) prefill blocks, INT8 then compressed
    prefill_blocks(k, pl_, p.block_c, p.int8_max, ks, kb_.k_scale);
    prefill_blocks(v, pl_, p.block_c, p.int8_max, vs, kb_.v_scale);
    for (Eigen::Index b0 = 0; b0 < pl_; b0 += p.block_c) {
      kb_.begin.push_back(b0);
      compress_rows(ks, b0, std::min(p.block_c, pl_ - b0), p, kv_bits, stats_);
      compress_rows(vs, b0, std::min(p.block_c, pl_ - b0), p, kv_bits, stats_);
    }
    // (7) the buffer under the universal scales; completed chunks compressed in the settled copy
    const double su_k = *std::max_element(kb_.k_scale.begin(), kb_.k_scale.end());
    const double su_v = *std::max_element(kb_.v_scale.begin(), kb_.v_scale.end());
    const Eigen::Index nb = lk_ - pl_;
    Eigen::Index clamped_k = 0, clamped_v = 0;
    kbuf = ks;
    vbuf = vs;
    kbuf.bottomRows(nb) = flashq_quantize_with_scale(k.bottomRows(nb), su_k, &clamped_k, p.int8_max);
    vbuf.bottomRows(nb) = flashq_quantize_with_scale(v.bottomRows(nb), su_v, &clamped_v, p.int8_max);
    stats_.buffer_clamped += clamped_k + clamped_v;
    ks.bottomRows(nb) = kbuf.bottomRows(nb);
    vs.bottomRows(nb) = vbuf.bottomRows(nb);
    for (Eigen::Index c0 = pl_; c0 < lk_; c0 += p.buffer) {
      kb_.begin.push_back(c0);
      kb_.k_scale.push_back(su_k);
      kb_.v_scale.push_back(su_v);
      if (c0 + p.buffer > lk_) continue;  // the trailing partial chunk is never compressed
      compress_rows(ks, c0, p.buffer, p, kv_bits, stats_);
      compress_rows(vs, c0, p.buffer, p, kv_bits, stats_);
    }
    kb_.begin.push_back(lk_);
    kb_.k_settled = to_int8(ks);
    kb_.v_settled = to_int8(vs);
    kb_.k_buffer = to_int8(kbuf);
    kb_.v_buffer = to_int8(vbuf);
  }

  const TurboStats& stats() const { return stats_; }

 protected:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const override {
    AttentionResult r;
    r.o = RowMatrixXd::Zero(n, dv_);
    r.p = RowMatrixXd::Zero(n, lk_);
    if (lk_ == 0) return r;
    const AttentionMask mask = mask_.rows(r0, n, query_rows());
    const RowMatrixXb visible = mask.empty() ? RowMatrixXb::Constant(n, lk_, true) : mask.visible(n, lk_);
    std::vector<Eigen::Index> split(static_cast<std::size_t>(n), lk_);
    if (p_.mode == TurboMode::prefill) {
      for (Eigen::Index i0 = 0; i0 < n; i0 += p_.block_r) {
        const Eigen::Index m = std::min(p_.block_r, n - i0);
        const FlashQBlock qb = flashq_quantize_block(q_.middleRows(r0 + i0, m), p_.int8_max);
        attend_rows(qb.values, qb.scale, i0, kb_, split, visible, scale_, p_, r, r0);
      }
      return r;
    }
    // (8) one decode step per query row
    for (Eigen::Index i = 0; i < n; ++i) {
      Eigen::Index seen = 0;
      for (Eigen::Index j = lk_; j-- > 0;)
        if (visible(i, j)) {
          seen = j + 1;
          break;
        }
      split[static_cast<std::size_t>(i)] = seen <= pl_ ? pl_ : pl_ + p_.buffer * ((seen - pl_) / p_.buffer);
      const FlashQBlock qb = flashq_quantize_block(q_.row(r0 + i), p_.int8_max);
      attend_rows(qb.values, qb.scale, i, kb_, split, visible, scale_, p_, r, r0);
    }
    return r;
  }

 private:
  const MatrixView q_;
  const double scale_;
  const AttentionMask& mask_;
  const TurboParams p_;
  const Eigen::Index lk_, dv_;
  Eigen::Index pl_ = 0;  // decode: the prefill length P
  KeyBlocks kb_;
  TurboStats stats_;
};

}  // namespace

AttentionResult turbo_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const TurboParams& p, int kv_bits, TurboStats* stats) {
  const TurboCall call(q, k, v, scale, mask, p, kv_bits);
  if (stats) *stats = call.stats();
  if (q.rows() == 0) return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  return call.rows(0, q.rows());
}

std::unique_ptr<PreparedCall> prepare_turbo(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const TurboParams& p, int kv_bits) {
  return std::make_unique<TurboCall>(q, k, v, scale, mask, p, kv_bits);
}

std::vector<AttentionResult> turbo_attention_heads(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                                   const std::vector<MatrixView>& v, double scale,
                                                   const AttentionMask& mask, const TurboParams& p) {
  if (q.size() != k.size() || k.size() != v.size()) throw std::invalid_argument("turbo: head counts of q, k, v differ");
  std::vector<double> priority;
  for (std::size_t h = 0; h < k.size(); ++h) priority.push_back(flashq_head_priority(k[h], v[h], p.priority));
  const std::vector<int> bits = flashq_head_bits(priority, p.heads_2bit, 2, p.kv_bits);
  std::vector<AttentionResult> out;
  for (std::size_t h = 0; h < q.size(); ++h) out.push_back(turbo_attention(q[h], k[h], v[h], scale, mask, p, bits[h]));
  return out;
}

}  // namespace qattn::ref
