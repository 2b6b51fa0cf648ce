// The error metrics (qattn::compare) of a whole output matrix against its reference, entry by entry in row-major
// order: the figures the pipelines' tests hold a method's measured claims to.
#pragma once

#include <span>

#include "qattn/metrics.h"
#include "qattn/tensor.h"

namespace qattn::test {

inline ErrorStats matrix_stats(const RowMatrixXd& o, const RowMatrixXd& ref) {
  return qattn::compare(std::span(o.data(), o.size()), std::span(ref.data(), ref.size()));
}

// sum |o - ref| / sum |ref| over every entry.
inline double matrix_rel_l1(const RowMatrixXd& o, const RowMatrixXd& ref) { return matrix_stats(o, ref).rel_l1; }

}  // namespace qattn::test
