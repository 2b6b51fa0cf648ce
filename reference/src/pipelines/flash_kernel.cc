#include "qattn/reference/flash_kernel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "flash_row_loop.h"
#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"

namespace qattn::ref {

const MmaModel* pv_column_model(PvUnit unit) {
  switch (unit) {
    case PvUnit::h100_mma_e4m3: return &mma_preset("h100-mma-e4m3");

    default: return nullptr;
  }
}

float fa4_ex2_emulation(float x) {
  constexpr float c1 = 0x1.63ea32p-1f, c2 = 0x1.d20d48p-3f, c3 = 0x1.3be13ap-4f;
  if (x > 127.0f) return std::numeric_limits<float>::infinity();  // beyond FA4's domain: as the hardware's exp2
  if (std::fabs(x) < 0x1p-126f) x = 0.0f;
  x = std::fmax(x, -127.0f);
  const float n = std::floor(x);  // RD(x + 1.5 2^23) - 1.5 2^23, exact for |x| < 2^22
  const float f = x - n;          // exact, in [0, 1)
  const float p = std::fma(std::fma(std::fma(c3, f, c2), f, c1), f, 1.0f);
  const std::uint32_t bits =
      std::bit_cast<std::uint32_t>(p) + (static_cast<std::uint32_t>(static_cast<std::int32_t>(n)) << 23);
  return (bits & 0x7f800000u) == 0 ? 0.0f : std::bit_cast<float>(bits);
}

namespace flash_detail {

// The row sum over a block's values pr[b0, b1) into the row's partial sums `into`: each thread's columns in order
// ((j - b0) mod 8) / 2, or per 16-column tile of the mma layout, ((P_2t + P_2t+1) + P_8+2t) + P_8+2t+1 added at once
void row_sum(const FlashKernel::Softmax& sm, const float* pr, Eigen::Index b0, Eigen::Index b1, std::array<float, 4>& into) {
  const int threads = sm.row_sum_threads;
  if (sm.row_sum_tile == RowSumTile::lanes8) {  // FlashAttention-4's fadd_reduce, l r in lane 0
    std::array<float, 8> lane{};
    lane[0] = into[0];
    for (Eigen::Index j = b0; j < b1; ++j) lane[static_cast<std::size_t>((j - b0) % 8)] += pr[j];
    into[0] = ((lane[0] + lane[2]) + (lane[4] + lane[6])) + ((lane[1] + lane[3]) + (lane[5] + lane[7]));
  } else if (threads == 1) {
    for (Eigen::Index j = b0; j < b1; ++j) into[0] += pr[j];
  } else if (sm.row_sum_tile == RowSumTile::octets32) {
    for (Eigen::Index j = b0; j < b1; ++j) into[static_cast<std::size_t>((j - b0) % 32 / 8)] += pr[j];
  } else if (sm.row_sum_tile == RowSumTile::column) {
    for (Eigen::Index j = b0; j < b1; ++j) into[static_cast<std::size_t>((j - b0) % 8 / 2)] += pr[j];
  } else {
    const auto at_or_0 = [&](Eigen::Index j) { return j < b1 ? pr[j] : 0.0f; };
    for (Eigen::Index j0 = b0; j0 < b1; j0 += 16)
      for (int th = 0; th < 4; ++th) {
        const Eigen::Index c = j0 + 2 * th;
        into[static_cast<std::size_t>(th)] += ((at_or_0(c) + at_or_0(c + 1)) + at_or_0(c + 8)) + at_or_0(c + 9);
      }
  }
}

// S on b200-nvf4: per key tile, each group's exact sums (a float GEMM of the small integers), then d in steps of 64
// (4 groups) from C = Delta S (raw, float32) or 0.
void FlashCall::nvfp4_logits(Eigen::Index c0, Eigen::Index n, RowMatrixXf& s) const {
  constexpr Eigen::Index kKeyTile = 512, kStepGroups = 4;
  const Eigen::Index groups = q4.cols() / 16;  // d in whole blocks
  std::vector<RowMatrixXf> sums(static_cast<std::size_t>(groups));
  std::vector<double> term(static_cast<std::size_t>(kStepGroups * kKeyTile));
  std::vector<std::int32_t> term_e(term.size());
  for (Eigen::Index k0 = 0; k0 < lk; k0 += kKeyTile) {
    const Eigen::Index cols = std::min(kKeyTile, lk - k0);
    for (Eigen::Index g = 0; g < groups; ++g)
      sums[static_cast<std::size_t>(g)].noalias() = q4.block(c0, g * 16, n, 16) * k4.block(k0, g * 16, cols, 16).transpose();
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t;
      float* acc = &s(t, k0);
      if (f.qk.smooth_q) {  // Delta S = mean_b K'_j, raw (its scale enters with S's), as the first step's C
        const auto mean = q_block_mean.row(i / f.qk.groups.block_q);
        for (Eigen::Index j = 0; j < cols; ++j) acc[j] = static_cast<float>(delta_s_dot(mean, k0 + j));
      } else {
        std::fill(acc, acc + cols, 0.0f);
      }
      for (Eigen::Index g0 = 0; g0 < groups; g0 += kStepGroups) {
        const Eigen::Index ng = std::min(kStepGroups, groups - g0);
        for (Eigen::Index g = 0; g < ng; ++g) {
          const float qs = q4_scale(i, g0 + g);
          nvf4_terms(&sums[static_cast<std::size_t>(g0 + g)](t, 0), qs, qs == 0 ? -100000 : q4_exp(i, g0 + g),
                     &k4_scale_t(g0 + g, k0), &k4_exp_t(g0 + g, k0), term.data() + g * cols, term_e.data() + g * cols,
                     static_cast<std::size_t>(cols));
        }
        scaled_group_step(acc, term.data(), term_e.data(), static_cast<std::size_t>(ng), static_cast<std::size_t>(cols),
                          static_cast<std::size_t>(cols));
      }
    }
  }
}

void FlashCall::logits(Eigen::Index c0, Eigen::Index n, RowMatrixXf& s, const std::vector<Eigen::Index>& split) const {
  if (f.qk.format == KernelFormat::nvfp4 || f.qk.format == KernelFormat::mxfp4) {
    nvfp4_logits(c0, n, s);
    return;
  }
  if (f.qk.format == KernelFormat::e4m3) {  // an FP8 unit: d in steps of 32 from zero, each output alone
    constexpr Eigen::Index kKeyTile = 512;
    constexpr std::size_t kStep = 32;
    std::array<float, 256> q_row;  // d <= 256 (the constructor's check)
    std::array<std::int8_t, 256> q_row_e;
    std::vector<float> k_tile(static_cast<std::size_t>(d * kKeyTile));
    std::vector<std::int8_t> k_tile_e(k_tile.size());
    s.topRows(n).setZero();
    for (Eigen::Index k0 = 0; k0 < lk; k0 += kKeyTile) {
      const auto cols = static_cast<std::size_t>(std::min(kKeyTile, lk - k0));
      for (Eigen::Index c = 0; c < d; ++c)
        e4m3_decode(k8t_codes.data() + c * lk + k0, cols, k_tile.data() + c * kKeyTile, k_tile_e.data() + c * kKeyTile);
      for (Eigen::Index t = 0; t < n; ++t) {
        e4m3_decode(q8_codes.data() + (c0 + t) * d, static_cast<std::size_t>(d), q_row.data(), q_row_e.data());
        for (Eigen::Index d0 = 0; d0 < d; d0 += static_cast<Eigen::Index>(kStep))
          (f.qk.unit == SUnit::b200_tcgen05_e4m3 ? tcgen05_e4m3_step : wgmma_e4m3_step)(&s(t, k0), q_row.data() + d0, static_cast<std::size_t>(std::min<Eigen::Index>(kStep, d - d0)),
                          k_tile.data() + d0 * kKeyTile, k_tile_e.data() + d0 * kKeyTile,
                          static_cast<std::size_t>(kKeyTile), cols);
      }
    }
    return;
  }
  RowMatrixXi32 a = qk->rows(c0, n);  // exact
  if (buffered) {  // keys from the row's split on: the buffer's codes
    const RowMatrixXi32 a2 = qk_buffer->rows(c0, n);
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index from = split[static_cast<std::size_t>(t)];
      a.row(t).tail(lk - from) = a2.row(t).tail(lk - from);
    }
  }
  std::vector<float> factor(kq.scales.size());
  std::vector<float> delta_s(f.qk.smooth_q ? static_cast<std::size_t>(lk) : 0);
  Eigen::Index delta_block = -1;
  const bool sequential = f.softmax.scale_at == ScaleAt::q;
  const bool raw = f.softmax.scale_at == ScaleAt::exp;  // S = fl32(A), its scale in the exponent
  const double log2e = f.softmax.base == SoftmaxBase::two ? std::numbers::log2e : 1.0;
  for (Eigen::Index t = 0; t < n; ++t) {
    const Eigen::Index i = c0 + t;
    const double sqi = qq.scales[static_cast<std::size_t>(qq.group[static_cast<std::size_t>(i)])];
    if (raw) {
      for (Eigen::Index j = 0; j < lk; ++j) s(t, j) = static_cast<float>(a(t, j));
      continue;
    }
    if (!sequential)
      for (std::size_t g = 0; g < kq.scales.size(); ++g)
        factor[g] = static_cast<float>(log2e == 1.0 ? sqi * kq.scales[g] * scale : sqi * kq.scales[g] * scale * log2e);
    if (f.qk.smooth_q && i / f.qk.groups.block_q != delta_block) {  // Delta S of the block, fp32
      delta_block = i / f.qk.groups.block_q;
      const auto mean = q_block_mean.row(delta_block);
      for (Eigen::Index j = 0; j < lk; ++j) {
        delta_s[static_cast<std::size_t>(j)] = static_cast<float>(delta_s_dot(mean, j) * scale * log2e);
      }
    }
    const float sqf = static_cast<float>(sqi);
    for (Eigen::Index j = 0; j < lk; ++j) {
      const std::size_t g = static_cast<std::size_t>(kq.group[static_cast<std::size_t>(j)]);
      float x = sequential ? static_cast<float>(a(t, j)) * sqf * static_cast<float>(kq.scales[g])
                           : static_cast<float>(a(t, j)) * factor[g];
      if (f.qk.smooth_q) x += delta_s[static_cast<std::size_t>(j)];
      s(t, j) = x;
    }
  }
}


