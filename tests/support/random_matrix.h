// Seeded random matrices for tests: entries N(mean, sigma^2).
#pragma once

#include <random>

#include "qattn/tensor.h"

namespace qattn::test {

inline RowMatrixXd random_matrix(Eigen::Index rows, Eigen::Index cols, double mean, double sigma, std::mt19937_64& g) {
  std::normal_distribution<double> n(mean, sigma);
  RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = n(g);
  return m;
}

// Mean 0.
inline RowMatrixXd random_matrix(Eigen::Index rows, Eigen::Index cols, double sigma, std::mt19937_64& g) {
  return random_matrix(rows, cols, 0.0, sigma, g);
}

}  // namespace qattn::test
