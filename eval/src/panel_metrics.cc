#include "qattn/eval/panel_metrics.h"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <limits>

namespace qattn::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The exponent of an all-zero panel's maximum: below every real one, and summable twice without overflow.
constexpr int kNoExponent = INT_MIN / 4;

// std::ilogb of max|x| for a finite maximum > 0; kNoExponent for 0; 0 for +inf (compare's scale 1 there).
int exponent_of_max(double max_abs) {
  if (max_abs == 0) return kNoExponent;
  if (!std::isfinite(max_abs)) return 0;
  return std::ilogb(max_abs);
}

// x 2^-e: a multiplication by 2^-e where that is a finite double, a division by 2^e otherwise (one rounding either
// way, none for normal results).
class ScaleDown {
 public:
  explicit ScaleDown(int e)
      : e_(e == kNoExponent ? 0 : e), inverse_(std::ldexp(1.0, -e_)), exact_(std::isfinite(inverse_) && inverse_ != 0) {}
  double operator()(double x) const { return exact_ ? x * inverse_ : std::ldexp(x, -e_); }

 private:
  int e_;
  double inverse_;
  bool exact_;
};

void add_scaled(ScaledSum& total, int total_exponent, const ScaledSum& part, int part_exponent) {
  // total is already at total_exponent >= part_exponent
  if (part.sum == 0 && part.comp == 0) return;
  total.add(std::ldexp(part.sum, part_exponent - total_exponent));
  total.add(std::ldexp(part.comp, part_exponent - total_exponent));
}

}  // namespace

void ScaledSum::rescale(int from, int to) {
  if (from == to || (sum == 0 && comp == 0) || !std::isfinite(sum)) return;
  sum = std::ldexp(sum, from - to);
  comp = std::ldexp(comp, from - to);
}

namespace {

// Two compensated sums side by side in one vector of two doubles (GCC's vector extensions: SSE2 on x86-64, NEON on
// AArch64): each lane performs ScaledSum::add's operations, without its finiteness check, on its own sum, so it
// gives the same bits as two scalar sums (while every partial sum is finite), with half the instructions.
using Double2 = double __attribute__((vector_size(16)));
using Mask2 = std::int64_t __attribute__((vector_size(16)));

inline Double2 abs2(Double2 x) {
  return reinterpret_cast<Double2>(reinterpret_cast<Mask2>(x) & Mask2{INT64_MAX, INT64_MAX});
}

struct ScaledSum2 {
  Double2 sum{0, 0}, comp{0, 0};
  void add(Double2 x) {
    const Double2 t = sum + x;
    const Double2 larger_sum = (sum - t) + x, larger_x = (x - t) + sum;
    const Mask2 pick_sum = abs2(sum) >= abs2(x);  // all ones where |sum| >= |x|
    comp += reinterpret_cast<Double2>((reinterpret_cast<Mask2>(larger_sum) & pick_sum) |
                                      (reinterpret_cast<Mask2>(larger_x) & ~pick_sum));
    sum = t;
  }
  ScaledSum lane(int i) const {
    ScaledSum s;
    s.sum = sum[i], s.comp = comp[i];
    return s;
  }
};

constexpr int kMinExponent = -1074, kMaxExponent = 1023;
// One count per exponent a finite double has, and one slot (the last) where the zero errors go uncounted.
using ExponentCounts = std::array<std::int64_t, kMaxExponent - kMinExponent + 2>;
constexpr std::size_t kZeroSlot = kMaxExponent - kMinExponent + 1;

// The seven sums and the histogram of one panel (its maxima and exponents set). With Checked false the sums skip
// ScaledSum::add's finiteness check (ScaledSum2): that gives add()'s bits while every partial sum is finite, and once
// one is not the sum stays non-finite, so the caller starts again with Checked true if any sum ends non-finite.
template <bool Checked>
void accumulate(PanelStats& s, const double* out, const double* ref, std::size_t n, ExponentCounts& counts,
                std::int64_t& infinite) {
  const ScaleDown by_o(s.eo), by_r(s.er), by_e(s.ee);
  if constexpr (!Checked) {  // the seven sums in four pairs: (dot, oo), (rr, sq), (l1, r1), (signed_err, unused)
    ScaledSum2 dot_oo, rr_sq, l1_r1, signed_unused;
    for (std::size_t i = 0; i < n; ++i) {
      const double o = by_o(out[i]), r = by_r(ref[i]), abs_err = std::fabs(out[i] - ref[i]), e = by_e(abs_err);
      dot_oo.add(Double2{o, o} * Double2{r, o});
      rr_sq.add(Double2{r, e} * Double2{r, e});
      l1_r1.add(Double2{abs_err, std::fabs(ref[i])});
      signed_unused.add(Double2{out[i] - ref[i], 0});
      if (std::isinf(abs_err)) {
        ++infinite;
        continue;
      }
      ++counts[abs_err == 0 ? kZeroSlot : static_cast<std::size_t>(binary_exponent(abs_err) - kMinExponent)];
    }
    s.dot = dot_oo.lane(0), s.oo = dot_oo.lane(1), s.rr = rr_sq.lane(0), s.sq = rr_sq.lane(1);
    s.l1 = l1_r1.lane(0), s.r1 = l1_r1.lane(1), s.signed_err = signed_unused.lane(0);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double o = by_o(out[i]), r = by_r(ref[i]), abs_err = std::fabs(out[i] - ref[i]), e = by_e(abs_err);
    s.dot.add(o * r);
    s.oo.add(o * o);
    s.rr.add(r * r);
    s.l1.add(abs_err);
    s.r1.add(std::fabs(ref[i]));
    s.sq.add(e * e);
    s.signed_err.add(out[i] - ref[i]);
    if (std::isinf(abs_err)) {
      ++infinite;
      continue;
    }
    ++counts[abs_err == 0 ? kZeroSlot : static_cast<std::size_t>(binary_exponent(abs_err) - kMinExponent)];
  }
}

bool all_finite(const PanelStats& s) {
  for (const ScaledSum* sum : {&s.dot, &s.oo, &s.rr, &s.l1, &s.r1, &s.sq, &s.signed_err})
    if (!std::isfinite(sum->sum) || !std::isfinite(sum->comp)) return false;
  return true;
}

}  // namespace

