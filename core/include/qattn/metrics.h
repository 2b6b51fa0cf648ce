// Error metrics between an output o and a reference r, on flattened arrays (docs/metrics.md).
//
//   CosSim      = sum(o r) / (||o|| ||r||)                 (SageAttention2 / IntAttention definition)
//   relative L1 = sum|o - r| / sum|r|
//   RMSE        = sqrt(mean((o - r)^2))
//   max_abs     = max|o - r|;  bias = mean(o - r);  median_abs = median|o - r| (mean of the two middle values)
//   histogram   = counts of |o - r| per binary order of magnitude, exact zeros apart (gemmlowp ResultStats style)
//   KL          = per row the generalised KL divergence of the method's P from the reference's,
//                 D(p || r) = sum_j p_j ln(p_j / r_j) - p_j + r_j >= 0 (kl_rows, kl_term)
//
// Accumulation: every sum is a Neumaier-compensated double sum, and norms are taken on inputs scaled by a power
// of two (exact), so no intermediate overflows for finite inputs and the results are within a few ulps of the
// exact values (tests/exact/metrics_exact_test.cc checks this against 50-digit arithmetic).
//
// Degenerate inputs (defined, never a crash):
//   - sizes differ: std::invalid_argument;
//   - empty: count = 0, every metric NaN;
//   - any NaN or +-inf in o or r: nonfinite = number of such positions, every metric NaN;
//   - r = 0 and o = 0: cossim 1, rel_l1 0;  exactly one of them all zero: cossim 0 (one_minus_cossim follows);
//   - r = 0, o != 0: rel_l1 = +inf.
#pragma once

#include <bit>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "qattn/tensor.h"

namespace qattn {

struct ErrorStats {
  std::int64_t count = 0;
  std::int64_t nonfinite = 0;
  double cossim = 0, rel_l1 = 0, rmse = 0, max_abs = 0, bias = 0, median_abs = 0;
  // 1 - cossim from the error's own sums, (||o - r||^2 - (||o|| - ||r||)^2) / (2 ||o|| ||r||), so that it keeps its
  // digits where cossim rounds to 1 (docs/metrics.md); 0 for o = r, 1 when exactly one of them is all zero.
  double one_minus_cossim = 0;
  // Power-of-two histogram of |o - r|: key k counts errors with 2^k <= |e| < 2^(k+1). zero_errors counts exact
  // matches, o == r or NaN in both; it is the one count kept when an element is non-finite.
  std::int64_t zero_errors = 0;
  std::map<int, std::int64_t> log2_histogram;
};

// std::ilogb of a finite nonzero double, read off its bits: the exponent field where it is normal, the position of
// the leading fraction bit where it is subnormal (the histogram's key, without a library call per value).
inline int binary_exponent(double x) {
  const std::uint64_t u = std::bit_cast<std::uint64_t>(x);
  const int field = static_cast<int>((u >> 52) & 0x7ff);
  if (field != 0) return field - 1023;
  return 63 - std::countl_zero(u & ((std::uint64_t{1} << 52) - 1)) - 1074;
}

// 1 - cos(o, r) from sums of power-of-two-scaled values: oo = sum (o 2^-eo)^2, rr = sum (r 2^-er)^2, sq = sum
// (|o - r| 2^-ee)^2, all > 0 (the degenerate cases are the caller's): with x = ||o - r||^2 / (||o|| ||r||) and
// rho = ||o|| / ||r||, it is (x - (rho - 1)^2 / rho) / 2, at least 0; 1 - cossim where x or rho is not a finite
// double (norms 2^1000 apart).
double one_minus_cossim_from_sums(double oo, int eo, double rr, int er, double sq, int ee, double cossim);

ErrorStats compare(std::span<const double> out, std::span<const double> ref);
// The same statistics of float32 values, read as they are (each widens to double exactly: the same result as
// compare() on the widened values).
ErrorStats compare(std::span<const float> out, std::span<const float> ref);

// The median of `values` (the mean of the two middle values for an even count; NaN for none), reordering them.
double median_in_place(std::vector<double>& values);

// The generalised KL divergence of a method's row p from the reference row r, natural log (docs/metrics.md):
//   D(p || r) = sum_j [p_j ln(p_j / r_j) - p_j + r_j],
// every term >= 0, so D >= 0 for any non-negative rows (normalised or not) and D = KL(p || r) where both sum to 1.
// Zeros: p_j = 0 contributes r_j (the reference's mass the method dropped: finite, so a quantised P with zeros gets
// a finite, informative value); r_j = 0 = p_j contributes 0 (masked); r_j = 0 < p_j makes the row +inf (mass where
// the reference has none). A negative or non-finite entry in either row makes that row NaN.
// kl_term is one term: near p = r it is evaluated as r f(x), x = (p - r) / r, f(x) = (1 + x) ln(1 + x) - x by its
// series, so that it keeps its relative accuracy where p ln(p / r) - p + r would cancel; never negative.
double kl_term(double p, double r);
// Per row D(p || r), as the mean and max over rows. Sizes must match.
struct KlStats {
  double mean = 0;  // over rows
  double max = 0;
};
KlStats kl_rows(const MatrixView& p_ref, const MatrixView& p);

// True when every entry is finite and >= 0 and every row sums to 1 within `tolerance`.
bool looks_like_probability_rows(const MatrixView& m, double tolerance = 1e-2);

}  // namespace qattn
