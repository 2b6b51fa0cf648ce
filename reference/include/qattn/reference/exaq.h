// EXAQ: softmax with the max-subtracted logits quantised to 2-4 bits before exp (docs/methods/exaq.md).
//
// For one attention call (a matrix of logit rows) with x = s - rowmax(s) <= 0 on valid entries:
//   (1) sigma = unbiased std of x over the scope (the whole call, or one row); lo_data = min x over the same scope
//   (2) C = clip rule(sigma): gauss a_b sigma + c_b, laplace a_b sigma_L + c_b, optimal (an ACIQ-style error on x),
//       eq14 (Eq. 14 as printed, an error after exp: exaq_clipping.h), fixed, none
//   (3) quantise x onto 2^b levels, by the upstream grid or the paper's grid:
//         upstream: lo = max(lo_data, C), x clipped to [lo, 0], a = (2^b - 1) / (0 - lo),
//                   q = round_half_even((x - lo) a), x^ = q / a + lo                  (both ends on the grid)
//         paper:    D = -C / 2^b, q = clamp(floor((x - C) / D), 0, 2^b - 1), x^ = C + (q + 1/2) D   (midpoints)
//   (4) e = LUT_exp[q] = exp(x^[q]) (x^ optionally rounded to bfloat16 first, as upstream casts it)
//   (5) p = e / sum e, the sum either in floating point, or over the LUT values in Q24 fixed point, directly or
//       through the paper's LUT_sum over packed codes (four 2-bit, two 3-bit or two 4-bit codes per byte); the two
//       fixed-point sums are integer sums and so exactly equal.
// Masked (-inf) entries are excluded from every statistic and get p = 0; a fully masked row is all zeros.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qattn/tensor.h"

namespace qattn::ref {

enum class ExaqClip { gauss, laplace, optimal, eq14, fixed, none };
enum class ExaqScope { tensor, row };
enum class ExaqGrid { upstream, paper };
enum class ExaqSum { fp, q24_direct, q24_lutsum };

struct ExaqParams {
  int bits = 2;  // 2, 3 or 4
  ExaqClip clip = ExaqClip::gauss;
  double fixed_c = -4.0;  // for ExaqClip::fixed (< 0)
  ExaqScope scope = ExaqScope::tensor;
  ExaqGrid grid = ExaqGrid::upstream;
  bool xhat_bf16 = false;  // round x^ to bfloat16 before exp (upstream)
  ExaqSum sum = ExaqSum::fp;
};

// Clip of the gauss and laplace rules: the paper's Table 1 for gauss at 2 and 3 bits; the gauss 4-bit line and both
// laplace lines are the official code's, not the paper's (docs/methods/exaq.md). nullopt where neither gives one
// (laplace 3-bit).
std::optional<double> exaq_table_clip(ExaqClip rule, int bits, double sigma);

// Optimal clip for Gaussian data from our Eq. 14 solver (exaq_clipping.h) under the assumption mu = -sigma E[max of
// n N(0,1)], n = the scope's mean row length, with the quantisation noise of the chosen grid.
double exaq_optimal_clip(const ExaqParams& p, double sigma, int n);
// Eq. 14 as printed (exaq_solve_clip_eq14) under the same mu = -sigma E[max of n N(0, 1)] as exaq_optimal_clip.
double exaq_eq14_clip(const ExaqParams& p, double sigma, int n);

// Statistics of one scope, as the method computes them.
struct ExaqStats {
  double sigma = 0, sigma_laplace = 0, min = 0;
  long count = 0;
};
ExaqStats exaq_stats(const MatrixView& x_max_subtracted, Eigen::Index row_begin, Eigen::Index row_end);
// exaq_stats gathered over blocks of a scope's rows, the blocks in row order: every block through add_first (sum,
// minimum, count), then begin_second (the mean), then every block through add_second (squared and absolute
// deviations from it). The sums run in the same order as exaq_stats over the whole scope, so stats() has its bits.
class ExaqStatsAccumulator {
 public:
  void add_first(const MatrixView& x_max_subtracted);
  void begin_second();
  void add_second(const MatrixView& x_max_subtracted);
  ExaqStats stats() const;
  Eigen::Index rows() const { return rows_; }