PanelStats panel_stats(const double* out, const double* ref, std::size_t n) {
  PanelStats s;
  s.count = static_cast<std::int64_t>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double o = out[i], r = ref[i];
    if (!std::isfinite(o) || !std::isfinite(r)) ++s.nonfinite;
    if (o == r || (std::isnan(o) && std::isnan(r))) ++s.zero_errors;
    s.max_o = std::max(s.max_o, std::fabs(o));
    s.max_r = std::max(s.max_r, std::fabs(r));
    s.max_e = std::max(s.max_e, std::fabs(o - r));
  }
  if (s.nonfinite > 0) {  // the head's distances are undefined: only the counts matter
    s.max_o = s.max_r = s.max_e = 0;
    return s;
  }
  s.eo = exponent_of_max(s.max_o), s.er = exponent_of_max(s.max_r), s.ee = exponent_of_max(s.max_e);
  // The histogram counted in an array over every exponent a finite double has, then moved into the map (as compare
  // does); an infinite error keeps std::ilogb's key, INT_MAX.
  ExponentCounts counts{};
  std::int64_t infinite = 0;
  accumulate<false>(s, out, ref, n, counts, infinite);
  if (!all_finite(s)) {  // a partial sum overflowed: again with ScaledSum::add's handling of it
    for (ScaledSum* sum : {&s.dot, &s.oo, &s.rr, &s.l1, &s.r1, &s.sq, &s.signed_err}) *sum = ScaledSum{};
    counts.fill(0);
    infinite = 0;
    accumulate<true>(s, out, ref, n, counts, infinite);
  }
  for (std::size_t k = 0; k < kZeroSlot; ++k)
    if (counts[k] != 0) s.log2_histogram[static_cast<int>(k) + kMinExponent] = counts[k];
  if (infinite) s.log2_histogram[std::ilogb(INFINITY)] = infinite;
  return s;
}

