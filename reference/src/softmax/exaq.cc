#include "qattn/reference/exaq.h"

#include "qattn/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "qattn/float_format.h"
#include "qattn/reference/exaq_clipping.h"

namespace qattn::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double cached_expected_max(int n) {
  static std::mutex mu;
  static std::map<int, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  return cache[n] = expected_max_std_normal(n);
}

}  // namespace

std::optional<double> exaq_table_clip(ExaqClip rule, int bits, double sigma) {
  if (rule == ExaqClip::gauss) {
    switch (bits) {
      case 2: return -1.66 * sigma - 1.85;
      case 3: return -1.75 * sigma - 2.06;
      case 4: return -1.83 * sigma - 2.27;
    }
  }
  if (rule == ExaqClip::laplace) {
    switch (bits) {
      case 2: return -4.01 * sigma - 1.77;
      case 4: return -6.82 * sigma - 0.15;
    }
  }
  return std::nullopt;
}

double exaq_optimal_clip(const ExaqParams& p, double sigma, int n) {
  if (!(sigma > 0)) return -1e-9;  // a constant scope: nothing to clip
  const QuantNoise noise = p.grid == ExaqGrid::paper ? QuantNoise::step_midpoint : QuantNoise::step_endpoints;
  return exaq_solve_clip(sigma, -sigma * cached_expected_max(std::max(1, n)), p.bits, noise);
}

double exaq_eq14_clip(const ExaqParams& p, double sigma, int n) {
  if (!(sigma > 0)) return -1e-9;  // a constant scope: nothing to clip
  return exaq_solve_clip_eq14(sigma, -sigma * cached_expected_max(std::max(1, n)), p.bits);
}

void ExaqStatsAccumulator::add_first(const MatrixView& x) {
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    for (Eigen::Index j = 0; j < x.cols(); ++j)
      if (x(r, j) != kNegInf) {
        sum_ += x(r, j);
        s_.min = std::min(s_.min, x(r, j));
        ++s_.count;
      }
  }
  rows_ += x.rows();
}

void ExaqStatsAccumulator::begin_second() {
  if (s_.count > 0) mean_ = sum_ / static_cast<double>(s_.count);
}

void ExaqStatsAccumulator::add_second(const MatrixView& x) {
  if (s_.count == 0) return;
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (Eigen::Index j = 0; j < x.cols(); ++j)
      if (x(r, j) != kNegInf) sq_ += (x(r, j) - mean_) * (x(r, j) - mean_), ad_ += std::fabs(x(r, j) - mean_);
}

ExaqStats ExaqStatsAccumulator::stats() const {
  ExaqStats s = s_;
  if (s.count == 0) return s;
  s.sigma = s.count > 1 ? std::sqrt(sq_ / static_cast<double>(s.count - 1)) : 0.0;  // unbiased, as torch.std
  s.sigma_laplace = ad_ / static_cast<double>(s.count);                              // mean absolute deviation
  return s;
}

ExaqStats exaq_stats(const MatrixView& x, Eigen::Index row_begin, Eigen::Index row_end) {
  ExaqStatsAccumulator a;
  a.add_first(x.middleRows(row_begin, row_end - row_begin));
  a.begin_second();
  a.add_second(x.middleRows(row_begin, row_end - row_begin));
  return a.stats();
}

std::vector<double> exaq_levels(const ExaqParams& p, double clip, double lo_data) {
  const int n = 1 << p.bits;
  std::vector<double> levels(n);
  if (p.grid == ExaqGrid::upstream) {
    const double lo = std::max(lo_data, clip);
    if (lo >= 0) {  // every value is 0 (e.g. one entry per row): a single level, no division by 0 - lo
      std::fill(levels.begin(), levels.end(), 0.0);
    } else {
      const double a = (n - 1) / (0 - lo);
      for (int q = 0; q < n; ++q) levels[q] = q / a + lo;
    }
  } else {
    const double step = -clip / n;
    for (int q = 0; q < n; ++q) levels[q] = clip + (q + 0.5) * step;
  }
  if (p.xhat_bf16)
    for (double& v : levels) v = round_to_format(v, kBfloat16);
  return levels;
}

int exaq_code(const ExaqParams& p, double clip, double lo_data, double x) {
  const int n = 1 << p.bits;
  if (p.grid == ExaqGrid::upstream) {
    const double lo = std::max(lo_data, clip);
    if (lo >= 0) return 0;
    const double a = (n - 1) / (0 - lo);
    const double xc = std::clamp(x, lo, 0.0);
    return static_cast<int>(std::clamp(std::nearbyint((xc - lo) * a), 0.0, static_cast<double>(n - 1)));  // ties even
  }
  const double step = -clip / n;
  return static_cast<int>(std::clamp(std::floor((x - clip) / step), 0.0, static_cast<double>(n - 1)));
}

