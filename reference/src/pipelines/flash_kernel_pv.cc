// Step (5) of the flash loop (flash_kernel.h), per row of a chunk and key block: P~ rounded to P's format, the row
// sum, and P V accumulated on the description's unit (exact integers, an MMA model's columns, float32 products, or
// NVFP4's block-scaled groups). The loop that calls it is flash_kernel.cc's FlashCall::rows_impl.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flash_row_loop.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"

namespace qattn::ref::flash_detail {

// (5) row t, active in the block: P (P~ rounded to p.format), the row sum (row_sum_of rounded; row_sum_update block:
// l r + the block's own sum), P V; the block's max becomes the row's.
void FlashCall::RowLoop::p_row_sum_and_pv(Eigen::Index t, const KeyBlock& kb) {
  const float rescale = rescale_of[t];
  std::array<float, 4>& lt = l[t];
  const std::array<float, 4>& part = part_of[t];
  p_to_format(t, kb);
  if (!sum_unrounded) row_sum(sm, &p8(t, 0), kb.b0, kb.b1, running ? lt : part_of[t]);
  if (!running)
    for (std::size_t th = 0; th < static_cast<std::size_t>(threads); ++th) lt[th] = lt[th] * rescale + part[th];
  pv_step(t, rescale, kb);
  m[t] = m_next[t];
}

// P~ of row t's block rounded in place to p.format: E4M3, tile codes (p.max), NVFP4 per 16 keys, or round_p.
void FlashCall::RowLoop::p_to_format(Eigen::Index t, const KeyBlock& kb) {
  const float* sr = &s(t, 0);
  float* pr = &p8(t, 0);
  const Eigen::Index b = kb.b, b0 = kb.b0, b1 = kb.b1;
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
      const float sc = call.ex(std::fma(bmax, call.s2, -ref_block(t, b)) + kLog2SixthF32);
      const float scale = e4m3_round_saturate(sc);
      p4s(t, g0 / 16) = scale;
      nvf4_p_block(pr + g0, static_cast<std::size_t>(g1 - g0), sc, scale, &p4(t, g0));
    }
  else
    for (Eigen::Index j = b0; j < b1; ++j) pr[j] = round_p(pr[j], f.p.format);
}

// P V of row t: into the accumulator acc (one over the key loop when nothing promotes, else buf, added to out),
// acc (and O) rescaled first; at a promotion acc into O.
void FlashCall::RowLoop::pv_step(Eigen::Index t, float rescale, const KeyBlock& kb) {
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
  pv_products(acc, t, kb);
  if (kb.promote) {
    if (f.pv.promote_fma)
      for (Eigen::Index c = 0; c < dv; ++c) o[c] = std::fma(o[c], rescale, acc[c]);
    else
      for (Eigen::Index c = 0; c < dv; ++c) o[c] += acc[c];
    if (promote_blocks != 1) std::fill(acc, acc + dv, 0.0f);
  }
}

// The block's products P V of row t added to acc by pv.unit, over the real keys (padded keys have V = 0).
void FlashCall::RowLoop::pv_products(float* acc, Eigen::Index t, const KeyBlock& kb) {
  const float* pr = &p8(t, 0);
  const Eigen::Index b0 = kb.b0, real_end = kb.real_end;
  const auto n_dv = static_cast<std::size_t>(dv);
  switch (unit) {
    case PvUnit::exact: pv_exact(acc, t, kb); break;
    case PvUnit::h100_hmma_f16_acc16:
      for (Eigen::Index s0 = b0; s0 < real_end; s0 += 16)
        hmma_f16_acc16_step(acc, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(16, real_end - s0)),
                            call.v_values.data() + s0 * dv, call.v_exponents.data() + s0 * dv, n_dv, n_dv);
      break;
    case PvUnit::h100_wgmma_e4m3:
    case PvUnit::b200_tcgen05_e4m3:
      for (Eigen::Index s0 = b0; s0 < real_end; s0 += 32)
        (unit == PvUnit::b200_tcgen05_e4m3 ? tcgen05_e4m3_step : wgmma_e4m3_step)(
            acc, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(32, real_end - s0)),
            vb.data() + (s0 - b0) * dv, vbe.data() + (s0 - b0) * dv, n_dv, n_dv);
      break;
    case PvUnit::ada_mma_e4m3:  // each 32 keys one instruction: two steps of 16, the second even when empty
    case PvUnit::ada_mma_e4m3_acc16:
      for (Eigen::Index s0 = b0; s0 < real_end; s0 += 16) {
        const Eigen::Index cnt = std::clamp<Eigen::Index>(real_end - s0, 0, 16);
        ada_e4m3_step(acc, pr + s0, static_cast<std::size_t>(cnt), vb.data() + (s0 - b0) * dv,
                      vbe.data() + (s0 - b0) * dv, n_dv, n_dv, unit == PvUnit::ada_mma_e4m3_acc16);
        if ((s0 - b0) % 32 == 0 && s0 + 16 >= real_end)  // the instruction's second step, of padding alone
          ada_e4m3_step(acc, pr, 0, vb.data(), vbe.data(), n_dv, n_dv, unit == PvUnit::ada_mma_e4m3_acc16);
      }
      break;
    case PvUnit::h100_mma_e4m3: pv_mma_columns(acc, pr, kb); break;
    case PvUnit::b200_nvf4: pv_nvf4(acc, t, kb); break;
    case PvUnit::fp22:
      for (Eigen::Index c = 0; c < dv; ++c) {
        float x = acc[c];
        for (Eigen::Index j = b0; j < real_end; ++j)
          x = fp22(static_cast<double>(x) +
                   static_cast<double>(pr[j]) * call.v_values[static_cast<std::size_t>(j * dv + c)]);
        acc[c] = x;
      }
      break;
    case PvUnit::fp32:
      for (Eigen::Index c = 0; c < dv; ++c) {
        float x = acc[c];
        for (Eigen::Index j = b0; j < real_end; ++j) x += pr[j] * call.v_values[static_cast<std::size_t>(j * dv + c)];
        acc[c] = x;
      }
      break;
  }
}