FlashCall::RowLoop::RowLoop(const FlashCall& c, Eigen::Index r0_, Eigen::Index rows_)
    : call(c),
      f(c.f),
      sm(c.f.softmax),
      r0(r0_),
      rows(rows_),
      lk(c.lk),
      dv(c.dv),
      unmasked(c.mask.empty()),
      tiled(f.p.max > 0),
      tile_rows(tiled ? f.qk.groups.block_q : 1),
      first(r0 / tile_rows * tile_rows),
      last(std::min(c.lq, (r0 + rows + tile_rows - 1) / tile_rows * tile_rows)),
      visible(unmasked ? RowMatrixXb() : c.mask.rows(first, last - first, c.lq).visible(last - first, lk)),
      bk(c.key_block),
      blocks(static_cast<Eigen::Index>(c.block_begin.size()) - 1),
      in_exp(sm.scale_at == ScaleAt::exp),
      scaled_max(sm.max_rule == MaxRule::scaled),
      grouped(c.s2_table.size() > 0),
      offset(static_cast<float>(f.p.offset)),
      p_scale(static_cast<float>(f.p.scale)),
      threshold(static_cast<float>(sm.rescale_threshold)),
      emu_freq(sm.ex2_emu_freq),
      threads(sm.row_sum_threads),
      promote_blocks(f.pv.promote_keys / bk),
      unit(f.pv.unit),
      codes_by_row(unit == PvUnit::h100_wgmma_e4m3 || unit == PvUnit::b200_tcgen05_e4m3 ||
                   unit == PvUnit::ada_mma_e4m3 || unit == PvUnit::ada_mma_e4m3_acc16),
      sas_exp(sm.exp == ExpImpl::sas),
      from_rescales(f.output.p_from == PFrom::rescales),
      running(sm.row_sum_update == RowSumUpdate::running),
      sum_unrounded(sm.row_sum_of == RowSumOf::unrounded),
      p_nvfp4(f.p.format == KernelFormat::nvfp4),
      chunk_rows(tiled ? std::min(tile_rows * std::max<Eigen::Index>(1, 64 / tile_rows),
                                  std::max<Eigen::Index>(1, last - first))
                 : c.lk_padded <= 8192 ? 64
                                       : 32) {
  const Eigen::Index lk_padded = c.lk_padded;
  s2_keys.resize(grouped ? static_cast<std::size_t>(lk_padded) : 0);
  s.resize(chunk_rows, lk_padded);
  p8.resize(chunk_rows, lk_padded);
  out.resize(chunk_rows, dv);
  buf.resize(chunk_rows, dv);
  ref_block.resize(chunk_rows, blocks);
  rescale_block.resize(from_rescales ? chunk_rows : 0, from_rescales ? blocks : 0);
  tile_scale.resize(tiled ? chunk_rows : 0, tiled ? blocks : 0);
  const auto rows_n = static_cast<std::size_t>(chunk_rows);
  m.resize(rows_n);
  m_next.resize(rows_n);
  rescale_of.resize(rows_n);
  l.resize(rows_n);
  part_of.resize(rows_n);
  any.resize(rows_n);
  active.resize(rows_n);
  split.assign(rows_n, lk);
  vb.resize(codes_by_row ? static_cast<std::size_t>(bk * dv) : 0);
  vbe.resize(vb.size());
  acc64.resize(unit == PvUnit::exact ? static_cast<std::size_t>(dv) : 0);
  p4.resize(p_nvfp4 ? chunk_rows : 0, p_nvfp4 ? lk_padded : 0);
  p4s.resize(p_nvfp4 ? chunk_rows : 0, p_nvfp4 ? blocks * bk / 16 : 0);
  nvf4_sum.resize(p_nvfp4 ? static_cast<std::size_t>(dv) : 0);
  nvf4_term.resize(p_nvfp4 ? static_cast<std::size_t>(4 * dv) : 0);
  nvf4_term_e.resize(nvf4_term.size());
}

