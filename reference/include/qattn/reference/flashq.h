// FlashQ, TurboAttention's quantisation of Q, K, V and of the KV cache (docs/pipelines/turbo.md). The paper has no
// official code; every choice below is our reading of its Eq. 7-12 and is named in the doc's choice table.
//
//   (1) symmetric INT8 per block:  s = max|x| / 119,  q = clamp(round_half_even(x / s), -119, 119)
//       (s = 1 for an all-zero block, so every code is 0); 119 leaves head room for the progressive step
//   (2) progressive compression of an INT8 block to n = 4 or 2 bits, per channel c over the block's tokens:
//       s_c = max(1, R((max_c - min_c) / (2^n - 1))),  z_c = round_half_even(-min_c / s_c)   (both integers, INT8)
//       code = clamp(round_half_even(q / s_c) + z_c, 0, 2^n - 1)
//       R is round-half-even (the paper's rounding bracket) or ceil (no code ever clamps)
//   (3) back to INT8 for the integer GEMM: q^ = clamp((code - z_c) s_c, -128, 127) (saturation is counted)
//   (4) head-wise mixed precision: priority_h = gap_h x std_h (Eq. 11), the n_h lowest-priority heads take 2 bits
#pragma once

#include <vector>

#include "qattn/tensor.h"

namespace qattn::ref {

// The INT8 range R of (1): 119 as Algorithm 1 writes it (s = max|x| / 119), or 126 = 2^(8-1) - 2 from the scale
// equation after Eq. 3. The paper gives both; kFlashQRange (119) is the default everywhere (`int8-max=119|126`).
inline constexpr int kFlashQRange = 119;
inline constexpr int kFlashQRangeEq = 126;

// x ~= scale * values, values in [-R, R].
struct FlashQBlock {
  RowMatrixXi32 values;
  double scale = 1;
};

// (1) on a whole block. Throws std::invalid_argument on a non-finite entry.
FlashQBlock flashq_quantize_block(const MatrixView& x, int range = kFlashQRange);

// (1) with a given scale (the decode buffer's universal scale): entries beyond +-119 s clamp; *clamped (if given)
// receives how many did.
RowMatrixXi32 flashq_quantize_with_scale(const MatrixView& x, double scale, Eigen::Index* clamped = nullptr,
                                         int range = kFlashQRange);

enum class IntScaleRounding { round, ceil };

// (2): codes [tokens, channels] in [0, 2^bits - 1], one integer scale and zero point per channel.
struct ProgressiveBlock {
  RowMatrixXi32 codes;
  std::vector<int> scale, zero;
  int bits = 4;
};

// bits must be 1..7 (the cache uses 4 and 2); q8 entries must lie in [-128, 127].
ProgressiveBlock flashq_compress(const RowMatrixXi32& q8, int bits, IntScaleRounding rounding);

// (3). *saturated (if given) receives how many entries left [-128, 127] before clamping.
RowMatrixXi32 flashq_decompress(const ProgressiveBlock& b, Eigen::Index* saturated = nullptr);

// (4) Eq. 11, priority = gap x std, for each of K and V of one head ([tokens, channels]), summed over the two (the
// paper does not say how K and V combine; summing is our reading):
//   channel_gaps (the text's definition, default): gap = max - min over all channels, std = the population standard
//                deviation of the channel-wise gaps g_c = max_t x(t, c) - min_t x(t, c);
//   entries      (qattn's earlier reading): gap as above, std = the population standard deviation of all entries.
enum class HeadPriority { channel_gaps, entries };
double flashq_head_priority(const MatrixView& k, const MatrixView& v, HeadPriority rule = HeadPriority::channel_gaps);

// Bits per head: the n_h heads of lowest priority get low_bits, the rest high_bits; ties go to the lower head
// index first (a stable order). n_h is clamped to [0, heads].
std::vector<int> flashq_head_bits(const std::vector<double>& priority, int n_h, int low_bits, int high_bits);

}  // namespace qattn::ref
