// SageAttention2's quantisation of Q and K (docs/pipelines/sage2-quant.md): which tokens share a scale at each
// granularity, the scale, and the rounding, as the official kernels do them.
//
// Groups (token n of L tokens):
//   tensor  one group
//   block   n / b_q for Q (b_q = 128), n / b_k for K (b_k = 64)
//   warp    n / WARPQ for Q (32), n / WARPK for K (64)
//   thread  Q: (n / WARPQ) * 8 + n % 8  -- tokens {t, t+8, t+16, t+24} of each 32-token warp block share a scale
//           K: (n / WARPK) * 4 + (n % 8) / 2 -- tokens blk*64 + 8i + 2t + {0, 1} share a scale (16 per group)
//   token   n
// Scale of a group: max|x| over its tokens and all of head_dim, divided by 127 (INT8) or 7 (INT4), plus 1e-7
// (the upstream epsilon, which also keeps an all-zero group finite). Codes: x / s rounded half away from zero
// (upstream Triton: trunc(x/s + 0.5 sign(x))) or half to even (upstream CUDA), clamped to +-127 / +-7 (the epsilon
// already keeps |x/s| < 127, so the clamp never acts for finite input).
#pragma once

#include <vector>

#include "qattn/tensor.h"

namespace qattn::ref {

enum class SageGranularity { tensor, block, warp, thread, token };
enum class SageRounding { half_away, half_even };

struct SageGroupSizes {
  int block_q = 128, block_k = 64, warp_q = 32, warp_k = 64;
};

// The two rounding rules on y = x / s: half away from zero, trunc(y + 0.5 sign(y)); half to even, nearbyint(y).
double sage_round(double y, SageRounding r);

// Scale-group index of token n (queries or keys).
int sage_group_of(int n, bool is_query, SageGranularity g, const SageGroupSizes& sizes = {});

struct SageQuantized {
  RowMatrixXi32 values;       // [L, d] codes
  std::vector<double> scales;  // one per group
  std::vector<int> group;      // group of each token
  double dequantized(Eigen::Index n, Eigen::Index c) const { return values(n, c) * scales[group[n]]; }
};

SageQuantized sage_quantize(const MatrixView& x, bool is_query, SageGranularity g, int bits, SageRounding r,
                            const SageGroupSizes& sizes = {});

}  // namespace qattn::ref