// The bi-th key block of the loop (keys.order reverse: the last block first).
FlashCall::RowLoop::KeyBlock FlashCall::RowLoop::block_at(Eigen::Index bi) const {
  const Eigen::Index b = f.keys.order == KeyOrder::forward ? bi : blocks - 1 - bi;
  const Eigen::Index b0 = call.block_begin[static_cast<std::size_t>(b)];
  const Eigen::Index b1 = call.block_begin[static_cast<std::size_t>(b + 1)];
  const bool promote = promote_blocks > 0 && ((bi + 1) % promote_blocks == 0 || bi + 1 == blocks);
  return {b, b0, b1, std::min(lk, b1), promote};  // padded keys have V = 0: their products vanish
}

// (3) S of the chunk's rows [c0, c0 + n): a masked key -inf, a padded key 0; a logit beyond float32 (times s2 where
// the scale enters in the exponent) is refused. A buffered key side first sets each row's split.
void FlashCall::RowLoop::masked_logits(Eigen::Index c0, Eigen::Index n) {
  if (call.buffered)  // a decode step reads the chunks settled by the time its last visible key arrived
    for (Eigen::Index t = 0; t < n; ++t) {
      Eigen::Index seen = lk;
      if (!unmasked)
        for (seen = lk; seen > 0 && !visible(c0 + t - first, seen - 1);) --seen;
      const Eigen::Index from = call.settled_from;
      split[static_cast<std::size_t>(t)] = seen <= from ? from : from + call.chunk * ((seen - from) / call.chunk);
    }
  call.logits(c0, n, s, split);
  for (Eigen::Index t = 0; t < n; ++t) {
    const Eigen::Index i = c0 + t, row = i - first;
    float* sr = &s(t, 0);
    for (Eigen::Index j = 0; j < lk; ++j) {
      const float s2j = grouped ? call.s2_table(call.q_group_of[static_cast<std::size_t>(i)],
                                                call.k_group_of[static_cast<std::size_t>(j)])
                                : call.s2;
      if (!unmasked && !visible(row, j)) sr[j] = kNegInf;
      else if (!std::isfinite(in_exp ? sr[j] * s2j : sr[j])) throw_logit_overflow(f.name, "float32", i, j);
    }
    for (Eigen::Index j = lk; j < call.lk_padded; ++j) sr[j] = 0.0f;
  }
}

