// SAS, the sparse-activated softmax of TurboAttention (docs/methods/sas.md).
//
// For a row x with maximum m and y_j = m - x_j >= 0:
//   (1) y_j > -n_r  (i.e. x_j - m < n_r)         ->  e_j = 0                    (sparsity threshold n_r < 0)
//   (2) otherwise i = floor(y_j), f = y_j - i     ->  e_j = LUT[i] * POLY(f)
//       LUT[i] = e^{-i} for i = 0..floor(-n_r),   POLY(f) = a0 + a1 f + a2 f^2 + a3 f^3 ~ e^{-f} on [0, 1)
//   (3) p_j = e_j / sum_k e_k                     (floating-point normalisation)
// In double arithmetic by default. With half = true the TurboAttention FP16 path is emulated: y is rounded to
// binary16, LUT entries are binary16, POLY runs as Horner with every multiply and add rounded to binary16, and the
// product LUT[i] * POLY(f) is rounded to binary16; the sum and division run in binary32.
// -inf entries are masked (e = 0); a fully masked row is all zeros; NaN or +inf anywhere gives NaN.
#pragma once

#include <array>

#include "qattn/tensor.h"

namespace qattn::ref {

// Eq. 15 of the paper: POLY(x) = -0.1025 x^3 + 0.4626 x^2 - 0.9922 x + 0.9996, as {a0, a1, a2, a3}.
inline constexpr std::array<double, 4> kSasPaperPoly = {0.9996, -0.9922, 0.4626, -0.1025};

struct SasParams {
  double n_r = -6.0;  // sparsity threshold, < 0 (the paper's setup uses -6; its text also mentions -5)
  std::array<double, 4> poly = kSasPaperPoly;
  bool half = false;  // emulate the binary16 LUT and POLY arithmetic
};

// e_j for one distance y = m - x >= 0 (before normalisation).
double sas_exp(double y, const SasParams& p);

RowMatrixXd sas_softmax_rows(const MatrixView& logits, const SasParams& p);

// The continuous least-squares cubic for e^{-x} on [0, 1]: minimises the integral of (POLY - e^{-x})^2, from the
// 4x4 Hilbert normal equations solved in 50-digit arithmetic. The moments are int_0^1 x^k e^{-x} dx =
// k I_{k-1} - e^{-1} with I_0 = 1 - e^{-1}.
std::array<double, 4> sas_lsq_poly();

// Largest relative error max_{f in [0,1]} |POLY(f) e^f - 1| of a cubic in double arithmetic, found by dense
// sampling refined with golden-section search around the sampled maxima.
double poly_max_relative_error(const std::array<double, 4>& a);

// Declared contract (docs/methods/sas.md, "Error contract"): for a row of L valid entries with exact softmax p
// and p_max, |p^_j - p_j| <= element(p_j, p_max, L) and sum_j |p^_j - p_j| <= row_l1(L).
struct SasBound {
  double eps = 0;  // relative error bound of e_j for kept entries
  double n_r = -6;
  double sum_u = 0x1p-53;  // unit roundoff of the normalisation: binary32 for the half path, double otherwise
  static SasBound make(const SasParams& p);
  double kappa(Eigen::Index valid) const;  // relative bound of p^_j / p_j - 1 for kept entries
  double element(double p, double p_max, Eigen::Index valid) const;
  double row_l1(Eigen::Index valid) const;
};

}  // namespace qattn::ref
