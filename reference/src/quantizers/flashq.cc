#include "qattn/reference/flashq.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace qattn::ref {
namespace {

std::int32_t clamp_i32(double x, double lo, double hi) { return static_cast<std::int32_t>(std::clamp(x, lo, hi)); }

// Population standard deviation of the entries of a, in double.
double population_std(const Eigen::ArrayXd& a) {
  const double mean = a.mean();
  return std::sqrt((a - mean).square().mean());
}

// gap x std of one tensor under the rule (flashq.h); 0 for an empty matrix.
double gap_times_std(const MatrixView& x, HeadPriority rule) {
  if (x.size() == 0) return 0;
  const double gap = x.maxCoeff() - x.minCoeff();
  RowMatrixXd storage;
  if (rule == HeadPriority::entries)
    return gap * population_std(Eigen::Map<const Eigen::ArrayXd>(packed_rows(x, storage), x.size()));
  const Eigen::ArrayXd channel_gaps = (x.colwise().maxCoeff() - x.colwise().minCoeff()).transpose().array();
  return gap * population_std(channel_gaps);
}

}  // namespace

FlashQBlock flashq_quantize_block(const MatrixView& x, int range) {
  const double amax = x.size() ? x.cwiseAbs().maxCoeff() : 0.0;
  if (!std::isfinite(amax)) throw std::invalid_argument("FlashQ: non-finite input");
  FlashQBlock b;
  b.scale = amax > 0 ? amax / range : 1.0;
  b.values = flashq_quantize_with_scale(x, b.scale, nullptr, range);
  return b;
}

RowMatrixXi32 flashq_quantize_with_scale(const MatrixView& x, double scale, Eigen::Index* clamped, int range) {
  if (!(scale > 0) || !std::isfinite(scale)) throw std::invalid_argument("FlashQ: scale must be finite and > 0");
  if (range < 1 || range > 127) throw std::invalid_argument("FlashQ: INT8 range must be in 1..127");
  RowMatrixXi32 q(x.rows(), x.cols());
  Eigen::Index n = 0;
  RowMatrixXd storage;
  const double* xd = packed_rows(x, storage);
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    if (!std::isfinite(xd[i])) throw std::invalid_argument("FlashQ: non-finite input");
    const double r = std::nearbyint(xd[i] / scale);  // half-even in the default rounding mode
    n += std::abs(r) > range;
    q.data()[i] = clamp_i32(r, -range, range);
  }
  if (clamped) *clamped = n;
  return q;
}

ProgressiveBlock flashq_compress(const RowMatrixXi32& q8, int bits, IntScaleRounding rounding) {
  if (bits < 1 || bits > 7) throw std::invalid_argument("FlashQ: compressed bits must be 1..7, got " + std::to_string(bits));
  const int top = (1 << bits) - 1;
  ProgressiveBlock b;
  b.bits = bits;
  b.codes.resize(q8.rows(), q8.cols());
  b.scale.assign(q8.cols(), 1);
  b.zero.assign(q8.cols(), 0);
  for (Eigen::Index c = 0; c < q8.cols(); ++c) {
    if (q8.rows() == 0) continue;
    const int lo = q8.col(c).minCoeff(), hi = q8.col(c).maxCoeff();
    if (lo < -128 || hi > 127) throw std::invalid_argument("FlashQ: INT8 block entry out of [-128, 127]");
    const double ratio = static_cast<double>(hi - lo) / top;
    const int s = std::max(1, static_cast<int>(rounding == IntScaleRounding::ceil ? std::ceil(ratio) : std::nearbyint(ratio)));
    const int z = static_cast<int>(std::nearbyint(static_cast<double>(-lo) / s));
    b.scale[c] = s;
    b.zero[c] = z;
    for (Eigen::Index t = 0; t < q8.rows(); ++t)
      b.codes(t, c) = clamp_i32(std::nearbyint(static_cast<double>(q8(t, c)) / s) + z, 0, top);
  }
  return b;
}

RowMatrixXi32 flashq_decompress(const ProgressiveBlock& b, Eigen::Index* saturated) {
  RowMatrixXi32 q(b.codes.rows(), b.codes.cols());
  Eigen::Index n = 0;
  for (Eigen::Index t = 0; t < q.rows(); ++t)
    for (Eigen::Index c = 0; c < q.cols(); ++c) {
      const int v = (b.codes(t, c) - b.zero[c]) * b.scale[c];
      n += v < -128 || v > 127;
      q(t, c) = std::clamp(v, -128, 127);
    }
  if (saturated) *saturated = n;
  return q;
}

double flashq_head_priority(const MatrixView& k, const MatrixView& v, HeadPriority rule) {
  return gap_times_std(k, rule) + gap_times_std(v, rule);
}

std::vector<int> flashq_head_bits(const std::vector<double>& priority, int n_h, int low_bits, int high_bits) {
  std::vector<std::size_t> order(priority.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return priority[a] < priority[b]; });
  std::vector<int> bits(priority.size(), high_bits);
  const std::size_t n = static_cast<std::size_t>(std::clamp<long>(n_h, 0, static_cast<long>(priority.size())));
  for (std::size_t i = 0; i < n; ++i) bits[order[i]] = low_bits;
  return bits;
}

}  // namespace qattn::ref