std::vector<std::int64_t> exaq_lut_q24(const std::vector<double>& levels) {
  // Relative to the top level: softmax is shift-invariant, and the top entry is then exactly 2^24, so the row sum of
  // a row with any valid entry is >= 2^24 (the row maximum always takes the top code). Without the shift, a paper
  // grid with a large clip puts its top level at -D/2 far below 0 and every entry would round to 0 (0/0).
  const double top = *std::max_element(levels.begin(), levels.end());
  std::vector<std::int64_t> lut;
  for (double v : levels) lut.push_back(static_cast<std::int64_t>(std::nearbyint(std::ldexp(std::exp(v - top), 24))));
  return lut;
}

std::int64_t exaq_sum_direct(const std::vector<int>& codes, const std::vector<std::int64_t>& lut) {
  std::int64_t s = 0;
  for (int c : codes) s += lut[c];
  return s;
}

std::int64_t exaq_sum_packed(const std::vector<int>& codes, const std::vector<std::int64_t>& lut, int bits) {
  // Codes per byte and slot width: four 2-bit codes, or two codes in 4-bit slots for 3 and 4 bits.
  const int per_byte = bits == 2 ? 4 : 2, slot = bits == 2 ? 2 : 4;
  std::vector<std::int64_t> lut_sum(256, 0);
  for (int byte = 0; byte < 256; ++byte)
    for (int k = 0; k < per_byte; ++k) {
      const int code = (byte >> (k * slot)) & ((1 << slot) - 1);
      lut_sum[byte] += code < static_cast<int>(lut.size()) ? lut[code] : 0;  // 3-bit codes never use slot values 8-15
    }
  std::int64_t s = 0;
  std::size_t j = 0;
  for (; j + per_byte <= codes.size(); j += per_byte) {
    int byte = 0;
    for (int k = 0; k < per_byte; ++k) byte |= codes[j + k] << (k * slot);
    s += lut_sum[byte];
  }
  for (; j < codes.size(); ++j) s += lut[codes[j]];  // tail shorter than one byte
  return s;
}

ExaqBound ExaqBound::make(const ExaqParams& p, double clip, double lo_data, Eigen::Index valid) {
  ExaqBound b;
  const int n = 1 << p.bits;
  double step = 0;
  if (p.grid == ExaqGrid::upstream) {
    b.lo = std::min(0.0, std::max(lo_data, clip));
    step = -b.lo / (n - 1);
  } else {
    b.lo = clip;
    step = -clip / n;
  }
  b.d = step / 2 + (p.xhat_bf16 ? std::fabs(b.lo) * 0x1p-8 : 0.0) + 1e-15 * (1 + std::fabs(b.lo));
  const double l = static_cast<double>(valid);
  // The FP sum has relative error (L + 2) u, so absolute error at most that (p^ <= 1). The Q24 LUT (relative to the
  // top level, whose entry is exactly 1) rounds each value by up to 2^-25: the numerator moves by at most 2^-25 and
  // the denominator, which is >= 1, by at most L 2^-25.
  b.tau = p.sum == ExaqSum::fp ? (l + 2) * 0x1p-53 * 4 : 0x1p-25 * (1 + l) * 1.01;
  return b;
}

double ExaqBound::element(double p, double x, Eigen::Index below_lo) const {
  const double n_low = static_cast<double>(below_lo);
  if (x < lo) return std::exp(lo + 2 * d) + tau;  // p^ <= e^{x^} / Z^ with x^ <= lo + d and Z^ >= e^{-d}
  const double rel = std::max(std::expm1(2 * d), 1 - std::exp(-d) / (std::exp(d) + n_low * std::exp(lo + d)));
  return p * rel + tau;
}

std::pair<double, double> ExaqCalibrator::use(double c_measured, double lo_measured) {
  if (seen_ < calls_) {
    c_sum_ += c_measured;
    lo_sum_ += lo_measured;
    ++seen_;
    return {c_measured, lo_measured};
  }
  return {c_sum_ / calls_, lo_sum_ / calls_};
}

RowMatrixXd exaq_max_subtracted(const MatrixView& logits) {
  RowMatrixXd x(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    double m = kNegInf;
    for (Eigen::Index j = 0; j < logits.cols(); ++j) {
      if (std::isnan(logits(r, j)) || logits(r, j) == -kNegInf) throw std::invalid_argument("EXAQ: NaN or +inf logit");
      m = std::max(m, logits(r, j));
    }
    for (Eigen::Index j = 0; j < logits.cols(); ++j) x(r, j) = logits(r, j) == kNegInf ? kNegInf : logits(r, j) - m;
  }
  return x;
}

