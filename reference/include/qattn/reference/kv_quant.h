// KV-cache quantizers (docs/quantizers.md): each turns the K and V of every head of one layer into what attention
// then reads, and says how many bits per element the cache costs, scales and zero points included. They compose
// with any attention method: `qattn analyze --kv turboquant:bits=3 --method fp32`.
//
//   rtn         round-to-nearest baseline: one grid for K and V at a named granularity
//   kivi        KIVI: K per channel within groups of g tokens, V per token within groups of g channels, both
//               min-offset (float offset); the most recent n_b tokens stay in full precision
//   flashq      TurboAttention's FlashQ cache: INT8 per block of b_c tokens (/119), then progressive INT4/INT2 per
//               channel with integer scale and zero point (flashq.h); head-wise mixed precision by priority
//   turboquant  TurboQuant: randomized Hadamard rotation, per-vector norm, Lloyd-Max codebook of the rotated
//               coordinates' density; `prod` spends one bit on a QJL sign sketch of the residual for unbiased
//               inner products
//   saw         SAW-INT4: block-diagonal normalized Hadamard on K (and optionally V), per-token asymmetric INT4
//               packed two per byte; queries rotated the same way, output rotated back when V was rotated
//   gear        GEAR-L: a uniform min-offset backbone (KCVT or KIVI's groups) plus the rank-r truncated SVD of its
//               residual, factors in fp16; the n_b most recent tokens in fp16
//   nvfp4       NVFP4: E2M1 per block of 16 channels, UE4M3 block scales, a float32 global scale (nvfp4_kv.cc);
//               read exactly, through bf16, or through bf16 then E4M3 (an FP8 attention's input)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qattn/method.h"
#include "qattn/reference/param_registry.h"
#include "qattn/tensor.h"

namespace qattn::ref {

// What attention reads after a KV quantizer: per head, K^ and V^ (dequantized). When `rotation` is set [d, d]
// (orthonormal), K^ is in the rotated basis and attention must use Q R; when `v_rotated`, V^ is too and the
// output is O R^T.
struct KvQuantized {
  std::vector<RowMatrixXd> k, v;
  RowMatrixXd rotation;   // empty: none
  bool v_rotated = false;
  double k_bits = 0, v_bits = 0;  // bits per element of the stored cache, overhead included (mean over heads)
  // The serving path's first prompt chunk (turboquant and saw's first-chunk, docs/quantizers.md): query rows
  // [0, raw_query_rows) attend to the raw K and V, unrotated, as one call; the others read the cache as another.
  Eigen::Index raw_query_rows = 0;
};

class KvQuantizer {
 public:
  virtual ~KvQuantizer() = default;
  // All heads of one layer: k[h] [L, d], v[h] [L, d_v]. Throws SpecError if the shapes do not suit the quantizer.
  virtual KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const = 0;
};

// The KV quantizer registry: the same spec syntax and parameter handling as the method registry.
using KvRegistry = ParamRegistry<KvQuantizer>;
const KvRegistry& kv_registry();

// Attention of one method over KV-quantized heads: Q rotated as the quantizer requires, O rotated back. With
// raw_query_rows = n > 0, rows [0, n) are one call on the raw Q, K and V (the mask's rows [0, n)) and rows [n, L_q)
// another on the cache (the mask's rows [n, L_q)), as a server runs a first prompt chunk and what follows it.
std::vector<AttentionResult> attention_with_kv(const Method& method, const KvQuantizer& kv,
                                               const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                               const std::vector<MatrixView>& v, double scale,
                                               const AttentionMask& mask, KvQuantized* used = nullptr);

// ---- building blocks, exposed for the tests --------------------------------------------------------------------

// The Sylvester Hadamard matrix of order n (a power of two), entries +-1.
RowMatrixXd hadamard(Eigen::Index n);
// Block-diagonal normalized Hadamard of order `block` on d channels (block a power of two dividing d): entries
// +-1/sqrt(block), orthonormal and symmetric.
RowMatrixXd block_hadamard(Eigen::Index d, Eigen::Index block);
// Randomized Hadamard R = H diag(s) / sqrt(d) with seeded random signs s (d a power of two); rows rotate by x R^T.
RowMatrixXd randomized_hadamard(Eigen::Index d, std::uint64_t seed);

// Lloyd-Max codebook with 2^bits centroids (ascending) for one coordinate of a uniformly random unit vector in
// R^d, density f(t) = c (1 - t^2)^((d - 3) / 2) on [-1, 1]: Lloyd iterations on that density integrated on a
// fine grid until the centroids move less than 1e-12 (d >= 3, bits 1..8). Cached per (d, bits).
const std::vector<double>& lloyd_max_codebook(int d, int bits);

// TurboQuant of one vector x (length d, a power of two), given the rotation:
//   mse:  n = |x|, y = R x / n, each y_i -> nearest centroid c_i, x^ = n R^T c
//   prod: x^ = mse with bits - 1 (0 bits: x^ = 0), r = x - x^, gamma = |r|, z = sign(S r) (sign(0) = +1),
//         x~ = x^ + sqrt(pi/2) / d * gamma * S^T z, S [d, d] with i.i.d. N(0, 1) entries
// The prod estimator <y, x~> is unbiased for <y, x> over S.
Eigen::VectorXd turboquant_mse(const Eigen::VectorXd& x, const MatrixView& rotation, int bits);
Eigen::VectorXd turboquant_prod(const Eigen::VectorXd& x, const MatrixView& rotation, const MatrixView& s, int bits);
// The Gaussian sketch matrix of the prod variant, seeded.
RowMatrixXd gaussian_matrix(Eigen::Index d, std::uint64_t seed);

}  // namespace qattn::ref
