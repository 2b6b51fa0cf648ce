// SageAttention2 quantisation groups against the explicit listings of the upstream kernels, scales and rounding.
#include <catch2/catch.hpp>
#include <random>
#include <set>

#include "qattn/reference/sage_quant.h"

using namespace qattn;
using namespace qattn::ref;

namespace {
std::set<int> members(int slot, bool is_query, SageGranularity g, int length) {
  std::set<int> m;
  for (int n = 0; n < length; ++n)
    if (sage_group_of(n, is_query, g) == slot) m.insert(n);
  return m;
}
}  // namespace

TEST_CASE("per-thread groups match the upstream index pattern", "[sage]") {
  CHECK(members(0, true, SageGranularity::thread, 256) == std::set<int>{0, 8, 16, 24});
  CHECK(members(9, true, SageGranularity::thread, 256) == std::set<int>{33, 41, 49, 57});
  CHECK(members(0, false, SageGranularity::thread, 256) ==
        std::set<int>{0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57});
  CHECK(members(4, false, SageGranularity::thread, 256) ==
        std::set<int>{64, 65, 72, 73, 80, 81, 88, 89, 96, 97, 104, 105, 112, 113, 120, 121});
  CHECK(members(3, false, SageGranularity::thread, 256) ==
        std::set<int>{6, 7, 14, 15, 22, 23, 30, 31, 38, 39, 46, 47, 54, 55, 62, 63});
  // Every K group has 16 tokens and every Q group 4, for whole warp blocks.
  for (int slot = 0; slot < 16; ++slot) CHECK(members(slot, false, SageGranularity::thread, 256).size() == 16);
  for (int slot = 0; slot < 64; ++slot) CHECK(members(slot, true, SageGranularity::thread, 256).size() == 4);
  CHECK(sage_group_of(200, true, SageGranularity::block) == 1);
  CHECK(sage_group_of(200, false, SageGranularity::block) == 3);
  CHECK(sage_group_of(200, true, SageGranularity::warp) == 6);
  CHECK(sage_group_of(200, false, SageGranularity::token) == 200);
  CHECK(sage_group_of(200, false, SageGranularity::tensor) == 0);
}

TEST_CASE("scales, epsilon, rounding modes, INT4 and INT8", "[sage]") {
  RowMatrixXd x(2, 4);
  x << 1.0, -2.5, 0.0, 12.7, 0.35, -0.35, 0.0, 0.7;
  const SageQuantized t = sage_quantize(x, true, SageGranularity::token, 8, SageRounding::half_away);
  CHECK(t.scales[0] == 12.7 / 127 + 1e-7);
  CHECK(t.values(0, 3) == 127);  // 12.7 / (0.1 + 1e-7) = 126.99987: below 127, so no clamp is needed, rounds to 127
  const SageQuantized h = sage_quantize(x, true, SageGranularity::token, 4, SageRounding::half_away);
  CHECK(h.scales[1] == 0.7 / 7 + 1e-7);
  CHECK(h.values(1, 0) == 3);   // 0.35 / (0.1 + 1e-7) = 3.4999965
  CHECK(h.values(1, 3) == 7);   // the group maximum maps just below 7
  CHECK(h.scales.size() == 2);
  // The rounding rules on exact ties and off ties.
  for (double y : {0.5, 1.5, 2.5, -0.5, -2.5}) {
    CHECK(sage_round(y, SageRounding::half_away) == (y > 0 ? std::floor(y) + 1 : std::ceil(y) - 1));
    CHECK(std::fmod(sage_round(y, SageRounding::half_even), 2.0) == 0.0);
  }
  CHECK(sage_round(2.4999, SageRounding::half_away) == 2);
  CHECK(sage_round(-2.5001, SageRounding::half_even) == -3);
  CHECK_THROWS_AS(sage_quantize(x, true, SageGranularity::token, 6, SageRounding::half_even), std::invalid_argument);
}

TEST_CASE("dequantised values are within half a step of the input", "[sage]") {
  std::mt19937_64 g(3);
  std::normal_distribution<double> n(0, 2);
  RowMatrixXd x(200, 64);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = n(g);
  for (SageGranularity gr : {SageGranularity::tensor, SageGranularity::block, SageGranularity::warp,
                             SageGranularity::thread, SageGranularity::token})
    for (int bits : {4, 8})
      for (bool q : {true, false}) {
        const SageQuantized s = sage_quantize(x, q, gr, bits, SageRounding::half_even);
        for (Eigen::Index i = 0; i < x.rows(); ++i)
          for (Eigen::Index c = 0; c < x.cols(); ++c)
            REQUIRE(std::fabs(s.dequantized(i, c) - x(i, c)) <= 0.5 * s.scales[s.group[i]] * (1 + 1e-12));
      }
}
