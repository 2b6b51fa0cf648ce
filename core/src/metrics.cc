#include "qattn/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace qattn {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Neumaier's variant of Kahan summation: error <= 2u |sum| + O(n u^2) sum|x_i|.
class CompensatedSum {
 public:
  void add(double x) {
    const double t = sum_ + x;
    if (!std::isfinite(t)) {  // inf/NaN: the compensation term would turn inf into NaN
      sum_ = t;
      return;
    }
    comp_ += std::fabs(sum_) >= std::fabs(x) ? (sum_ - t) + x : (x - t) + sum_;
    sum_ = t;
  }
  double value() const { return sum_ + comp_; }

 private:
  double sum_ = 0, comp_ = 0;
};

// 2^k with 2^k <= max|x| (or 1 for all zeros): dividing by it is exact and keeps squares in range.
double power_of_two_scale(double max_abs) { return max_abs > 0 && std::isfinite(max_abs) ? std::ldexp(1.0, std::ilogb(max_abs)) : 1.0; }

// x / scale for a power of two `scale`, as a multiplication by 1 / scale where that is a double (the same real value,
// rounded once either way), so the loops below do not divide.
class DivideByPowerOfTwo {
 public:
  explicit DivideByPowerOfTwo(double scale) : scale_(scale), inverse_(1 / scale), exact_(std::isfinite(1 / scale)) {}
  double operator()(double x) const { return exact_ ? x * inverse_ : x / scale_; }

 private:
  double scale_, inverse_;
  bool exact_;
};

template <class T>
ErrorStats compare_values(std::span<const T> out_values, std::span<const T> ref_values) {
  // Every access widens to double, so both element types compute the same statistics of the same numbers.
  const auto out = [&](std::size_t i) { return static_cast<double>(out_values[i]); };
  const auto ref = [&](std::size_t i) { return static_cast<double>(ref_values[i]); };
  const std::size_t size = out_values.size();
  if (size != ref_values.size())
    throw std::invalid_argument("compare: sizes differ (" + std::to_string(size) + " vs " +
                                std::to_string(ref_values.size()) + ")");
  ErrorStats s;
  s.count = static_cast<std::int64_t>(size);
  for (std::size_t i = 0; i < size; ++i)
    if (!std::isfinite(out(i)) || !std::isfinite(ref(i))) ++s.nonfinite;
  if (s.count == 0 || s.nonfinite > 0) {
    // The distances are undefined, but which elements agree is not: equal values, or NaN in both.
    for (std::size_t i = 0; i < size; ++i)
      if (out(i) == ref(i) || (std::isnan(out(i)) && std::isnan(ref(i)))) ++s.zero_errors;
    s.cossim = s.rel_l1 = s.rmse = s.max_abs = s.bias = s.median_abs = s.one_minus_cossim = kNaN;
    return s;
  }
  double max_o = 0, max_r = 0, max_e = 0;
  std::vector<double> abs_err(size);
  for (std::size_t i = 0; i < size; ++i) {
    max_o = std::max(max_o, std::fabs(out(i)));
    max_r = std::max(max_r, std::fabs(ref(i)));
    abs_err[i] = std::fabs(out(i) - ref(i));  // +inf only if |o - r| > DBL_MAX: then rmse and max_abs are +inf
    max_e = std::max(max_e, abs_err[i]);
  }
  const double se = power_of_two_scale(max_e);
  const DivideByPowerOfTwo by_so(power_of_two_scale(max_o)), by_sr(power_of_two_scale(max_r)), by_se(se);
  CompensatedSum dot, oo, rr, l1, r1, sq, signed_err;
  for (std::size_t i = 0; i < size; ++i) {
    const double o = by_so(out(i)), r = by_sr(ref(i)), e = by_se(abs_err[i]);
    dot.add(o * r);
    oo.add(o * o);
    rr.add(r * r);
    l1.add(abs_err[i]);
    r1.add(std::fabs(ref(i)));
    sq.add(e * e);
    signed_err.add(out(i) - ref(i));
  }
  const double n = static_cast<double>(s.count);
  if (max_o == 0 && max_r == 0) s.cossim = 1.0;
  else if (max_o == 0 || max_r == 0) s.cossim = 0.0;
  else s.cossim = dot.value() / (std::sqrt(oo.value()) * std::sqrt(rr.value()));
  if (max_o == 0 || max_r == 0 || !std::isfinite(max_e)) s.one_minus_cossim = 1 - s.cossim;
  else if (max_e == 0) s.one_minus_cossim = 0;
  else
    s.one_minus_cossim = one_minus_cossim_from_sums(oo.value(), std::ilogb(power_of_two_scale(max_o)), rr.value(),
                                                    std::ilogb(power_of_two_scale(max_r)), sq.value(), std::ilogb(se),
                                                    s.cossim);
  const double l1v = l1.value(), r1v = r1.value();
  s.rel_l1 = r1v > 0 ? l1v / r1v : (l1v == 0 ? 0.0 : std::numeric_limits<double>::infinity());
  s.rmse = se * std::sqrt(sq.value() / n);
  s.max_abs = max_e;
  s.bias = signed_err.value() / n;
  // Counted in an array over every exponent a finite double has (-1074 to 1023), then moved into the map; an
  // infinite error (|o - r| > DBL_MAX) keeps std::ilogb's key, INT_MAX.
  constexpr int kMinExponent = -1074, kMaxExponent = 1023;
  std::vector<std::int64_t> counts(kMaxExponent - kMinExponent + 1, 0);
  for (double e : abs_err) {
    if (e == 0) ++s.zero_errors;
    else if (std::isinf(e)) ++s.log2_histogram[std::ilogb(e)];
    else ++counts[static_cast<std::size_t>(binary_exponent(e) - kMinExponent)];
  }
  for (std::size_t k = 0; k < counts.size(); ++k)
    if (counts[k] != 0) s.log2_histogram[static_cast<int>(k) + kMinExponent] = counts[k];
  s.median_abs = median_in_place(abs_err);
  return s;
}

}  // namespace

