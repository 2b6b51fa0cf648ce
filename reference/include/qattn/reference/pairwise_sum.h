// Pairwise (cascade) summation, the summation order of softmax_ref.
//
// sum(x[0..n)) = x[0] + ... + x[n-1] sequentially when n <= kPairwiseLeaf, else sum(left half) + sum(right half)
// with the left half of size ceil(n/2). Every term passes through at most pairwise_depth(n) additions, so for
// terms of one sign the computed sum s^ satisfies |s^ - s| <= gamma_{h} s with h = pairwise_depth(n) and
// gamma_h = h u / (1 - h u) (Higham, Accuracy and Stability, 2nd ed., section 4.2).
#pragma once

#include <Eigen/Core>

namespace qattn::ref {

inline constexpr Eigen::Index kPairwiseLeaf = 8;

// Longest chain of additions any term passes through: n - 1 for n <= 8, else 1 + depth(ceil(n / 2)).
constexpr int pairwise_depth(Eigen::Index n) {
  if (n <= 1) return 0;
  if (n <= kPairwiseLeaf) return static_cast<int>(n - 1);
  return 1 + pairwise_depth((n + 1) / 2);
}

template <class Scalar>
Scalar pairwise_sum(const Scalar* x, Eigen::Index n) {
  if (n <= kPairwiseLeaf) {
    Scalar s(0);
    for (Eigen::Index i = 0; i < n; ++i) s += x[i];
    return s;
  }
  const Eigen::Index left = (n + 1) / 2;
  return Scalar(pairwise_sum(x, left) + pairwise_sum(x + left, n - left));
}

}  // namespace qattn::ref
