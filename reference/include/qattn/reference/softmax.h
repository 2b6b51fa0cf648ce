// Floating-point softmax references (docs/softmax-reference.md).
//
// softmax_ref<Scalar>(row): the max-subtracted softmax in Scalar arithmetic (float, double, or a Boost
// multiprecision type):
//     m = max_i x_i;  e_i = exp(x_i - m);  s = pairwise_sum(e);  p_i = e_i / s
// exp is the Scalar's own exp (std::exp, i.e. glibc's correctly-rounded-within-1-ulp exp/expf for float and
// double; Boost's for multiprecision), one rounding per operation.
//
// softmax_exact<Real>(row): the same function in 50-digit arithmetic (Real = cpp_bin_float_50, or
// boost::multiprecision::mpfr_float_50 when built with MPFR): d_i = x_i - m and e_i = exp(d_i) in Real, a plain
// sequential sum in Real, p_i = e_i / s. Each step has relative error about 1e-49, so the result is exact to far
// below any double-precision rounding (relative error < 1e-45 for every representable p_i).
//
// Special rows, identical for both:
//   - masked entries are -inf and give p_i = 0 exactly;
//   - a fully masked row (all -inf) gives all zeros, never NaN (no division happens);
//   - a row containing NaN or +inf gives all NaN;
//   - an empty row gives an empty result.
//
// Error contract of softmax_ref<Scalar> for Scalar in {float, double}, every finite row of length L:
//     |p^_i - p_i| <= eps_i p_i + tau,   eps_i = u (ln(1/p_i) + ln L + pairwise_depth(L) + 6)
// with u = epsilon/2 (2^-53 double, 2^-24 float) and tau = 4 * denorm_min. Derivation in
// docs/softmax-reference.md; the same numbers sit in tests/exact/softmax_contract_test.cc.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "qattn/reference/pairwise_sum.h"

namespace qattn::ref {

using Exact50 = boost::multiprecision::cpp_bin_float_50;

namespace detail {
template <class Scalar>
bool is_nan_or_pos_inf(const Scalar& x) {
  using std::isinf;
  using std::isnan;
  return isnan(x) || (isinf(x) && x > 0);
}
}  // namespace detail

// One row. Returns a row vector of the same Scalar.
template <class Derived>
Eigen::Matrix<typename Derived::Scalar, 1, Eigen::Dynamic> softmax_ref(const Eigen::MatrixBase<Derived>& row) {
  using Scalar = typename Derived::Scalar;
  using std::exp;
  const Eigen::Index n = row.size();
  Eigen::Matrix<Scalar, 1, Eigen::Dynamic> p(n);
  Scalar m = -std::numeric_limits<Scalar>::infinity();
  for (Eigen::Index i = 0; i < n; ++i) {
    const Scalar x = row(i);
    if (detail::is_nan_or_pos_inf(x)) {
      p.setConstant(std::numeric_limits<Scalar>::quiet_NaN());
      return p;
    }
    if (x > m) m = x;
  }
  if (n == 0 || m == -std::numeric_limits<Scalar>::infinity()) {
    p.setZero();  // fully masked
    return p;
  }
  for (Eigen::Index i = 0; i < n; ++i) p(i) = Scalar(exp(Scalar(row(i) - m)));
  const Scalar s = pairwise_sum(p.data(), n);
  for (Eigen::Index i = 0; i < n; ++i) p(i) = Scalar(p(i) / s);
  return p;
}

// Row-wise over a matrix [rows, L].
template <class Derived>
Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> softmax_ref_rows(
    const Eigen::MatrixBase<Derived>& x) {
  Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> p(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) p.row(r) = softmax_ref(x.row(r));
  return p;
}

// Exact reference over a row of doubles, in `Real`.
template <class Real = Exact50>
std::vector<Real> softmax_exact(std::span<const double> row) {
  using std::exp;
  std::vector<Real> p(row.size(), Real(0));
  bool any_finite = false;
  double m = -std::numeric_limits<double>::infinity();
  for (double x : row) {
    if (std::isnan(x) || x == std::numeric_limits<double>::infinity()) {
      std::fill(p.begin(), p.end(), Real(std::numeric_limits<double>::quiet_NaN()));
      return p;
    }
    if (std::isfinite(x)) {
      any_finite = true;
      m = std::max(m, x);
    }
  }
  if (!any_finite) return p;  // empty or fully masked: zeros
  Real s = 0;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (std::isfinite(row[i])) {
      p[i] = exp(Real(Real(row[i]) - Real(m)));
      s += p[i];
    }
  }
  for (Real& v : p) v /= s;
  return p;
}

// The declared contract above, evaluated. Kept beside the code it describes; the test table restates it.
template <class Scalar>
struct SoftmaxRefContract {
  static constexpr double u = std::numeric_limits<Scalar>::epsilon() / 2;
  static constexpr double tau = 4.0 * std::numeric_limits<Scalar>::denorm_min();
  // Relative part eps_i for an exact probability p in (0, 1] in a row of length L.
  static double eps(double p, Eigen::Index L) {
    return u * (std::log(1.0 / p) + std::log(static_cast<double>(L)) + pairwise_depth(L) + 6.0);
  }
  static double bound(double p, Eigen::Index L) { return p > 0 ? eps(p, L) * p + tau : tau; }
};

}  // namespace qattn::ref
