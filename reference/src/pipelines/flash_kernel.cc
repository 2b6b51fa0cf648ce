#include "qattn/reference/flash_kernel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "flash_call.h"
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
namespace {

// P~ (float32) rounded to the P format.
inline float round_p(float x, KernelFormat f) {
  switch (f) {
    case KernelFormat::e4m3: return e4m3_round_saturate(x);
    case KernelFormat::e5m2:
      return static_cast<float>(lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate));
    case KernelFormat::int8: return std::nearbyint(x);
    case KernelFormat::fp16: return static_cast<float>(round_to_binary16(x));
    case KernelFormat::bf16: return static_cast<float>(round_to_bfloat16(x));
    default: return x;  // fp32; nvfp4 is quantised per block of keys in the loop
  }
}

float fp22(double x) {
  return static_cast<float>(lowp_round(x, fp22_accumulator(), LowpRounding::rz, LowpOverflow::non_saturating));
}


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

}  // namespace

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

AttentionResult FlashCall::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  const FlashKernel::Softmax& sm = f.softmax;
  const bool unmasked = mask.empty();
  // A P~ tile (p.max) spans block_q query rows: the rows computed are [first, last), whole tiles around the asked ones
  const bool tiled = f.p.max > 0;
  const Eigen::Index tile_rows = tiled ? f.qk.groups.block_q : 1;
  const Eigen::Index first = r0 / tile_rows * tile_rows;
  const Eigen::Index last = std::min(lq, (r0 + rows + tile_rows - 1) / tile_rows * tile_rows);
  const RowMatrixXb visible = unmasked ? RowMatrixXb() : mask.rows(first, last - first, lq).visible(last - first, lk);
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  const Eigen::Index bk = key_block;  // pad zeros: the keys of the last block past L_k exist, logit 0 and V = 0
  const Eigen::Index blocks = static_cast<Eigen::Index>(block_begin.size()) - 1;
  const bool in_exp = sm.scale_at == ScaleAt::exp;
  const bool scaled_max = sm.max_rule == MaxRule::scaled;  // the max of fma(S, s2, -offset) (validate: in_exp)
  const bool grouped = s2_table.size() > 0;                  // s2 per (Q block, K block)
  std::vector<float> s2_keys(grouped ? static_cast<std::size_t>(lk_padded) : 0);
  const float offset = static_cast<float>(f.p.offset), p_scale = static_cast<float>(f.p.scale);
  const float threshold = static_cast<float>(sm.rescale_threshold);
  const Eigen::Index emu_freq = sm.ex2_emu_freq;
  const int threads = sm.row_sum_threads;
  const Eigen::Index promote_blocks = f.pv.promote_keys / bk;  // 0: one accumulator
  const PvUnit unit = f.pv.unit;
  const bool ada = unit == PvUnit::ada_mma_e4m3 || unit == PvUnit::ada_mma_e4m3_acc16;
  const bool codes_by_row = unit == PvUnit::h100_wgmma_e4m3 || unit == PvUnit::b200_tcgen05_e4m3 || ada;
  const bool sas_exp = sm.exp == ExpImpl::sas;  // SAS(0) != 1: every rescale is computed
  const bool from_rescales = f.output.p_from == PFrom::rescales;
  const bool running = sm.row_sum_update == RowSumUpdate::running;
  const bool sum_unrounded = sm.row_sum_of == RowSumOf::unrounded;
  // Rows go in chunks: each key block serves every row of the chunk before the next block, so the block's V stays
  // in cache. Each row's operations, and their order, are those of the row alone (a P~ tile's rows share a chunk),
  // so the chunk's size changes no bit: 64 rows up to 8192 keys, 32 beyond (the chunk's logits and P are
  // 2 x rows x L_k floats), or whole tiles.
  const Eigen::Index kChunkRows =
      tiled ? std::min(tile_rows * std::max<Eigen::Index>(1, 64 / tile_rows), std::max<Eigen::Index>(1, last - first))
      : lk_padded <= 8192 ? 64
                          : 32;
  RowMatrixXf s(kChunkRows, lk_padded), p8(kChunkRows, lk_padded), out(kChunkRows, dv), buf(kChunkRows, dv),
      ref_block(kChunkRows, blocks);
  RowMatrixXf rescale_block(from_rescales ? kChunkRows : 0, from_rescales ? blocks : 0);
  RowMatrixXd tile_scale(tiled ? kChunkRows : 0, tiled ? blocks : 0);
  std::vector<float> m(kChunkRows), m_next(kChunkRows), rescale_of(kChunkRows);
  std::vector<std::array<float, 4>> l(kChunkRows), part_of(kChunkRows);
  std::vector<char> any(kChunkRows), active(kChunkRows);
  std::vector<Eigen::Index> split(static_cast<std::size_t>(kChunkRows), lk);
  std::vector<float> vb(codes_by_row ? static_cast<std::size_t>(bk * dv) : 0);
  std::vector<std::int64_t> acc64(unit == PvUnit::exact ? static_cast<std::size_t>(dv) : 0);
  // nvfp4 P: twice its E2M1 values and its block scales; the P V step's group sums and terms
  const bool p_nvfp4 = f.p.format == KernelFormat::nvfp4;
  RowMatrixXf p4(p_nvfp4 ? kChunkRows : 0, p_nvfp4 ? lk_padded : 0), p4s(p_nvfp4 ? kChunkRows : 0, p_nvfp4 ? blocks * bk / 16 : 0);
  std::vector<float> nvf4_sum(p_nvfp4 ? static_cast<std::size_t>(dv) : 0);
  std::vector<double> nvf4_term(p_nvfp4 ? static_cast<std::size_t>(4 * dv) : 0);
  std::vector<std::int32_t> nvf4_term_e(nvf4_term.size());
  std::vector<std::int8_t> vbe(vb.size());
  for (Eigen::Index c0 = first; c0 < last; c0 += kChunkRows) {
    const Eigen::Index n = std::min(kChunkRows, last - c0);
    if (buffered)  // a decode step reads the chunks settled by the time its last visible key arrived
      for (Eigen::Index t = 0; t < n; ++t) {
        Eigen::Index seen = lk;
        if (!unmasked)
          for (seen = lk; seen > 0 && !visible(c0 + t - first, seen - 1);) --seen;
        split[static_cast<std::size_t>(t)] =
            seen <= settled_from ? settled_from : settled_from + chunk * ((seen - settled_from) / chunk);
      }
    logits(c0, n, s, split);
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, row = i - first;
      float* sr = &s(t, 0);
      for (Eigen::Index j = 0; j < lk; ++j) {
        const float s2j = grouped ? s2_table(q_group_of[static_cast<std::size_t>(i)], k_group_of[static_cast<std::size_t>(j)]) : s2;
        if (!unmasked && !visible(row, j)) sr[j] = kNegInf;
        else if (!std::isfinite(in_exp ? sr[j] * s2j : sr[j])) throw_logit_overflow(f.name, "float32", i, j);
      }
      for (Eigen::Index j = lk; j < lk_padded; ++j) sr[j] = 0.0f;
    }
    std::fill(m.begin(), m.end(), kNegInf);
    for (auto& x : l) x.fill(0.0f);
    std::fill(any.begin(), any.end(), 0);
    if (from_rescales) rescale_block.setOnes();
    out.setZero();
    buf.setZero();
    // (4)-(5) the key blocks
    for (Eigen::Index bi = 0; bi < blocks; ++bi) {
      const Eigen::Index b = f.keys.order == KeyOrder::forward ? bi : blocks - 1 - bi;
      const Eigen::Index b0 = block_begin[static_cast<std::size_t>(b)], b1 = block_begin[static_cast<std::size_t>(b + 1)];
      const Eigen::Index real_end = std::min(lk, b1);  // padded keys have V = 0: their products vanish
      const bool promote = promote_blocks > 0 && ((bi + 1) % promote_blocks == 0 || bi + 1 == blocks);
      if (codes_by_row && real_end > b0)
        e4m3_decode(v_codes.data() + b0 * dv, static_cast<std::size_t>((real_end - b0) * dv), vb.data(), vbe.data());
      // (4) per row: the max, the rescale, P~ and (unrounded) the row sum
      for (Eigen::Index t = 0; t < n; ++t) {
        active[t] = 0;
        const float* sr = &s(t, 0);
        float* pr = &p8(t, 0);
        if (grouped)
          for (Eigen::Index j = b0; j < b1; ++j)
            s2_keys[static_cast<std::size_t>(j)] =
                s2_table(q_group_of[static_cast<std::size_t>(c0 + t)], k_group_of[static_cast<std::size_t>(std::min(j, lk - 1))]);
        const auto s2_of = [&](Eigen::Index j) { return grouped ? s2_keys[static_cast<std::size_t>(j)] : s2; };
        float m_new = m[t];
        if (scaled_max) {
          for (Eigen::Index j = b0; j < b1; ++j)
            if (sr[j] != kNegInf) m_new = std::max(m_new, std::fma(sr[j], s2_of(j), -offset));
        } else {
          for (Eigen::Index j = b0; j < b1; ++j) m_new = std::max(m_new, sr[j]);
        }
        if (m_new == kNegInf) {  // nothing visible yet
          ref_block(t, b) = kNegInf;
          continue;
        }
        // the max is kept while its growth, in exponent units, is within the threshold (FA4); else it moves
        const bool raw_exp = in_exp && !scaled_max;  // m in raw S units: differences and the reference times s2
        if (threshold > 0 && m[t] != kNegInf && (raw_exp ? (m_new - m[t]) * s2 : m_new - m[t]) <= threshold) m_new = m[t];
        float rescale = 0;
        if (m[t] != kNegInf)
          rescale = m_new == m[t] && !sas_exp ? 1.0f : ex(raw_exp ? (m[t] - m_new) * s2 : m[t] - m_new);
        const float ref = raw_exp ? (sm.ref_rule == RefRule::fma ? std::fma(m_new, s2, -offset) : m_new * s2 - offset)
                          : scaled_max ? m_new
                                       : (offset != 0 ? m_new - offset : m_new);
        ref_block(t, b) = ref;
        if (from_rescales) rescale_block(t, b) = rescale;
        any[t] = 1;
        active[t] = 1;
        m_next[t] = m_new;
        rescale_of[t] = rescale;
        std::array<float, 4>& part = part_of[t];
        part.fill(0.0f);
        if (running)
          for (int th = 0; th < threads; ++th) l[t][static_cast<std::size_t>(th)] *= rescale;
        for (Eigen::Index j = b0; j < b1; ++j) {
          float pt = 0;
          if (sr[j] != kNegInf) {
            pt = ex(in_exp ? std::fma(sr[j], s2_of(j), -ref) : sr[j] - ref);
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
        if (sum_unrounded) row_sum(sm, pr, b0, b1, running ? l[t] : part);
      }
      // P~'s tiles (p.max): the largest P~ of the tile's rows, s_P = max / p.max in float64
      if (tiled)
        for (Eigen::Index t0 = 0; t0 < n; t0 += tile_rows) {
          float tile_max = 0;
          for (Eigen::Index t = t0; t < std::min(n, t0 + tile_rows); ++t)
            if (active[t])
              for (Eigen::Index j = b0; j < b1; ++j) tile_max = std::max(tile_max, p8(t, j));
          for (Eigen::Index t = t0; t < std::min(n, t0 + tile_rows); ++t)
            tile_scale(t, b) = static_cast<double>(tile_max) / f.p.max;
        }
      // (5) per row: P, the row sum (rounded), P V
      for (Eigen::Index t = 0; t < n; ++t) {
        if (!active[t]) continue;
        const float* sr = &s(t, 0);
        float* pr = &p8(t, 0);
        const float rescale = rescale_of[t];
        std::array<float, 4>& lt = l[t];
        const std::array<float, 4>& part = part_of[t];
        if (f.p.format == KernelFormat::e4m3)  // the hot case without the format switch, so that it vectorises
          for (Eigen::Index j = b0; j < b1; ++j) pr[j] = e4m3_round_saturate(pr[j]);
        else if (tiled) {  // codes nearest even in [0, p.max]; a tile of zeros stays zero
          const double sp = tile_scale(t, b);
          for (Eigen::Index j = b0; j < b1; ++j)
            pr[j] = sp > 0 ? static_cast<float>(std::clamp(std::nearbyint(pr[j] / sp), 0.0, double(f.p.max))) : 0.0f;
        } else if (f.p.format == KernelFormat::nvfp4)  // per 16 keys: P~ / scale to E2M1, the scale to E4M3
          for (Eigen::Index g0 = b0; g0 < b1; g0 += 16) {
            const Eigen::Index g1 = std::min(b1, g0 + 16);  // keys past L_k (masked padding) are absent
            float bmax = kNegInf;
            for (Eigen::Index j = g0; j < g1; ++j) bmax = std::max(bmax, sr[j]);
            const float sc = ex(std::fma(bmax, s2, -ref_block(t, b)) + kLog2SixthF32);
            const float scale = e4m3_round_saturate(sc);
            p4s(t, g0 / 16) = scale;
            nvf4_p_block(pr + g0, static_cast<std::size_t>(g1 - g0), sc, scale, &p4(t, g0));
          }
        else
          for (Eigen::Index j = b0; j < b1; ++j) pr[j] = round_p(pr[j], f.p.format);
        if (!sum_unrounded) row_sum(sm, pr, b0, b1, running ? lt : part_of[t]);
        if (!running)
          for (int th = 0; th < threads; ++th) lt[static_cast<std::size_t>(th)] = lt[static_cast<std::size_t>(th)] * rescale + part[static_cast<std::size_t>(th)];
        // P V: into the accumulator acc (one over the key loop when nothing promotes, else buf, added to out)
        float* o = &out(t, 0);
        float* acc = promote_blocks > 0 ? &buf(t, 0) : o;
        if (promote_blocks > 0 && !f.pv.promote_fma)
          for (Eigen::Index c = 0; c < dv; ++c) o[c] *= rescale;
        if (promote_blocks != 1) {
          if (unit == PvUnit::fp22)
            for (Eigen::Index c = 0; c < dv; ++c) acc[c] = fp22(static_cast<double>(acc[c]) * rescale);
          else
            for (Eigen::Index c = 0; c < dv; ++c) acc[c] *= rescale;
        } else {
          std::fill(acc, acc + dv, 0.0f);
        }
        switch (unit) {
          case PvUnit::exact: {  // the block's integer sum, exact, times s_P s_V in float64, rounded once
            std::fill(acc64.begin(), acc64.end(), 0);
            const Eigen::Index from = split[static_cast<std::size_t>(t)];
            for (Eigen::Index j = b0; j < real_end; ++j) {
              const auto code = static_cast<std::int64_t>(pr[j]);
              if (code == 0) continue;
              const std::int8_t* vr = buffered && j >= from ? &v_int_buffer(j, 0) : &v_int(j, 0);
              for (Eigen::Index c = 0; c < dv; ++c) acc64[static_cast<std::size_t>(c)] += code * vr[c];
            }
            const double pv_scale = tile_scale(t, b) * v_block_scale[static_cast<std::size_t>(b)];
            for (Eigen::Index c = 0; c < dv; ++c)
              acc[c] = static_cast<float>(static_cast<double>(acc64[static_cast<std::size_t>(c)]) * pv_scale);
            break;
          }
          case PvUnit::h100_hmma_f16_acc16:
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 16)
              hmma_f16_acc16_step(acc, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(16, real_end - s0)),
                                  v_values.data() + s0 * dv, v_exponents.data() + s0 * dv, static_cast<std::size_t>(dv),
                                  static_cast<std::size_t>(dv));
            break;
          case PvUnit::h100_wgmma_e4m3:
          case PvUnit::b200_tcgen05_e4m3:
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 32)
              (unit == PvUnit::b200_tcgen05_e4m3 ? tcgen05_e4m3_step : wgmma_e4m3_step)(acc, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(32, real_end - s0)),
                              vb.data() + (s0 - b0) * dv, vbe.data() + (s0 - b0) * dv, static_cast<std::size_t>(dv),
                              static_cast<std::size_t>(dv));
            break;
          case PvUnit::ada_mma_e4m3:  // each 32 keys one instruction: two steps of 16, the second even when empty
          case PvUnit::ada_mma_e4m3_acc16:
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 16) {
              const Eigen::Index cnt = std::clamp<Eigen::Index>(real_end - s0, 0, 16);
              ada_e4m3_step(acc, pr + s0, static_cast<std::size_t>(cnt), vb.data() + (s0 - b0) * dv,
                            vbe.data() + (s0 - b0) * dv, static_cast<std::size_t>(dv), static_cast<std::size_t>(dv),
                            unit == PvUnit::ada_mma_e4m3_acc16);
              if ((s0 - b0) % 32 == 0 && s0 + 16 >= real_end)  // the instruction's second step, of padding alone
                ada_e4m3_step(acc, pr, 0, vb.data(), vbe.data(), static_cast<std::size_t>(dv),
                              static_cast<std::size_t>(dv), unit == PvUnit::ada_mma_e4m3_acc16);
            }
            break;
          case PvUnit::h100_mma_e4m3: {  // each 32 keys one instruction (mma_dot), a short last chunk padded with 0
            const MmaModel& model = *pv_column_model(unit);
            std::array<std::uint16_t, 32> pc{}, vc{};
            for (Eigen::Index c = 0; c < dv; ++c) {
              float x = acc[c];
              for (Eigen::Index s0 = b0; s0 < real_end; s0 += 32) {
                const Eigen::Index cnt = std::min<Eigen::Index>(32, real_end - s0);
                pc.fill(0), vc.fill(0);
                for (Eigen::Index j = 0; j < cnt; ++j)
                  pc[static_cast<std::size_t>(j)] = static_cast<std::uint16_t>(lowp_encode(pr[s0 + j], fp8_e4m3fn())),
                  vc[static_cast<std::size_t>(j)] = v_codes_t(c, s0 + j);
                x = mma_dot(model, pc, vc, x);
              }
              acc[c] = x;
            }
            break;
          }
          case PvUnit::b200_nvf4:  // steps of 64 keys, groups of 16 aligned with V's blocks; keys past L_k absent
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 64) {
              const Eigen::Index ng = std::min<Eigen::Index>(4, (real_end - s0 + 15) / 16);
              for (Eigen::Index g = 0; g < ng; ++g) {
                const Eigen::Index g0 = s0 + 16 * g, g1 = std::min(real_end, g0 + 16);
                nvf4_group_sums(&p4(t, g0), static_cast<std::size_t>(g1 - g0), &v4(g0, 0), static_cast<std::size_t>(dv),
                                static_cast<std::size_t>(dv), nvf4_sum.data());
                const float ps = p4s(t, g0 / 16);
                nvf4_terms(nvf4_sum.data(), ps, ps == 0 ? -100000 : scale_exponent(ps), &v4_scale(g0 / 16, 0),
                           &v4_exp(g0 / 16, 0), nvf4_term.data() + g * dv, nvf4_term_e.data() + g * dv,
                           static_cast<std::size_t>(dv));
              }
              scaled_group_step(acc, nvf4_term.data(), nvf4_term_e.data(), static_cast<std::size_t>(ng),
                                static_cast<std::size_t>(dv), static_cast<std::size_t>(dv));
            }
            break;
          case PvUnit::fp22:
            for (Eigen::Index c = 0; c < dv; ++c) {
              float x = acc[c];
              for (Eigen::Index j = b0; j < real_end; ++j)
                x = fp22(static_cast<double>(x) + static_cast<double>(pr[j]) * v_values[static_cast<std::size_t>(j * dv + c)]);
              acc[c] = x;
            }
            break;
          case PvUnit::fp32:
            for (Eigen::Index c = 0; c < dv; ++c) {
              float x = acc[c];
              for (Eigen::Index j = b0; j < real_end; ++j) x += pr[j] * v_values[static_cast<std::size_t>(j * dv + c)];
              acc[c] = x;
            }
            break;
        }
        if (promote) {
          if (f.pv.promote_fma)
            for (Eigen::Index c = 0; c < dv; ++c) o[c] = std::fma(o[c], rescale, acc[c]);
          else
            for (Eigen::Index c = 0; c < dv; ++c) o[c] += acc[c];
          if (promote_blocks != 1) std::fill(acc, acc + dv, 0.0f);
        }
        m[t] = m_next[t];
      }
    }
    // (6) finalize
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, row = i - r0;
      if (!any[t] || i < r0 || i >= r0 + rows) continue;  // no visible key: O = 0, P = 0; a tile's other rows
      const std::array<float, 4>& lt = l[t];
      const float sum = threads == 1 ? lt[0]
                        : sm.row_sum_combine == RowSumCombine::pairs_02_13 ? (lt[0] + lt[2]) + (lt[1] + lt[3])
                                                                          : (lt[0] + lt[1]) + (lt[2] + lt[3]);
      const float* o = &out(t, 0);
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
          for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = static_cast<float>(o[c] * v_scale(c) / sum + v_mean(c));
          break;
        case Finalize::reciprocal: {
          const float os = (1.0f / sum) * v_descale;
          for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = o[c] * os;
          break;
        }
        case Finalize::reciprocal_channel: {  // fl32(fl32(O fl32(1 / l)) scale_c) (+ mean_c), float32
          const float inv = 1.0f / sum;
          for (Eigen::Index c = 0; c < dv; ++c) {
            float x = (o[c] * inv) * static_cast<float>(v_scale(c));
            if (f.v.smooth) x += static_cast<float>(v_mean(c));
            r.o(row, c) = x;
          }
          break;
        }
      }
      if (f.output.format == KernelFormat::fp16)
        for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = round_to_binary16(r.o(row, c));
      else if (f.output.format == KernelFormat::bf16)
        for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = round_to_bfloat16(r.o(row, c));
      // P as probabilities: P8 base^(ref_block - ref_final) / l, the factor once per key block
      // the reference of the last block processed is the row's final one (the max only grows; a row's first
      // visible block is processed before its last)
      if (from_rescales) {  // p.from rescales: P8 s_P times the rescales applied after the block, over l
        double later = 1.0;
        for (Eigen::Index bi = blocks; bi-- > 0;) {
          const Eigen::Index b = f.keys.order == KeyOrder::forward ? bi : blocks - 1 - bi;
          const double weight = tiled ? tile_scale(t, b) : 1.0;
          if (ref_block(t, b) != kNegInf)
            for (Eigen::Index j = block_begin[static_cast<std::size_t>(b)]; j < std::min(lk, block_begin[static_cast<std::size_t>(b + 1)]); ++j)
              if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(row, j) = (p8(t, j) * weight) * (later / sum);
          later *= rescale_block(t, b);
        }
        continue;
      }
      const double last = ref_block(t, f.keys.order == KeyOrder::forward ? blocks - 1 : 0);
      for (Eigen::Index b = 0; b < blocks; ++b) {
        if (ref_block(t, b) == kNegInf) continue;
        const double x = static_cast<double>(ref_block(t, b)) - last;
        const double e = sm.base == SoftmaxBase::two ? std::exp2(x) : std::exp(x);
        for (Eigen::Index j = block_begin[static_cast<std::size_t>(b)]; j < std::min(lk, block_begin[static_cast<std::size_t>(b + 1)]); ++j)
          if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(row, j) = (tiled ? p8(t, j) * tile_scale(t, b) : p8(t, j)) * e / sum;
      }
    }
  }
  return r;
}

}  // namespace flash_detail

using flash_detail::FlashCall;

int fa3_fp8_key_block(Eigen::Index head_dim) {
  return head_dim <= 64 ? 160 : head_dim <= 96 ? 128 : head_dim <= 128 ? 224 : head_dim <= 192 ? 160 : 128;
}

int fa3_fp8_query_tile(Eigen::Index head_dim) { return head_dim <= 96 ? 192 : 128; }

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