// Every row of a chunk starts with no max, a zero row sum and zero accumulators.
void FlashCall::RowLoop::start_chunk() {
  std::fill(m.begin(), m.end(), kNegInf);
  for (auto& x : l) x.fill(0.0f);
  std::fill(any.begin(), any.end(), 0);
  if (from_rescales) rescale_block.setOnes();
  out.setZero();
  buf.setZero();
}

// (4)-(5) one key block for every row of the chunk: (4) per row the max, the rescale and P~; P~'s tile scales;
// (5) per row P, the row sum and P V.
void FlashCall::RowLoop::key_block(Eigen::Index c0, Eigen::Index n, const KeyBlock& kb) {
  if (codes_by_row && kb.real_end > kb.b0)
    e4m3_decode(call.v_codes.data() + kb.b0 * dv, static_cast<std::size_t>((kb.real_end - kb.b0) * dv), vb.data(),
                vbe.data());
  for (Eigen::Index t = 0; t < n; ++t) max_rescale_and_p_tilde(t, c0 + t, kb);
  if (tiled) tile_scales(n, kb);
  for (Eigen::Index t = 0; t < n; ++t)
    if (active[t]) p_row_sum_and_pv(t, kb);
}

// (4) row t (query i): the running max joined with the block's (kept while its growth is within the rescale
// threshold), the rescale of the row's sum and accumulator, the exponent's reference, P~ into p8, and (row_sum_of
// unrounded) the row sum. A row with nothing visible yet stays inactive.
void FlashCall::RowLoop::max_rescale_and_p_tilde(Eigen::Index t, Eigen::Index i, const KeyBlock& kb) {
  active[t] = 0;
  const float* sr = &s(t, 0);
  float* pr = &p8(t, 0);
  if (grouped) {
    const int q_group = call.q_group_of[static_cast<std::size_t>(i)];
    for (Eigen::Index j = kb.b0; j < kb.b1; ++j)
      s2_keys[static_cast<std::size_t>(j)] =
          call.s2_table(q_group, call.k_group_of[static_cast<std::size_t>(std::min(j, lk - 1))]);
  }
  float m_new = block_max(sr, m[t], kb);
  if (m_new == kNegInf) {  // nothing visible yet
    ref_block(t, kb.b) = kNegInf;
    return;
  }
  const float s2 = call.s2;
  // the max is kept while its growth, in exponent units, is within the threshold (FA4); else it moves
  const bool raw_exp = in_exp && !scaled_max;  // m in raw S units: differences and the reference times s2
  if (threshold > 0 && m[t] != kNegInf && (raw_exp ? (m_new - m[t]) * s2 : m_new - m[t]) <= threshold) m_new = m[t];
  float rescale = 0;
  if (m[t] != kNegInf)
    rescale = m_new == m[t] && !sas_exp ? 1.0f : call.ex(raw_exp ? (m[t] - m_new) * s2 : m[t] - m_new);
  const float ref = raw_exp ? (sm.ref_rule == RefRule::fma ? std::fma(m_new, s2, -offset) : m_new * s2 - offset)
                    : scaled_max ? m_new
                                 : (offset != 0 ? m_new - offset : m_new);
  ref_block(t, kb.b) = ref;
  if (from_rescales) rescale_block(t, kb.b) = rescale;
  any[t] = 1;
  active[t] = 1;
  m_next[t] = m_new;
  rescale_of[t] = rescale;
  std::array<float, 4>& part = part_of[t];
  part.fill(0.0f);
  if (running)
    for (int th = 0; th < threads; ++th) l[t][static_cast<std::size_t>(th)] *= rescale;
  p_tilde(sr, pr, ref, kb);
  if (sum_unrounded) row_sum(sm, pr, kb.b0, kb.b1, running ? l[t] : part);
}