double median_in_place(std::vector<double>& values) {
  if (values.empty()) return kNaN;
  const std::size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return lower + (upper - lower) / 2;
}

double one_minus_cossim_from_sums(double oo, int eo, double rr, int er, double sq, int ee, double cossim) {
  const double no = std::sqrt(oo), nr = std::sqrt(rr);         // ||o|| 2^-eo, ||r|| 2^-er
  const double x = std::ldexp(sq / (no * nr), 2 * ee - eo - er);  // ||o - r||^2 / (||o|| ||r||)
  const double rho = std::ldexp(no / nr, eo - er);                // ||o|| / ||r||
  if (!std::isfinite(x) || !std::isfinite(rho) || rho == 0) return 1 - cossim;
  return std::max(0.0, (x - (rho - 1) * (rho - 1) / rho) / 2);
}

ErrorStats compare(std::span<const double> out, std::span<const double> ref) { return compare_values(out, ref); }
ErrorStats compare(std::span<const float> out, std::span<const float> ref) { return compare_values(out, ref); }

double kl_term(double p, double r) {
  if (p == 0) return r;
  if (r == 0) return std::numeric_limits<double>::infinity();
  const double x = (p - r) / r;
  if (std::fabs(x) < 0x1p-6) {
    // f(x) = (1 + x) ln(1 + x) - x = sum_{n >= 2} (-1)^n x^n / (n (n - 1)); |x| < 2^-6, so the terms past x^8
    // are below 2^-36 of the first
    // A term below f 2^-55 (under a quarter of f's ulp) leaves f as it is, and so does every later one (each is
    // below 2^-6 of the one before), so the sum stops there with the bits of all eight terms.
    double f = 0, xn = x * x;
    for (int n = 2; n <= 9; ++n, xn *= x) {
      const double term = (n % 2 == 0 ? xn : -xn) / (n * (n - 1));
      if (std::fabs(term) < f * 0x1p-55) break;
      f += term;
    }
    return r * f;
  }
  const double t = p * std::log(p / r) - p + r;
  return t > 0 ? t : 0;
}

KlStats kl_rows(const MatrixView& p_ref, const MatrixView& p) {
  if (p_ref.rows() != p.rows() || p_ref.cols() != p.cols())
    throw std::invalid_argument("kl_rows: shapes differ");
  KlStats k;
  if (p.rows() == 0) return {kNaN, kNaN};
  CompensatedSum total;
  for (Eigen::Index i = 0; i < p.rows(); ++i) {
    CompensatedSum row;
    bool bad = false;
    for (Eigen::Index j = 0; j < p.cols(); ++j) {
      const double a = p_ref(i, j), b = p(i, j);
      if (!(a >= 0) || !(b >= 0) || !std::isfinite(a) || !std::isfinite(b)) bad = true;
      else row.add(kl_term(b, a));
    }
    const double v = bad ? kNaN : row.value();
    total.add(v);
    if (std::isnan(v) || std::isnan(k.max)) k.max = kNaN;
    else if (i == 0 || v > k.max) k.max = v;
  }
  k.mean = total.value() / static_cast<double>(p.rows());
  return k;
}

bool looks_like_probability_rows(const MatrixView& m, double tolerance) {
  for (Eigen::Index i = 0; i < m.rows(); ++i) {
    CompensatedSum s;
    for (Eigen::Index j = 0; j < m.cols(); ++j) {
      const double v = m(i, j);
      if (!std::isfinite(v) || v < 0) return false;
      s.add(v);
    }
    if (std::fabs(s.value() - 1.0) > tolerance) return false;
  }
  return m.size() > 0;
}

}  // namespace qattn