void add_panel_kl(PanelStats& s, const double* p, const double* p_ref, long rows, long cols) {
  // kl_rows (core/src/metrics.cc), row by row: the same terms in the same order
  for (long i = 0; i < rows; ++i) {
    ScaledSum row;
    bool bad = false;
    for (long j = 0; j < cols; ++j) {
      const double a = p_ref[i * cols + j], b = p[i * cols + j];
      if (!(a >= 0) || !(b >= 0) || !std::isfinite(a) || !std::isfinite(b)) bad = true;
      else row.add(kl_term(b, a));
    }
    const double v = bad ? kNaN : row.value();
    s.kl_sum.add(v);
    if (std::isnan(v)) s.kl_nan = true;
    else if (s.kl_rows == 0 || v > s.kl_max) s.kl_max = v;
    ++s.kl_rows;
  }
}

void MetricFold::add(const PanelStats& p) {
  PanelStats& t = total_;
  t.count += p.count;
  t.nonfinite += p.nonfinite;
  t.zero_errors += p.zero_errors;
  for (const auto& [k, n] : p.log2_histogram) t.log2_histogram[k] += n;
  // KL: a sum of row values, in row order
  if (p.kl_rows > 0) {
    if (p.kl_nan) t.kl_nan = true;
    else if (t.kl_rows == 0 || p.kl_max > t.kl_max) t.kl_max = p.kl_max;
    t.kl_sum.add(p.kl_sum.sum);
    t.kl_sum.add(p.kl_sum.comp);
    t.kl_rows += p.kl_rows;
  }
  if (p.nonfinite > 0 || t.nonfinite > 0) {
    any_ = true;
    return;
  }
  if (!any_) {
    const std::map<int, std::int64_t> histogram = t.log2_histogram;
    const std::int64_t count = t.count, zeros = t.zero_errors, kl_rows = t.kl_rows;
    const ScaledSum kl_sum = t.kl_sum;
    const double kl_max = t.kl_max;
    const bool kl_nan = t.kl_nan;
    t = p;
    t.count = count, t.zero_errors = zeros, t.log2_histogram = histogram;
    t.kl_rows = kl_rows, t.kl_sum = kl_sum, t.kl_max = kl_max, t.kl_nan = kl_nan;
    any_ = true;
    return;
  }
  // Bring the running sums to the larger exponents, then add the panel's at them.
  const int eo = std::max(t.eo, p.eo), er = std::max(t.er, p.er), ee = std::max(t.ee, p.ee);
  t.dot.rescale(t.eo + t.er, eo + er);
  t.oo.rescale(2 * t.eo, 2 * eo);
  t.rr.rescale(2 * t.er, 2 * er);
  t.sq.rescale(2 * t.ee, 2 * ee);
  add_scaled(t.dot, eo + er, p.dot, p.eo + p.er);
  add_scaled(t.oo, 2 * eo, p.oo, 2 * p.eo);
  add_scaled(t.rr, 2 * er, p.rr, 2 * p.er);
  add_scaled(t.sq, 2 * ee, p.sq, 2 * p.ee);
  t.eo = eo, t.er = er, t.ee = ee;
  for (ScaledSum* sum : {&t.l1, &t.r1, &t.signed_err}) {
    const ScaledSum& part = sum == &t.l1 ? p.l1 : sum == &t.r1 ? p.r1 : p.signed_err;
    sum->add(part.sum);
    sum->add(part.comp);
  }
  t.max_o = std::max(t.max_o, p.max_o);
  t.max_r = std::max(t.max_r, p.max_r);
  t.max_e = std::max(t.max_e, p.max_e);
}

void MetricFold::add_errors(const double* out, const double* ref, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double e = std::fabs(out[i] - ref[i]);
    if (std::isnan(e)) continue;  // a non-finite head has no median
    if (keep_errors_) {
      errors_.push_back(e);
      continue;
    }
    const std::uint64_t key = e == 0 ? 0 : (std::bit_cast<std::uint64_t>(e) >> 41) + 1;
    std::unique_ptr<BucketRow>& row = buckets_[key >> 11];
    if (!row) row = std::make_unique<BucketRow>();
    ++(*row)[key & 2047];
  }
}