// pv.unit exact: the block's integer sum of P codes times V codes (the buffer's past the row's split), exact, times
// s_P s_V in float64, rounded once.
void FlashCall::RowLoop::pv_exact(float* acc, Eigen::Index t, const KeyBlock& kb) {
  const float* pr = &p8(t, 0);
  std::fill(acc64.begin(), acc64.end(), 0);
  const Eigen::Index from = split[static_cast<std::size_t>(t)];
  for (Eigen::Index j = kb.b0; j < kb.real_end; ++j) {
    const auto code = static_cast<std::int64_t>(pr[j]);
    if (code == 0) continue;
    const std::int8_t* vr = call.buffered && j >= from ? &call.v_int_buffer(j, 0) : &call.v_int(j, 0);
    for (Eigen::Index c = 0; c < dv; ++c) acc64[static_cast<std::size_t>(c)] += code * vr[c];
  }
  const double pv_scale = tile_scale(t, kb.b) * call.v_block_scale[static_cast<std::size_t>(kb.b)];
  for (Eigen::Index c = 0; c < dv; ++c)
    acc[c] = static_cast<float>(static_cast<double>(acc64[static_cast<std::size_t>(c)]) * pv_scale);
}

// pv.unit h100-mma-e4m3: per channel, each 32 keys one instruction (mma_dot), a short last chunk padded with 0
void FlashCall::RowLoop::pv_mma_columns(float* acc, const float* pr, const KeyBlock& kb) const {
  const MmaModel& model = *pv_column_model(unit);
  std::array<std::uint16_t, 32> pc{}, vc{};
  for (Eigen::Index c = 0; c < dv; ++c) {
    float x = acc[c];
    for (Eigen::Index s0 = kb.b0; s0 < kb.real_end; s0 += 32) {
      const Eigen::Index cnt = std::min<Eigen::Index>(32, kb.real_end - s0);
      pc.fill(0), vc.fill(0);
      for (Eigen::Index j = 0; j < cnt; ++j)
        pc[static_cast<std::size_t>(j)] = static_cast<std::uint16_t>(lowp_encode(pr[s0 + j], fp8_e4m3fn())),
        vc[static_cast<std::size_t>(j)] = call.v_codes_t(c, s0 + j);
      x = mma_dot(model, pc, vc, x);
    }
    acc[c] = x;
  }
}

// pv.unit b200-nvf4: steps of 64 keys, groups of 16 aligned with V's blocks; keys past L_k absent
void FlashCall::RowLoop::pv_nvf4(float* acc, Eigen::Index t, const KeyBlock& kb) {
  const auto n_dv = static_cast<std::size_t>(dv);
  for (Eigen::Index s0 = kb.b0; s0 < kb.real_end; s0 += 64) {
    const Eigen::Index ng = std::min<Eigen::Index>(4, (kb.real_end - s0 + 15) / 16);
    for (Eigen::Index g = 0; g < ng; ++g) {
      const Eigen::Index g0 = s0 + 16 * g, g1 = std::min(kb.real_end, g0 + 16);
      nvf4_group_sums(&p4(t, g0), static_cast<std::size_t>(g1 - g0), &call.v4(g0, 0), n_dv, n_dv, nvf4_sum.data());
      const float ps = p4s(t, g0 / 16);
      nvf4_terms(nvf4_sum.data(), ps, ps == 0 ? -100000 : scale_exponent(ps), &call.v4_scale(g0 / 16, 0),
                 &call.v4_exp(g0 / 16, 0), nvf4_term.data() + g * dv, nvf4_term_e.data() + g * dv, n_dv);
    }
    scaled_group_step(acc, nvf4_term.data(), nvf4_term_e.data(), static_cast<std::size_t>(ng), n_dv, n_dv);
  }
}

}  // namespace qattn::ref::flash_detail
