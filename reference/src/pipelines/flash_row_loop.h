// The flash loop's per-call row loop, shared by flash_kernel.cc (steps (3), (4) and (6), and the loop itself) and
// flash_kernel_pv.cc (step (5): P in its format, the row sum and P V on the description's unit). Not installed.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flash_call.h"
#include "qattn/float_format.h"
#include "qattn/reference/lowp_float.h"

namespace qattn::ref::flash_detail {

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

inline float fp22(double x) {
  return static_cast<float>(lowp_round(x, fp22_accumulator(), LowpRounding::rz, LowpOverflow::non_saturating));
}

// The row sum over a block's values pr[b0, b1) into the row's partial sums `into`: each thread's columns in order
// ((j - b0) mod 8) / 2, or per 16-column tile of the mma layout, ((P_2t + P_2t+1) + P_8+2t) + P_8+2t+1 added at once
void row_sum(const FlashKernel::Softmax& sm, const float* pr, Eigen::Index b0, Eigen::Index b1, std::array<float, 4>& into);

// The working state of one rows() call: the description's switches, read once, and the buffers of a chunk of query
// rows, allocated once and reused by every chunk and key block. Each member function is one step of the loop;
// rows_impl below runs them in order.
struct FlashCall::RowLoop {
  // One key block as the loop visits it: its index b in memory order, its keys [b0, b1) (past L_k where zeros pad
  // the last block), the real ones [b0, real_end), and whether P V's accumulator is promoted into O after it.
  struct KeyBlock {
    Eigen::Index b, b0, b1, real_end;
    bool promote;
  };

  RowLoop(const FlashCall& c, Eigen::Index r0, Eigen::Index rows);

  // (3) S of a chunk of rows, masked; each row's state reset
  void masked_logits(Eigen::Index c0, Eigen::Index n);
  void start_chunk();
  // (4)-(5) one key block for the chunk
  KeyBlock block_at(Eigen::Index bi) const;
  void key_block(Eigen::Index c0, Eigen::Index n, const KeyBlock& kb);
  // (4) per row: the running max and rescale, P~ = p.scale exp_b(S - ref); P~'s tile scales across rows
  void max_rescale_and_p_tilde(Eigen::Index t, Eigen::Index i, const KeyBlock& kb);
  float block_max(const float* sr, float m_old, const KeyBlock& kb) const;
  void p_tilde(const float* sr, float* pr, float ref, const KeyBlock& kb) const;
  void tile_scales(Eigen::Index n, const KeyBlock& kb);
  // (5) per row: P in p.format, the row sum, P V accumulated on pv.unit
  void p_row_sum_and_pv(Eigen::Index t, const KeyBlock& kb);
  void p_to_format(Eigen::Index t, const KeyBlock& kb);
  void pv_step(Eigen::Index t, float rescale, const KeyBlock& kb);
  void pv_products(float* acc, Eigen::Index t, const KeyBlock& kb);
  void pv_exact(float* acc, Eigen::Index t, const KeyBlock& kb);
  void pv_mma_columns(float* acc, const float* pr, const KeyBlock& kb) const;
  void pv_nvf4(float* acc, Eigen::Index t, const KeyBlock& kb);
  // (6) per row: O normalised by the row sum, P as probabilities
  void finalize_row(Eigen::Index t, Eigen::Index i, AttentionResult& r) const;
  void output_row(const float* o, float sum, Eigen::Index i, Eigen::Index row, AttentionResult& r) const;
  void probabilities_row(Eigen::Index t, float sum, Eigen::Index row, AttentionResult& r) const;

  // s2 of key j of the row being processed: per (Q block, K block) from s2_keys, or the call's one s2
  float s2_of(Eigen::Index j) const { return grouped ? s2_keys[static_cast<std::size_t>(j)] : call.s2; }

  const FlashCall& call;
  const FlashKernel& f;
  const FlashKernel::Softmax& sm;
  const Eigen::Index r0, rows, lk, dv;
  const bool unmasked;
  // A P~ tile (p.max) spans block_q query rows: the rows computed are [first, last), whole tiles around the asked ones
  const bool tiled;
  const Eigen::Index tile_rows, first, last;
  const RowMatrixXb visible;
  const Eigen::Index bk;  // pad zeros: the keys of the last block past L_k exist, logit 0 and V = 0
  const Eigen::Index blocks;
  const bool in_exp;
  const bool scaled_max;  // the max of fma(S, s2, -offset) (validate: in_exp)
  const bool grouped;     // s2 per (Q block, K block)
  const float offset, p_scale, threshold;
  const Eigen::Index emu_freq;
  const int threads;
  const Eigen::Index promote_blocks;  // 0: one accumulator
  const PvUnit unit;
  const bool codes_by_row;
  const bool sas_exp;  // SAS(0) != 1: every rescale is computed
  const bool from_rescales, running, sum_unrounded;
  const bool p_nvfp4;
  // Rows go in chunks: each key block serves every row of the chunk before the next block, so the block's V stays
  // in cache. Each row's operations, and their order, are those of the row alone (a P~ tile's rows share a chunk),
  // so the chunk's size changes no bit: 64 rows up to 8192 keys, 32 beyond (the chunk's logits and P are
  // 2 x rows x L_k floats), or whole tiles.
  const Eigen::Index chunk_rows;

  std::vector<float> s2_keys;  // grouped: s2 of each key of the row being processed
  RowMatrixXf s, p8, out, buf, ref_block;  // per chunk row: S, P~ then P, O, the promoted accumulator, each block's ref
  RowMatrixXf rescale_block;               // p.from rescales: each block's rescale
  RowMatrixXd tile_scale;                  // p.max: each block's s_P
  std::vector<float> m, m_next, rescale_of;  // the running max, the block's, the block's rescale
  std::vector<std::array<float, 4>> l, part_of;  // the row sum's partial sums; the block's own (row_sum_update block)
  std::vector<char> any, active;  // a visible key so far; in this block
  std::vector<Eigen::Index> split;  // buffered key side: the row reads keys from split on from the buffer
  std::vector<float> vb;            // the block's V codes decoded, by row
  std::vector<std::int8_t> vbe;
  std::vector<std::int64_t> acc64;  // pv.unit exact: the block's integer sums
  // nvfp4 P: twice its E2M1 values and its block scales; the P V step's group sums and terms
  RowMatrixXf p4, p4s;
  std::vector<float> nvf4_sum;
  std::vector<double> nvf4_term;
  std::vector<std::int32_t> nvf4_term_e;
};

}  // namespace qattn::ref::flash_detail
