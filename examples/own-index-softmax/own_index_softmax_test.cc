// Property tests of the kernels in own_index_softmax.h with qattn/testing.h, and proof that the harness catches
// their deliberate bugs. Exit status 0 when the correct kernels pass and both wrong ones are caught.
#include <cmath>
#include <cstdio>
#include <limits>

#include "own_index_softmax.h"
#include "qattn/testing.h"

namespace qt = qattn::testing;

// My float kernel's declared contract against the exact softmax: the derivation of docs/softmax-reference.md with a
// sequential sum instead of a pairwise one, |p^ - p| <= u (ln(1/p) + L + 6) p (+ 4 denorm_min for underflow).
qt::Bound my_contract() {
  return {.element_of = [](double p, Eigen::Index valid) {
    const double u = 0x1p-53, tau = 4 * std::numeric_limits<double>::denorm_min();
    return p > 0 ? u * (std::log(1 / p) + static_cast<double>(valid) + 6) * p + tau : tau;
  }};
}

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    failures += !ok;
  };

  // 1. My integer kernel is bit-exact to the reference model of the paper's rules, on rows whose clip saturates.
  expect(rc::check("mine::index_softmax == index@paper",
                   [](const qt::IntegerRow& row) {
                     qt::expect_bit_exact([](auto a, auto c) { return mine::index_softmax(a, c); }, "index@paper", row);
                   }),
         "the integer kernel is bit-exact to index@paper");

  // 2. My float kernel stays within its declared contract of the exact softmax on every row family.
  expect(rc::check("mine::softmax within contract of the exact softmax",
                   [](const qt::LogitRow& row) {
                     qt::expect_within_contract([](auto x) { return mine::softmax(x); }, "exact", my_contract(), row);
                   }),
         "the float kernel is within its contract against the exact softmax");

  // 3. The deliberately wrong variants must be caught: rc::check returns false and prints the shrunk counterexample.
  std::printf("--- the next three checks must fail (deliberate bugs):\n");
  expect(!rc::check("mine::index_softmax with a rounded index == index@paper",
                    [](const qt::IntegerRow& row) {
                      qt::expect_bit_exact([](auto a, auto c) { return mine::index_softmax(a, c, /*round_index=*/true); },
                                           "index@paper", row);
                    }),
         "the harness catches the off-by-one index rounding");
  // IntAttention's NEON kernel sums a row in a uint16: the default generator reaches the lengths and values (rows of
  // 255s past 257 entries) where it wraps.
  expect(!rc::check("mine::index_softmax with a uint16 row sum == index@paper",
                    [](const qt::IntegerRow& row) {
                      qt::expect_bit_exact([](auto a, auto c) { return mine::index_softmax(a, c, false, /*uint16_sum=*/true); },
                                           "index@paper", row);
                    }),
         "the harness catches the uint16 row sum that wraps");
  expect(!rc::check("mine::softmax without max subtraction within contract",
                    [](const qt::LogitRow& row) {
                      qt::expect_within_contract([](auto x) { return mine::softmax(x, /*skip_max=*/true); }, "exact",
                                                 my_contract(), row);
                    }),
         "the harness catches the missing max subtraction");
  return failures == 0 ? 0 : 1;
}