// The running max m_old joined with the block's: of raw S, or (max_rule scaled) of fma(S, s2, -offset) over the
// visible keys.
float FlashCall::RowLoop::block_max(const float* sr, float m_old, const KeyBlock& kb) const {
  float m_new = m_old;
  if (scaled_max) {
    for (Eigen::Index j = kb.b0; j < kb.b1; ++j)
      if (sr[j] != kNegInf) m_new = std::max(m_new, std::fma(sr[j], s2_of(j), -offset));
  } else {
    for (Eigen::Index j = kb.b0; j < kb.b1; ++j) m_new = std::max(m_new, sr[j]);
  }
  return m_new;
}

// P~ of the block's keys into pr: exp_b(fma(S, s2, -ref)) (the scale in the exponent) or exp_b(S - ref), times
// p.scale; 0 for a masked key.
void FlashCall::RowLoop::p_tilde(const float* sr, float* pr, float ref, const KeyBlock& kb) const {
  const Eigen::Index b0 = kb.b0, b1 = kb.b1;
  for (Eigen::Index j = b0; j < b1; ++j) {
    float pt = 0;
    if (sr[j] != kNegInf) {
      pt = call.ex(in_exp ? std::fma(sr[j], s2_of(j), -ref) : sr[j] - ref);
      if (p_scale != 1) pt *= p_scale;
    }
    pr[j] = pt;
  }
  // FlashAttention-4's software exp2 on its pairs, in a block whose keys are all visible and all real
  if (emu_freq > 0 && b0 + bk <= lk) {
    bool whole = true;
    for (Eigen::Index j = b0; j < b1 && whole; ++j) whole = sr[j] != kNegInf;
    const Eigen::Index fragments = bk / 32;
    for (Eigen::Index fr = sm.ex2_emu_start; whole && fr < fragments - 1; ++fr)
      for (Eigen::Index k = 0; k < 32; k += 2)
        if (k % emu_freq >= emu_freq - 4)
          for (const Eigen::Index j : {b0 + fr * 32 + k, b0 + fr * 32 + k + 1}) {
            float pt = fa4_ex2_emulation(std::fma(sr[j], s2_of(j), -ref));
            if (p_scale != 1) pt *= p_scale;
            pr[j] = pt;
          }
  }
}

