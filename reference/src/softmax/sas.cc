#include "qattn/reference/sas.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include "qattn/reference/golden_section.h"
#include "qattn/float_format.h"

namespace qattn::ref {
namespace {

double h(double v) { return round_to_binary16(v); }

double poly(const std::array<double, 4>& a, double f) { return ((a[3] * f + a[2]) * f + a[1]) * f + a[0]; }

double poly_half(const std::array<double, 4>& a, double f) {
  double r = h(a[3]);
  for (int k = 2; k >= 0; --k) r = h(h(r * f) + h(a[k]));  // separate multiply and add, each rounded (no FMA)
  return r;
}

}  // namespace

double sas_exp(double y, const SasParams& p) {
  if (!(p.n_r < 0)) throw std::invalid_argument("SAS: n_r must be < 0");
  if (p.half) y = h(y);
  if (y > -p.n_r) return 0.0;
  const double i = std::floor(y);
  const double f = y - i;  // exact in double, and in binary16 for a binary16 y
  if (!p.half) return std::exp(-i) * poly(p.poly, f);
  return h(h(std::exp(-i)) * poly_half(p.poly, f));
}

RowMatrixXd sas_softmax_rows(const MatrixView& logits, const SasParams& p) {
  RowMatrixXd out = RowMatrixXd::Zero(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    double m = -std::numeric_limits<double>::infinity();
    bool bad = false;
    for (Eigen::Index j = 0; j < logits.cols(); ++j) {
      const double x = logits(r, j);
      bad = bad || std::isnan(x) || x == std::numeric_limits<double>::infinity();
      m = std::max(m, x);
    }
    if (bad) {
      out.row(r).setConstant(std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    if (m == -std::numeric_limits<double>::infinity()) continue;  // fully masked
    double s = 0;
    float s32 = 0;
    for (Eigen::Index j = 0; j < logits.cols(); ++j) {
      if (logits(r, j) == -std::numeric_limits<double>::infinity()) continue;
      const double e = sas_exp(m - logits(r, j), p);
      out(r, j) = e;
      if (p.half) s32 += static_cast<float>(e);
      else s += e;
    }
    for (Eigen::Index j = 0; j < logits.cols(); ++j)
      out(r, j) = p.half ? static_cast<double>(static_cast<float>(out(r, j)) / s32) : out(r, j) / s;
  }
  return out;
}

std::array<double, 4> sas_lsq_poly() {
  using R = boost::multiprecision::cpp_bin_float_50;
  const R inv_e = exp(R(-1));
  R moment[4];
  moment[0] = 1 - inv_e;
  for (int k = 1; k < 4; ++k) moment[k] = k * moment[k - 1] - inv_e;
  R a[4][5];
  for (int j = 0; j < 4; ++j) {
    for (int k = 0; k < 4; ++k) a[j][k] = R(1) / (j + k + 1);
    a[j][4] = moment[j];
  }
  for (int col = 0; col < 4; ++col)  // Gaussian elimination; the Hilbert matrix is positive definite
    for (int row = col + 1; row < 4; ++row) {
      const R f = a[row][col] / a[col][col];
      for (int k = col; k < 5; ++k) a[row][k] -= f * a[col][k];
    }
  std::array<double, 4> c{};
  R x[4];
  for (int row = 3; row >= 0; --row) {
    R s = a[row][4];
    for (int k = row + 1; k < 4; ++k) s -= a[row][k] * x[k];
    x[row] = s / a[row][row];
    c[row] = static_cast<double>(x[row]);
  }
  return c;
}

double poly_max_relative_error(const std::array<double, 4>& a) {
  auto err = [&](double f) { return std::fabs(poly(a, f) * std::exp(f) - 1.0); };
  constexpr int kSamples = 20000;
  double best = 0;
  for (int s = 0; s <= kSamples; ++s) {
    const double f0 = static_cast<double>(s) / kSamples;
    if (err(f0) < best) continue;
    // Golden-section refinement of the maximum on the neighbouring interval.
    const double f_max = golden_section_minimize([&](double f) { return -err(f); }, std::max(0.0, f0 - 1.0 / kSamples),
                                                 std::min(1.0, f0 + 1.0 / kSamples), 60);
    best = std::max({best, err(f0), err(f_max)});
  }
  return best;
}

SasBound SasBound::make(const SasParams& p) {
  SasBound b;
  b.n_r = p.n_r;
  const double poly_err = poly_max_relative_error(p.poly);
  double eps = poly_err;
  constexpr double u = 0x1p-53;
  if (!p.half) {
    eps = (1 + poly_err) * (1 + 8 * u) - 1;  // exp(-i), the Horner steps and the product in double
  } else {
    // binary16: y rounded (|dy| <= y 2^-11, y <= -n_r), LUT entry and product rounded (2^-11 each), Horner with 6
    // roundings: |POLY^ - POLY| <= gamma_6 (sum |a_k|) with gamma_6 = 6u/(1-6u), relative to POLY >= e^-1 (1 - poly_err).
    const double u16 = 0x1p-11;
    double sum_abs = 0;
    for (double a : p.poly) sum_abs += std::fabs(a);
    const double horner = 6 * u16 / (1 - 6 * u16) * sum_abs / (std::exp(-1.0) * (1 - poly_err));
    const double y_round = std::expm1(-p.n_r * u16);
    eps = (1 + poly_err) * (1 + horner) * (1 + y_round) * (1 + u16) * (1 + u16) * (1 + 4 * 0x1p-24) - 1;
  }
  b.eps = eps;
  b.sum_u = p.half ? 0x1p-24 : 0x1p-53;
  return b;
}

double SasBound::kappa(Eigen::Index valid) const {
  // p^/p = (1 + eps_j) S / S^ with S / K in [1, 1 + (L-1) e^{n_r}] and S^ / K in [1 - eps, 1 + eps] (plus the sum's
  // own rounding, (L + 2) u in binary32 for the half path, folded in below).
  const double dropped = static_cast<double>(valid - 1) * std::exp(n_r);
  const double sum_round = static_cast<double>(valid + 2) * sum_u;
  return (1 + eps) * (1 + dropped) * (1 + sum_round) / (1 - eps) - 1;
}

double SasBound::element(double p, double p_max, Eigen::Index valid) const {
  const double k = kappa(valid);
  // Entries below the threshold (p < e^{n_r} p_max) may be dropped: their error is then p itself.
  return p < std::exp(n_r) * p_max * (1 + eps) ? p * std::max(k, 1.0) : p * k;
}

double SasBound::row_l1(Eigen::Index valid) const { return kappa(valid) + static_cast<double>(valid - 1) * std::exp(n_r); }

}  // namespace qattn::ref
