#include "qattn/reference/turbo.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace qattn::ref {
namespace {

// Compresses and dequantises rows [b0, b0 + m) of q8 in place (bits < 8), counting saturations.
void compress_rows(RowMatrixXi32& q8, Eigen::Index b0, Eigen::Index m, const TurboParams& p, int bits, TurboStats& st) {
  if (bits >= 8) return;
  Eigen::Index sat = 0;
  q8.middleRows(b0, m) = flashq_decompress(flashq_compress(q8.middleRows(b0, m), bits, p.int_scale), &sat);
  st.dequant_saturated += sat;
}

// INT8 blocks of B_c rows of x over [0, n), each with its own scale.
void prefill_blocks(const MatrixView& x, Eigen::Index n, Eigen::Index bc, int range, RowMatrixXi32& q8,
                    std::vector<double>& scales) {
  for (Eigen::Index b0 = 0; b0 < n; b0 += bc) {
    const Eigen::Index m = std::min(bc, n - b0);
    const FlashQBlock blk = flashq_quantize_block(x.middleRows(b0, m), range);
    q8.middleRows(b0, m) = blk.values;
    scales.push_back(blk.scale);
  }
}

void check_params(const TurboParams& p, int kv_bits) {
  if (p.block_r < 1 || p.block_c < 1 || p.buffer < 1) throw std::invalid_argument("turbo: block sizes must be >= 1");
  if (kv_bits != 8 && (kv_bits < 2 || kv_bits > 4))
    throw std::invalid_argument("turbo: kv bits must be 8, 4, 3 or 2, got " + std::to_string(kv_bits));
}

SasCubic cubic_of(const SasParams& s) {
  if (s.poly == kSasPaperPoly) return SasCubic::paper;
  if (s.poly == sas_lsq_poly()) return SasCubic::lsq;
  throw std::invalid_argument("turbo: the SAS cubic is neither the paper's nor the least-squares refit");
}

// Steps (6) and (7): the decode cache as the loop's key side. Blocks are the prefill blocks, then chunks of n_b
// buffer keys under the universal scales; the settled codes hold completed chunks compressed.
std::shared_ptr<const FlashKeyCodes> decode_cache(const MatrixView& k, const MatrixView& v, const TurboParams& p,
                                                  int kv_bits, TurboStats& st) {
  const Eigen::Index lk = k.rows(), pl = turbo_prefill_len(p, lk);
  if (pl < 1) throw std::invalid_argument("turbo decode: prefill-len must be >= 1 (the buffer's universal scale comes from it)");
  auto c = std::make_shared<FlashKeyCodes>();
  RowMatrixXi32 ks(lk, k.cols()), vs(lk, v.cols());
  // (6) prefill blocks, INT8 then compressed
  prefill_blocks(k, pl, p.block_c, p.int8_max, ks, c->k_scale);
  prefill_blocks(v, pl, p.block_c, p.int8_max, vs, c->v_scale);
  for (Eigen::Index b0 = 0; b0 < pl; b0 += p.block_c) {
    c->begin.push_back(b0);
    compress_rows(ks, b0, std::min(p.block_c, pl - b0), p, kv_bits, st);
    compress_rows(vs, b0, std::min(p.block_c, pl - b0), p, kv_bits, st);
  }
  // (7) the buffer under the universal scales; completed chunks compressed in the settled copy
  const double su_k = *std::max_element(c->k_scale.begin(), c->k_scale.end());
  const double su_v = *std::max_element(c->v_scale.begin(), c->v_scale.end());
  const Eigen::Index nb = lk - pl;
  Eigen::Index clamped_k = 0, clamped_v = 0;
  c->k_buffer = ks;
  c->v_buffer = vs;
  c->k_buffer.bottomRows(nb) = flashq_quantize_with_scale(k.bottomRows(nb), su_k, &clamped_k, p.int8_max);
  c->v_buffer.bottomRows(nb) = flashq_quantize_with_scale(v.bottomRows(nb), su_v, &clamped_v, p.int8_max);
  st.buffer_clamped += clamped_k + clamped_v;
  ks.bottomRows(nb) = c->k_buffer.bottomRows(nb);
  vs.bottomRows(nb) = c->v_buffer.bottomRows(nb);
  for (Eigen::Index c0 = pl; c0 < lk; c0 += p.buffer) {
    c->begin.push_back(c0);
    c->k_scale.push_back(su_k);
    c->v_scale.push_back(su_v);
    if (c0 + p.buffer > lk) continue;  // the trailing partial chunk is never compressed
    compress_rows(ks, c0, p.buffer, p, kv_bits, st);
    compress_rows(vs, c0, p.buffer, p, kv_bits, st);
  }
  c->begin.push_back(lk);
  c->k_settled = std::move(ks);
  c->v_settled = std::move(vs);
  c->settled_from = pl;
  c->chunk = p.buffer;
  return c;
}

std::unique_ptr<PreparedCall> prepare(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                      const AttentionMask& mask, const TurboParams& p, int kv_bits, TurboStats& st) {
  check_params(p, kv_bits);
  if (q.cols() != k.cols() || k.rows() != v.rows()) throw std::invalid_argument("turbo: shapes of q, k, v do not fit");
  const FlashKernel kernel = turbo_kernel(p);
  if (p.mode == TurboMode::prefill || q.rows() == 0 || k.rows() == 0) return prepare_flash(q, k, v, scale, mask, kernel);
  return prepare_flash(q, k, v, scale, mask, kernel, decode_cache(k, v, p, kv_bits, st));
}

}  // namespace