void MetricFold::merge_errors(const MetricFold& other) {
  errors_.insert(errors_.end(), other.errors_.begin(), other.errors_.end());
  for (std::size_t hi = 0; hi < other.buckets_.size(); ++hi) {
    if (!other.buckets_[hi]) continue;
    std::unique_ptr<BucketRow>& row = buckets_[hi];
    if (!row) row = std::make_unique<BucketRow>();
    for (std::size_t lo = 0; lo < 2048; ++lo) (*row)[lo] += (*other.buckets_[hi])[lo];
  }
}

namespace {

// The midpoint of bucket `key` (0: exactly zero).
double bucket_value(std::uint64_t key) {
  if (key == 0) return 0;
  const double lo = std::bit_cast<double>((key - 1) << 41);
  if (!std::isfinite(lo)) return lo;
  const double hi = std::bit_cast<double>(key << 41);
  return std::isfinite(hi) ? lo + (hi - lo) / 2 : lo;
}

}  // namespace

ErrorStats MetricFold::stats() const {
  ErrorStats s;
  const PanelStats& t = total_;
  s.count = t.count;
  s.nonfinite = t.nonfinite;
  s.zero_errors = t.zero_errors;
  if (s.count == 0 || s.nonfinite > 0) {
    s.cossim = s.rel_l1 = s.rmse = s.max_abs = s.bias = s.median_abs = s.one_minus_cossim = kNaN;
    return s;
  }
  const double n = static_cast<double>(s.count);
  if (t.max_o == 0 && t.max_r == 0) s.cossim = 1.0;
  else if (t.max_o == 0 || t.max_r == 0) s.cossim = 0.0;
  else s.cossim = t.dot.value() / (std::sqrt(t.oo.value()) * std::sqrt(t.rr.value()));  // the 2^e cancel
  if (t.max_o == 0 || t.max_r == 0 || !std::isfinite(t.max_e)) s.one_minus_cossim = 1 - s.cossim;
  else if (t.ee == kNoExponent) s.one_minus_cossim = 0;
  else s.one_minus_cossim = one_minus_cossim_from_sums(t.oo.value(), t.eo, t.rr.value(), t.er, t.sq.value(), t.ee, s.cossim);
  const double l1 = t.l1.value(), r1 = t.r1.value();
  s.rel_l1 = r1 > 0 ? l1 / r1 : (l1 == 0 ? 0.0 : std::numeric_limits<double>::infinity());
  s.rmse = t.ee == kNoExponent ? 0.0 : std::ldexp(std::sqrt(t.sq.value() / n), t.ee);
  s.max_abs = t.max_e;
  s.bias = t.signed_err.value() / n;
  s.log2_histogram = t.log2_histogram;
  if (keep_errors_) {
    std::vector<double> e = errors_;
    if (!e.empty()) s.median_abs = median_in_place(e);
  } else {
    std::int64_t total = 0;
    for (const auto& row : buckets_)
      if (row)
        for (const std::int64_t c : *row) total += c;
    // the values at sorted positions mid - 1 and mid (0-based); keys in increasing order are values in increasing order
    const std::int64_t mid = total / 2;
    double lower = 0, upper = 0;
    std::int64_t seen = 0;
    bool found = false;
    for (std::size_t hi = 0; hi < buckets_.size() && !found; ++hi) {
      if (!buckets_[hi]) continue;
      for (std::size_t lo = 0; lo < 2048; ++lo) {
        const std::int64_t c = (*buckets_[hi])[lo];
        if (c == 0) continue;
        const std::uint64_t k = (static_cast<std::uint64_t>(hi) << 11) | lo;
        if (total % 2 == 0 && seen <= mid - 1 && mid - 1 < seen + c) lower = bucket_value(k);
        if (seen <= mid && mid < seen + c) {
          upper = bucket_value(k);
          found = true;
          break;
        }
        seen += c;
      }
    }
    if (total > 0) s.median_abs = total % 2 == 1 ? upper : lower + (upper - lower) / 2;
  }
  return s;
}

KlStats MetricFold::kl() const {
  const PanelStats& t = total_;
  if (t.kl_rows == 0) return {kNaN, kNaN};
  return {t.kl_sum.value() / static_cast<double>(t.kl_rows), t.kl_nan ? kNaN : t.kl_max};
}

}  // namespace qattn::eval