 private:
  ExaqStats s_;
  double sum_ = 0, mean_ = 0, sq_ = 0, ad_ = 0;
  Eigen::Index rows_ = 0;
};
// Each row of logits minus its maximum (masked -inf entries stay -inf); std::invalid_argument for NaN or +inf.
RowMatrixXd exaq_max_subtracted(const MatrixView& logits);
// The statistics of a whole call (sigma=tensor) and its number of rows, for a softmax of a block of its rows.
struct ExaqTensorScope {
  ExaqStats stats;
  Eigen::Index rows = 0;
};

// The 2^b reconstruction levels x^[q] for a scope with clip C and data minimum lo_data.
std::vector<double> exaq_levels(const ExaqParams& p, double clip, double lo_data);
// Index of one value x <= 0 on those levels.
int exaq_code(const ExaqParams& p, double clip, double lo_data, double x);

// Q24 fixed-point LUT values round(exp(x^[q] - max x^) 2^24), relative to the top level and the denominator of a row of codes, directly and via the
// packed LUT_sum. Codes are in [0, 2^bits).
std::vector<std::int64_t> exaq_lut_q24(const std::vector<double>& levels);
std::int64_t exaq_sum_direct(const std::vector<int>& codes, const std::vector<std::int64_t>& lut);
std::int64_t exaq_sum_packed(const std::vector<int>& codes, const std::vector<std::int64_t>& lut, int bits);

class ExaqCalibrator;

// The whole method on one call. Returns probabilities. `c_used` (optional) receives the clip of each scope. With a
// calibrator (tensor scope only), the (C, lo_data) of this call pass through it: recorded during its first calls,
// replaced by their means afterwards.
// With `tensor` (sigma=tensor, no calibrator), logits are a block of rows of a call whose statistics it holds.
RowMatrixXd exaq_softmax(const MatrixView& logits, const ExaqParams& p, std::vector<double>* c_used = nullptr,
                         ExaqCalibrator* calibrator = nullptr, const ExaqTensorScope* tensor = nullptr);

// Declared contract (docs/methods/exaq.md §5) for one scope whose grid spans [lo, 0] with step D (upstream:
// lo = max(min x, C), D = -lo / (2^b - 1); paper: lo = C, D = -C / 2^b). With d = D/2 + |lo| 2^-8 [bf16 x^] and
// n_low = entries below lo in the row, for a row of L valid entries:
//   entry in [lo, 0]: |p^ - p| <= p max(e^{2d} - 1, 1 - e^{-d} / (e^{d} + n_low e^{lo + d})) + tau
//   entry below lo:   |p^ - p| <= e^{lo + 2d} + tau
// tau covers the arithmetic: (L + 2) 4u for the FP sum; 1.01 * 2^-25 (1 + L) for the Q24 LUT values.
struct ExaqBound {
  double lo = 0, d = 0, tau = 0;
  static ExaqBound make(const ExaqParams& p, double clip, double lo_data, Eigen::Index valid);
  double element(double p, double x, Eigen::Index below_lo) const;
};

// Calibration (upstream): the first `calls` calls record (C, lo_data) per call; afterwards their means are used.
class ExaqCalibrator {
 public:
  explicit ExaqCalibrator(int calls) : calls_(calls) {}
  // Returns the (C, lo_data) to use for this call given the values measured on it.
  std::pair<double, double> use(double c_measured, double lo_measured);
  bool frozen() const { return seen_ >= calls_; }

 private:
  int calls_, seen_ = 0;
  double c_sum_ = 0, lo_sum_ = 0;
};

}  // namespace qattn::ref
