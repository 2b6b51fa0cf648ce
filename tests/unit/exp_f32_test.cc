// The fast path's documented float32 exp (qattn/exp_f32.h): its constants recomputed in 50-digit arithmetic, its
// declared accuracy measured, and softmax_row_lanes16's summation order checked against an explicit listing.
#include <catch2/catch.hpp>
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "qattn/exp_f32.h"

using namespace qattn;
using Exact = boost::multiprecision::cpp_bin_float_50;

TEST_CASE("exp_f32_poly constants are the stated exact expressions rounded to float", "[exp_f32]") {
  using K = ExpF32Constants;
  const Exact ln2 = boost::multiprecision::log(Exact(2));
  CHECK(K::kLog2e == static_cast<float>(1 / ln2));
  CHECK(K::kLn2Hi == 355.0f / 512.0f);
  CHECK(K::kLn2Lo == static_cast<float>(ln2 - Exact(355) / 512));
  Exact factorial = 1;
  for (int k = 0; k < 7; ++k) {
    if (k > 0) factorial *= k;
    INFO("k " << k);
    CHECK(K::kC[k] == static_cast<float>(1 / factorial));
  }
}

TEST_CASE("exp_f32_poly is within 4 ulp of e^x on [-80, 0], -inf gives 0, below -80 clamps", "[exp_f32]") {
  double worst = 0;
  float worst_x = 0;
  // every 97th float in [-80, 0] (about 11 million values), plus the ends
  for (float x = -80.0f; x <= 0.0f;) {
    const double exact = std::exp(static_cast<double>(x));  // double exp: far below a float ulp
    const float got = exp_f32_poly(x);
    const double ulp = std::nextafter(static_cast<float>(exact), std::numeric_limits<float>::infinity()) -
                       static_cast<float>(exact);
    const double err = std::abs(got - exact) / ulp;
    if (err > worst) worst = err, worst_x = x;
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (bits <= 97 + 0x80000000u) break;  // reached -0
    bits -= 97;
    std::memcpy(&x, &bits, 4);
  }
  INFO("worst " << worst << " ulp at x = " << worst_x);
  CHECK(worst < 4.0);
  CHECK(worst > 0.3);  // the bound is measured, not vacuous
  CHECK(exp_f32_poly(0.0f) == 1.0f);
  CHECK(exp_f32_poly(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(exp_f32_poly(-1000.0f) == exp_f32_poly(-80.0f));
}

TEST_CASE("softmax_row_lanes16 sums in the documented 16-lane order", "[exp_f32]") {
  // 40 logits: the partial sums take j = l, l + 16, l + 32; the fold is 8, 4, 2, 1.
  float s[40], p[40], e[40];
  for (int j = 0; j < 40; ++j) s[j] = -0.37f * static_cast<float>((j * 7) % 13);
  bool visible[40];
  for (int j = 0; j < 40; ++j) visible[j] = j != 5;
  softmax_row_lanes16(s, visible, 40, p);
  float m = -1e30f;
  for (int j = 0; j < 40; ++j)
    if (visible[j]) m = std::max(m, s[j]);
  float part[16] = {};
  for (int j = 0; j < 40; ++j) {
    e[j] = visible[j] ? exp_f32_poly(s[j] - m) : 0.0f;
    part[j % 16] += e[j];
  }
  const float f8[8] = {part[0] + part[8], part[1] + part[9], part[2] + part[10], part[3] + part[11],
                       part[4] + part[12], part[5] + part[13], part[6] + part[14], part[7] + part[15]};
  const float f4[4] = {f8[0] + f8[4], f8[1] + f8[5], f8[2] + f8[6], f8[3] + f8[7]};
  const float total = (f4[0] + f4[2]) + (f4[1] + f4[3]);
  for (int j = 0; j < 40; ++j) CHECK(p[j] == e[j] / total);
  CHECK(p[5] == 0.0f);
  bool none[3] = {false, false, false};
  float q[3] = {1, 2, 3};
  softmax_row_lanes16(q, none, 3, q);
  CHECK((q[0] == 0.0f && q[1] == 0.0f && q[2] == 0.0f));
}
