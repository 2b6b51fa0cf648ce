// Row generators for property tests of softmax-like functions. A row is built deterministically from a family,
// a length and a 64-bit seed, so a RapidCheck counterexample (which prints those) replays exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace qattn::test {

enum class RowFamily { gaussian, skyscraper, ties, all_equal, one_dominant, masked, single, extreme };

inline constexpr RowFamily kRowFamilies[] = {RowFamily::gaussian,     RowFamily::skyscraper, RowFamily::ties,
                                            RowFamily::all_equal,    RowFamily::one_dominant, RowFamily::masked,
                                            RowFamily::single,       RowFamily::extreme};

inline std::string family_name(RowFamily f) {
  switch (f) {
    case RowFamily::gaussian: return "gaussian";
    case RowFamily::skyscraper: return "bimodal skyscraper";
    case RowFamily::ties: return "ties";
    case RowFamily::all_equal: return "all equal";
    case RowFamily::one_dominant: return "one dominant";
    case RowFamily::masked: return "-inf masks";
    case RowFamily::single: return "single element";
    case RowFamily::extreme: return "extreme spread";
  }
  return "?";
}

// Logits lie in [-limit, limit]; masked entries are -inf. `single` ignores `length`.
inline std::vector<double> make_row(RowFamily f, int length, std::uint64_t seed, double limit = 1e4) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto uniform = [&](double a, double b) { return a + (b - a) * unit(g); };
  auto log_uniform = [&](double a, double b) { return std::exp(uniform(std::log(a), std::log(b))); };
  auto clamp = [&](double x) { return std::clamp(x, -limit, limit); };
  const int n = f == RowFamily::single ? 1 : std::max(1, length);
  std::vector<double> row(n);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double mu = uniform(-0.5 * limit, 0.5 * limit);
  switch (f) {
    case RowFamily::gaussian: {
      const double sigma = log_uniform(1e-3, 0.3 * limit);
      for (double& x : row) x = clamp(mu + sigma * normal(g));
      break;
    }
    case RowFamily::skyscraper: {
      const double s = log_uniform(1e-2, 10.0), gap = uniform(5.0, 2000.0), frac = log_uniform(1e-3, 0.1);
      for (double& x : row) x = clamp(mu + s * normal(g) + (unit(g) < frac ? gap : 0.0));
      break;
    }
    case RowFamily::ties: {
      const int k = 1 + static_cast<int>(g() % 5);
      std::vector<double> values(k);
      const double spread = log_uniform(1e-2, limit);
      for (double& v : values) v = clamp(mu + uniform(-spread, spread));
      for (double& x : row) x = values[g() % k];
      break;
    }
    case RowFamily::all_equal:
      std::fill(row.begin(), row.end(), clamp(mu));
      break;
    case RowFamily::one_dominant: {
      const double d = log_uniform(1.0, limit);
      for (double& x : row) x = clamp(mu - d * 0.5 + normal(g));
      row[g() % n] = clamp(mu + d * 0.5);
      break;
    }
    case RowFamily::masked: {
      const double sigma = log_uniform(1e-2, 100.0), p_mask = unit(g);
      for (double& x : row) x = unit(g) < p_mask ? -std::numeric_limits<double>::infinity() : clamp(mu + sigma * normal(g));
      break;
    }
    case RowFamily::single:
      row[0] = clamp(mu);
      break;
    case RowFamily::extreme:
      for (double& x : row) x = uniform(-limit, limit);
      break;
  }
  return row;
}

}  // namespace qattn::test