// P~'s tiles (p.max): the largest P~ of the tile's rows, s_P = max / p.max in float64
void FlashCall::RowLoop::tile_scales(Eigen::Index n, const KeyBlock& kb) {
  for (Eigen::Index t0 = 0; t0 < n; t0 += tile_rows) {
    float tile_max = 0;
    for (Eigen::Index t = t0; t < std::min(n, t0 + tile_rows); ++t)
      if (active[t])
        for (Eigen::Index j = kb.b0; j < kb.b1; ++j) tile_max = std::max(tile_max, p8(t, j));
    for (Eigen::Index t = t0; t < std::min(n, t0 + tile_rows); ++t)
      tile_scale(t, kb.b) = static_cast<double>(tile_max) / f.p.max;
  }
}


// (6) row t (query i), when it is one of the rows asked for: the row sum combined over its threads, O = acc / l
// by output.finalize, and P as probabilities. A row with no visible key keeps O = 0, P = 0.
void FlashCall::RowLoop::finalize_row(Eigen::Index t, Eigen::Index i, AttentionResult& r) const {
  const Eigen::Index row = i - r0;
  if (!any[t] || i < r0 || i >= r0 + rows) return;  // no visible key: O = 0, P = 0; a tile's other rows
  const std::array<float, 4>& lt = l[t];
  const float sum = threads == 1 ? lt[0]
                    : sm.row_sum_combine == RowSumCombine::pairs_02_13 ? (lt[0] + lt[2]) + (lt[1] + lt[3])
                                                                      : (lt[0] + lt[1]) + (lt[2] + lt[3]);
  output_row(&out(t, 0), sum, i, row, r);
  probabilities_row(t, sum, row, r);
}

// O's row from the accumulator o and the row sum by output.finalize, then rounded to output.format.
void FlashCall::RowLoop::output_row(const float* o, float sum, Eigen::Index i, Eigen::Index row,
                                    AttentionResult& r) const {
  switch (f.output.finalize) {
    case Finalize::divide:
      for (Eigen::Index c = 0; c < dv; ++c) {
        const float x = o[c] / sum;
        if (!std::isfinite(x))
          throw InputError("V", "values",
                           "row " + std::to_string(i) + ": P V overflows " + f.name + "'s FP16 accumulator (a block's "
                           "sum beyond 65504); the kernel would return inf there (docs/kernels-as-data.md)");
        r.o(row, c) = x;
      }
      break;
    case Finalize::f64:
      for (Eigen::Index c = 0; c < dv; ++c)
        r.o(row, c) = static_cast<float>(o[c] * call.v_scale(c) / sum + call.v_mean(c));
      break;
    case Finalize::reciprocal: {
      const float os = (1.0f / sum) * call.v_descale;
      for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = o[c] * os;
      break;
    }
    case Finalize::reciprocal_channel: {  // fl32(fl32(O fl32(1 / l)) scale_c) (+ mean_c), float32
      const float inv = 1.0f / sum;
      for (Eigen::Index c = 0; c < dv; ++c) {
        float x = (o[c] * inv) * static_cast<float>(call.v_scale(c));
        if (f.v.smooth) x += static_cast<float>(call.v_mean(c));
        r.o(row, c) = x;
      }
      break;
    }
  }
  if (f.output.format == KernelFormat::fp16)
    for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = round_to_binary16(r.o(row, c));
  else if (f.output.format == KernelFormat::bf16)
    for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = round_to_bfloat16(r.o(row, c));
}