RowMatrixXd exaq_softmax(const MatrixView& logits, const ExaqParams& p, std::vector<double>* c_used,
                         ExaqCalibrator* calibrator, const ExaqTensorScope* tensor) {
  if (calibrator && p.scope != ExaqScope::tensor) throw std::invalid_argument("EXAQ: calibration needs sigma scope 'tensor'");
  if (tensor && (p.scope != ExaqScope::tensor || calibrator))
    throw std::invalid_argument("EXAQ: a whole call's statistics need sigma scope 'tensor' and no calibration");
  if (p.bits < 2 || p.bits > 4) throw std::invalid_argument("EXAQ: bits must be 2, 3 or 4");
  const RowMatrixXd x = exaq_max_subtracted(logits);
  RowMatrixXd out = RowMatrixXd::Zero(logits.rows(), logits.cols());
  const Eigen::Index scopes = p.scope == ExaqScope::tensor ? 1 : logits.rows();
  for (Eigen::Index sc = 0; sc < scopes; ++sc) {
    const Eigen::Index r0 = p.scope == ExaqScope::tensor ? 0 : sc, r1 = p.scope == ExaqScope::tensor ? logits.rows() : sc + 1;
    // With `tensor`, these rows are a block of a call whose statistics it holds: sigma, min and the row count n
    // are the call's.
    ExaqStats st = tensor ? tensor->stats : exaq_stats(x, r0, r1);
    const Eigen::Index scope_rows = tensor ? tensor->rows : r1 - r0;
    if (st.count == 0) continue;  // fully masked
    // Finite logits whose spread is beyond ~1e154 overflow the variance in float64: sigma, and with it the clip and
    // every code, would be undefined. Refused (OverflowRule::refuse, docs/non-finite.md).
    if (!std::isfinite(st.sigma) || !std::isfinite(st.sigma_laplace) || !std::isfinite(st.min))
      throw InputError("logits", "sigma", "the standard deviation of the softmax input (rows " + std::to_string(r0) +
                                              " to " + std::to_string(r0 + scope_rows - 1) +
                                              ") overflows float64, so EXAQ's clip is undefined (docs/non-finite.md)");
    double clip = 0;
    switch (p.clip) {
      case ExaqClip::gauss: clip = *exaq_table_clip(ExaqClip::gauss, p.bits, st.sigma); break;
      case ExaqClip::laplace: {
        const auto c = exaq_table_clip(ExaqClip::laplace, p.bits, st.sigma_laplace);
        if (!c) throw std::invalid_argument("EXAQ: neither the paper nor the official code gives a Laplace clip for 3 bits");
        clip = *c;
        break;
      }
      case ExaqClip::optimal:
        clip = exaq_optimal_clip(p, st.sigma, static_cast<int>(std::lround(static_cast<double>(st.count) / scope_rows)));
        break;
      case ExaqClip::eq14:
        clip = exaq_eq14_clip(p, st.sigma, static_cast<int>(std::lround(static_cast<double>(st.count) / scope_rows)));
        break;
      case ExaqClip::fixed: clip = p.fixed_c; break;
      case ExaqClip::none: clip = p.grid == ExaqGrid::upstream ? st.min : std::min(st.min, -1e-9); break;
    }
    if (!std::isfinite(clip))
      throw InputError("logits", "clip", "EXAQ's clip for sigma = " + std::to_string(st.sigma) +
                                         " is not finite (docs/non-finite.md)");
    if (calibrator) std::tie(clip, st.min) = calibrator->use(clip, st.min);
    if (c_used) c_used->push_back(clip);
    const std::vector<double> levels = exaq_levels(p, clip, st.min);
    const std::vector<std::int64_t> lut_q24 = exaq_lut_q24(levels);
    std::vector<double> exp_levels;  // e^{x^} of each level, as the FP sum reads it
    for (const double l : levels) exp_levels.push_back(std::exp(l));
    for (Eigen::Index r = r0; r < r1; ++r) {
      std::vector<int> codes;
      std::vector<Eigen::Index> where;
      for (Eigen::Index j = 0; j < x.cols(); ++j)
        if (x(r, j) != kNegInf) codes.push_back(exaq_code(p, clip, st.min, x(r, j))), where.push_back(j);
      if (codes.empty()) continue;
      if (p.sum == ExaqSum::fp) {
        double s = 0;
        for (std::size_t k = 0; k < codes.size(); ++k) s += (out(r, where[k]) = exp_levels[codes[k]]);
        for (Eigen::Index j : where) out(r, j) /= s;
      } else {
        const std::int64_t s = p.sum == ExaqSum::q24_direct ? exaq_sum_direct(codes, lut_q24)
                                                            : exaq_sum_packed(codes, lut_q24, p.bits);
        for (std::size_t k = 0; k < codes.size(); ++k)
          out(r, where[k]) = static_cast<double>(lut_q24[codes[k]]) / static_cast<double>(s);
      }
    }
  }
  return out;
}

}  // namespace qattn::ref
