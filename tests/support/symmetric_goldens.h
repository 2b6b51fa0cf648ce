// The goldens of a symmetric max-abs quantiser, codes = round(x / s) with s = max|x| / R (s = 1 for an all-zero
// block): the quantisers of Quant-Only (R = 127) and FlashQ (R = 119, or 126) are held to the same worked example.
#pragma once

#include <catch2/catch.hpp>

#include <array>

#include "qattn/tensor.h"

namespace qattn::test {

// quantize(x) (a result with `scale` and `values`) on the row x = [-1, 0, 1, 3]: s = 3 / range exactly and the codes
// `codes` (-1 / s, 1 / s and 3 / s = R rounded as the quantiser rounds); on an all-zero 2 x 3 block: s = 1, codes 0.
template <class Quantize>
void check_symmetric_goldens(const Quantize& quantize, int range, const std::array<int, 4>& codes) {
  INFO("R = " << range);
  RowMatrixXd x(1, 4);
  x << -1, 0, 1, 3;
  const auto q = quantize(x);
  CHECK(q.scale == 3.0 / range);
  CHECK(q.values == (RowMatrixXi32(1, 4) << codes[0], codes[1], codes[2], codes[3]).finished());
  const auto z = quantize(RowMatrixXd::Zero(2, 3));
  CHECK(z.scale == 1.0);
  CHECK(z.values.isZero());
}

}  // namespace qattn::test
