// Group-wise clipping over key blocks (IntAttention Sec. 3.3, Eq. 16-18): the steps that the reference model and
// the fused kernels share, as cint_from_alpha is shared (docs/kernels.md, "What the ladder proves").
//
// Keys come in blocks j = 0, 1, ... with their own INT8 scales s_K^(j). In one query row (one s_Q) the logits of
// block j are on the grid alpha_j = s_Q s_K^(j) scale, and Eq. 16 gives each block its clip c_int^(j). The paper
// does not say what the row maximum of Eq. 7 is when the blocks of one row have different alpha_j. qattn models two
// readings (GroupMax); docs/pipelines/intattention.md, "Group-wise clipping", derives both and their error.
//
// s_Q cancels within a row, so the comparison of alpha_j m_j between blocks needs only the ratios of the key scales.
// They are held in fixed point with kKeyRatioBits fractional bits:
//   rho_j = round-half-even(2^30 s_K^(j) / max_i s_K^(i))        in [1, 2^30] (double quotient, one rounding)
//   mu    = max_j rho_j m_j                                     (int64, exact: |m_j| < 2^31, rho_j <= 2^30)
//   global reading: M_j = floor((2 mu + rho_j) / (2 rho_j))     mu / rho_j rounded half up, exact in int64
//                   delta' = min(M_j - a, c_int^(j))            (M_j >= m_j, so no entry is negative)
//   offset reading: k_j = min(round-half-even(fl64(mu - rho_j m_j) kappa), 2^b - 1),
//                   kappa = fl64(fl64(fl64(s_Q max_i s_K^(i)) scale) (2^b - 1)) / fl64(c 2^30)
//                   idx = min(idx_local + k_j, 2^b - 1)          (idx_local: Eq. 18 with the block's own maximum)
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace qattn {

// How the row maximum of Eq. 7 is read when the key blocks of one row have different scales.
enum class GroupMax {
  global,  // one real maximum mu per row, carried into each block's integer grid as M_j (the default)
  offset,  // each block indexed from its own maximum, then shifted by the table offset k_j of mu - alpha_j m_j
};
std::string_view to_string(GroupMax rule);

inline constexpr int kKeyRatioBits = 30;

// rho_j for the block scales s_k (each finite and > 0). Throws std::invalid_argument naming the block whose ratio
// to the largest scale is below 2^-31 (it would round to 0), or a scale that is not finite and > 0.
std::vector<std::int64_t> key_group_ratios(std::span<const double> s_k);

// M_j = mu / rho_j rounded half up, exactly (rho_j >= 1).
std::int64_t key_group_anchor(std::int64_t mu, std::int64_t rho_j);

// kappa of the offset reading for one query group: s_Q, the largest key scale, the logit scale, b and c.
double key_group_offset_scale(double s_q, double s_k_max, double scale, int bits, double c);
// k_j = min(round-half-even(fl64(gap) kappa), 2^bits - 1) for gap = mu - rho_j m_j >= 0.
int key_group_offset(std::int64_t gap, double kappa, int bits);

}  // namespace qattn
