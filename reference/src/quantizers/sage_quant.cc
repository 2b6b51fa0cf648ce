#include "qattn/reference/sage_quant.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace qattn::ref {

double sage_round(double y, SageRounding r) {
  return r == SageRounding::half_away ? std::trunc(y + 0.5 * ((y > 0) - (y < 0))) : std::nearbyint(y);
}

int sage_group_of(int n, bool is_query, SageGranularity g, const SageGroupSizes& s) {
  switch (g) {
    case SageGranularity::tensor: return 0;
    case SageGranularity::block: return n / (is_query ? s.block_q : s.block_k);
    case SageGranularity::warp: return n / (is_query ? s.warp_q : s.warp_k);
    case SageGranularity::thread: return is_query ? (n / s.warp_q) * 8 + n % 8 : (n / s.warp_k) * 4 + (n % 8) / 2;
    case SageGranularity::token: return n;
  }
  return 0;
}

SageQuantized sage_quantize(const MatrixView& x, bool is_query, SageGranularity g, int bits, SageRounding r,
                            const SageGroupSizes& sizes) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("sage_quantize: bits must be 4 or 8");
  const double qmax = bits == 8 ? 127 : 7;
  SageQuantized out;
  const int n_tokens = static_cast<int>(x.rows());
  int groups = 0;
  for (int n = 0; n < n_tokens; ++n) {
    out.group.push_back(sage_group_of(n, is_query, g, sizes));
    groups = std::max(groups, out.group.back() + 1);
  }
  std::vector<double> amax(groups, 0.0);
  for (int n = 0; n < n_tokens; ++n) amax[out.group[n]] = std::max(amax[out.group[n]], x.row(n).cwiseAbs().maxCoeff());
  for (double a : amax) out.scales.push_back(a / qmax + 1e-7);
  out.values.resize(x.rows(), x.cols());
  for (int n = 0; n < n_tokens; ++n)
    for (Eigen::Index c = 0; c < x.cols(); ++c) {
      const double y = x(n, c) / out.scales[out.group[n]];
      const double q = sage_round(y, r);
      out.values(n, c) = static_cast<std::int32_t>(std::clamp(q, -qmax, qmax));
    }
  return out;
}

}  // namespace qattn::ref
