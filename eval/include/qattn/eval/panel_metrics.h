// Error metrics accumulated panel by panel, so that a streamed evaluation (docs/streaming.md) never holds an
// [L_q, L_k] matrix and still gives the same figures whatever its block size, thread count or shard.
//
// A panel is a fixed set of consecutive values: the rows [64 i, 64 i + 64) of one batch entry of one head. Each
// panel's statistics (PanelStats) depend on that panel's values alone; a head's statistics are the panels folded
// in one fixed order (batch entry, then row), each fold one MetricFold::add. Blocks of any multiple of 64 rows,
// computed on any thread in any order, fill the same panels with the same values, so the fold is the same.
//
// The figures are those of qattn::compare (qattn/metrics.h, docs/metrics.md): the same terms, Neumaier-compensated,
// norms taken on values scaled by a power of two (each panel by its own, rescaled exactly as the fold meets a larger
// one), and the same degenerate cases. Only the order of the additions differs from compare's one pass, so a
// figure can move in its last ulps, never more than two compensated sums' error bounds.
//
// Two statistics cannot be folded from partial sums:
//  - the median |o - r|: with keep_errors the fold keeps every |o - r| and the median is exact; without it (what
//    the streamed evaluation uses, for O and P alike), |o - r| is counted in buckets of its exponent and 11 leading
//    fraction bits, and the median reported is the midpoint of the bucket that holds it (for an even count, the
//    mean of the two middle values' midpoints): within 2^-12 of the exact median, relative, and exact where it is 0;
//  - nothing else: the power-of-two histogram, zero_errors, count, nonfinite and max_abs are counts and maxima.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <map>
#include <vector>

#include "qattn/metrics.h"

namespace qattn::eval {

// Rows of one panel.
inline constexpr long kPanelRows = 64;

// A Neumaier-compensated sum of terms scaled by 2^-exponent (exact power-of-two scaling).
struct ScaledSum {
  double sum = 0, comp = 0;
  void add(double x) {
    const double t = sum + x;
    if (!std::isfinite(t)) {  // inf/NaN: the compensation term would turn inf into NaN
      sum = t;
      comp = 0;
      return;
    }
    comp += std::fabs(sum) >= std::fabs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  double value() const { return sum + comp; }
  // The same sum expressed at a larger exponent: both parts times 2^(from - to), exact unless they underflow.
  void rescale(int from, int to);
};

// The partial statistics of one panel's values.
struct PanelStats {
  std::int64_t count = 0, nonfinite = 0, zero_errors = 0;
  double max_o = 0, max_r = 0, max_e = 0;
  int eo = 0, er = 0, ee = 0;        // exponents of the panel's maxima (0 for an all-zero panel)
  ScaledSum dot, oo, rr, sq;         // sum o r 2^-(eo+er), o^2 2^-2eo, r^2 2^-2er, e^2 2^-2ee
  ScaledSum l1, r1, signed_err;      // sum |o - r|, |r|, o - r, unscaled
  std::map<int, std::int64_t> log2_histogram;
  // D(p || p_ref) of the panel's probability rows (kl_rows' definition), when they are rows of P.
  std::int64_t kl_rows = 0;
  ScaledSum kl_sum;
  double kl_max = 0;
  bool kl_nan = false;
};

// The statistics of `n` values out[i] vs ref[i] (any stride: element i at out[i * stride]).
PanelStats panel_stats(const double* out, const double* ref, std::size_t n);
// Adds the KL terms of P's rows [rows, cols] (row-major, packed) to `s`.
void add_panel_kl(PanelStats& s, const double* p, const double* p_ref, long rows, long cols);

// The fold of a head's panels. add() the panels in their fixed order; errors() / buckets take the |o - r| values
// of the median (in any order: they are sorted or counted).
class MetricFold {
 public:
  explicit MetricFold(bool keep_errors) : keep_errors_(keep_errors) {}
  void add(const PanelStats& panel);
  // The |o - r| of n values (for the median): appended (keep_errors) or counted in buckets.
  void add_errors(const double* out, const double* ref, std::size_t n);
  void merge_errors(const MetricFold& other);  // another fold's median values, e.g. another thread's
  ErrorStats stats() const;
  KlStats kl() const;

 private:
  bool keep_errors_;
  PanelStats total_;
  bool any_ = false;
  std::vector<double> errors_;
  // Counts per bucket key: 0 for |o - r| = 0, else (|o - r|'s bits >> 41) + 1 (its exponent and 11 leading fraction
  // bits), as rows of 2048 keys allocated where a key of the row occurs (2^11 rows: every exponent).
  using BucketRow = std::array<std::int64_t, 2048>;
  std::vector<std::unique_ptr<BucketRow>> buckets_ = std::vector<std::unique_ptr<BucketRow>>(2049);
};

}  // namespace qattn::eval