Eigen::Index turbo_prefill_len(const TurboParams& p, Eigen::Index lk) {
  if (p.prefill_len >= 0) return std::min(p.prefill_len, lk);
  return std::min(lk, p.block_c * std::max<Eigen::Index>(1, lk / (2 * p.block_c)));
}

FlashKernel turbo_kernel(const TurboParams& p) {
  FlashKernel k;
  k.name = "turbo";
  k.qk.format = KernelFormat::int8;
  k.qk.granularity = SageGranularity::block;
  k.qk.groups.block_q = p.mode == TurboMode::decode ? 1 : static_cast<int>(p.block_r);
  k.qk.groups.block_k = static_cast<int>(p.block_c);
  k.qk.scale = ScaleRule::amax;
  k.qk.arith = ScaleArith::f64;
  k.qk.rounding = QuantRounding::half_even;
  k.qk.smooth_k = false;
  k.qk.unit = SUnit::exact;
  k.qk.max = p.int8_max;
  k.v.format = KernelFormat::int8;
  k.v.scale = VScale::block;
  k.v.arith = ScaleArith::f64;
  k.v.max = p.int8_max;
  k.softmax.scale_at = ScaleAt::dequant;
  k.softmax.base = SoftmaxBase::e;
  k.softmax.exp = p.exact_exp ? ExpImpl::f64_rounded : ExpImpl::sas;
  k.softmax.row_sum_update = RowSumUpdate::block;
  k.softmax.sas_nr = p.sas.n_r;
  k.softmax.sas_poly = cubic_of(p.sas);
  k.softmax.sas_half = p.sas.half;
  k.p.format = KernelFormat::int8;
  k.p.max = p.int8_max;
  k.pv.unit = PvUnit::exact;
  k.pv.promote_keys = static_cast<int>(p.block_c);
  k.keys.block = static_cast<int>(p.block_c);
  k.output.finalize = Finalize::divide;
  k.output.p_from = PFrom::rescales;
  return k;
}

AttentionResult turbo_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const TurboParams& p, int kv_bits, TurboStats* stats) {
  TurboStats st;
  const std::unique_ptr<PreparedCall> call = prepare(q, k, v, scale, mask, p, kv_bits, st);
  if (stats) *stats = st;
  if (q.rows() == 0) return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  return call->rows(0, q.rows());
}

std::unique_ptr<PreparedCall> prepare_turbo(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const TurboParams& p, int kv_bits) {
  TurboStats st;
  return prepare(q, k, v, scale, mask, p, kv_bits, st);
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
