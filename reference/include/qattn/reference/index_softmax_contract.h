// The declared error contract of IndexSoftmax against the exact softmax of the real logits alpha * a
// (docs/methods/index-softmax.md, section "Error contract"; the same numbers sit in
// tests/property/index_softmax_property_test.cc).
//
// With T1 = 2^b - 1, table step delta = c / T1, clip rounding rho = |c - alpha c_int| (logit units):
//   k     = index-rule slack in table steps: floor 1, round 1/2, floor-f32 1 + 3 * 255 * 2^-24,
//           q26-round 1/2 + c_int / 2^27, q26-floor 1 + c_int / 2^27
//   theta = k delta + rho                       bound on |table exponent - true exponent| of an unclipped entry
//   r     = table rounding: 1 (floor) or 1/2 (round)
//   eta   = max(r, 255 e^{-(c - theta)}, LUT[idx(c_int)])   absolute slack of one entry, clipping included
//   nu    = normalisation rounding of P / s_P: floor 1/s_P; f32-rne (1/2 + s_P 2^-23)/s_P; q8 (1/2 + 255/512)/s_P
// and, for a row of L valid entries whose exact softmax has largest probability p_max (U = 255 / p_max):
//   D      = U (e^theta - 1) + L eta           bound on sum_j |E_j - 255 e^{-t_j}|
//   S_lo   = max(255, U - D)                   lower bound of the row sum S
//   |P_j / s_P - p_j| <= nu + (p_j U (e^theta - 1) + eta + p_j D) / S_lo          (per element)
//   sum_j |P_j / s_P - p_j| <= L nu + 2 D / S_lo                                   (per row)
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "qattn/reference/index_softmax.h"

namespace qattn::ref {

struct IndexSoftmaxBound {
  double theta = 0, eta = 0, nu = 0, r = 0;

  // Terms for one attention call: params, the logit scale alpha and the clip c_int actually used.
  static IndexSoftmaxBound make(const IndexSoftmaxParams& params, double alpha, std::int64_t c_int);
  // Group-wise clipping (index_softmax_grouped): the worst block's theta and eta, with block j's logit scale
  // alpha[j], its clip, and a_max >= max_j |m_j| (the block maxima of the row). theta_j adds to make()'s terms the
  // error of carrying the row maximum into block j (docs/pipelines/intattention.md, "Error of the two readings"):
  //   global: alpha_j (1/2 + a_max (1 + r_j) / (2 r_j rho_j))     M_j rounded, and the fixed-point ratios
  //   offset: delta / 2 + a_max alpha_max 2^-30                     k_j rounded, and the fixed-point ratios
  // with r_j = alpha_j / alpha_max and delta = c / (2^b - 1).
  static IndexSoftmaxBound make_grouped(const IndexSoftmaxParams& params, const KeyGroupClip& clip,
                                        const std::vector<double>& alpha, double a_max);

  double row_mass_error(double p_max, Eigen::Index valid) const;  // D
  double row_sum_lower(double p_max, Eigen::Index valid) const;   // S_lo
  double element(double p, double p_max, Eigen::Index valid) const;
  double row_l1(double p_max, Eigen::Index valid) const;
};

// Exact range of sum_j P_j for one row (derived in the doc; asserted by the property tests).
struct RowSumRange {
  double lo, hi;
};
// nnz = number of entries with E > 0; row_sum = S.
RowSumRange row_sum_range(Normalization rule, int p_scale, std::int64_t row_sum, std::int64_t nnz);

}  // namespace qattn::ref