// P's row as probabilities: P8 base^(ref_block - ref_final) / l, the factor once per key block; the reference of the
// last block processed is the row's final one (the max only grows; a row's first visible block is processed before
// its last). p.from rescales: P8 s_P times the rescales applied after the block, over l.
void FlashCall::RowLoop::probabilities_row(Eigen::Index t, float sum, Eigen::Index row, AttentionResult& r) const {
  const auto keys_of = [&](Eigen::Index b) {  // the real keys of block b
    return std::pair{call.block_begin[static_cast<std::size_t>(b)],
                     std::min(lk, call.block_begin[static_cast<std::size_t>(b + 1)])};
  };
  if (from_rescales) {
    double later = 1.0;
    for (Eigen::Index bi = blocks; bi-- > 0;) {
      const Eigen::Index b = f.keys.order == KeyOrder::forward ? bi : blocks - 1 - bi;
      const double weight = tiled ? tile_scale(t, b) : 1.0;
      const auto [j0, j1] = keys_of(b);
      if (ref_block(t, b) != kNegInf)
        for (Eigen::Index j = j0; j < j1; ++j)
          if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(row, j) = (p8(t, j) * weight) * (later / sum);
      later *= rescale_block(t, b);
    }
    return;
  }
  const double final_ref = ref_block(t, f.keys.order == KeyOrder::forward ? blocks - 1 : 0);
  for (Eigen::Index b = 0; b < blocks; ++b) {
    if (ref_block(t, b) == kNegInf) continue;
    const double x = static_cast<double>(ref_block(t, b)) - final_ref;
    const double e = sm.base == SoftmaxBase::two ? std::exp2(x) : std::exp(x);
    const auto [j0, j1] = keys_of(b);
    for (Eigen::Index j = j0; j < j1; ++j)
      if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(row, j) = (tiled ? p8(t, j) * tile_scale(t, b) : p8(t, j)) * e / sum;
  }
}

// Steps (3)-(6) for query rows [r0, r0 + rows), in chunks of rows (RowLoop): S, then each key block in the loop's
// order, then each row's normalisation.
AttentionResult FlashCall::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  RowLoop loop(*this, r0, rows);
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  for (Eigen::Index c0 = loop.first; c0 < loop.last; c0 += loop.chunk_rows) {
    const Eigen::Index n = std::min(loop.chunk_rows, loop.last - c0);
    loop.masked_logits(c0, n);
    loop.start_chunk();
    for (Eigen::Index bi = 0; bi < loop.blocks; ++bi) loop.key_block(c0, n, loop.block_at(bi));
    for (Eigen::Index t = 0; t < n; ++t) loop.finalize_row(t, c0 + t, r);
  }
  return r;
}

}  // namespace flash_detail

using flash_detail::FlashCall;

int fa3_fp8_key_block(Eigen::Index head_dim) {
  return head_dim <= 64 ? 160 : head_dim <= 96 ? 128 : head_dim <= 128 ? 224 : head_dim <= 192 ? 160 : 128;
}

int fa3_fp8_query_tile(Eigen::Index head_dim) { return head_dim <= 96 ? 192 : 128; }

void exp2_softmax(FlashKernel& k, ScaleAt at) {
  k.softmax.scale_at = at;
  k.softmax.base = SoftmaxBase::two;
  k.softmax.exp = ExpImpl::f64_rounded;
}

void fa3_epilogue(FlashKernel& k, bool output_bf16) {
  k.keys.order = KeyOrder::reverse;
  k.output.finalize = Finalize::reciprocal;
  k.output.format = output_bf16 ? KernelFormat::bf16 : KernelFormat::fp32;
}

std::unique_ptr<PreparedCall> prepare_flash(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const FlashKernel& kernel) {
  return prepare_flash(q, k, v, scale, mask, kernel, nullptr);
}

std::unique_ptr<PreparedCall> prepare_flash(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const FlashKernel& kernel,
                                            std::shared_ptr<const FlashKeyCodes> keys) {
  validate(kernel);
  require_attention_shapes(q, k, v);
  return std::make_unique<FlashCall>(q, k, v, scale, mask, kernel, std::move(keys));
}

AttentionResult flash_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const FlashKernel& kernel) {
  if (q.rows() == 0) {
    validate(kernel);
    require_attention_shapes(q, k, v);
    return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  }
  return prepare_flash(q, k, v, scale, mask, kernel)->rows(0, q.rows());
}

}  // namespace qattn::ref
