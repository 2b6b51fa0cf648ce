// TensorFlow Lite's int8 softmax (qattn/reference/tflite_softmax.h, docs/methods/tflite-int8.md): gemmlowp's
// published constants, the rounding primitives on worked ties, golden vectors, the error contracts of exp and
// 1 / (1 + x), and the refusals. The golden vectors were derived from the definitions in the doc (each fixed-point
// step evaluated in exact integer arithmetic, independently of this implementation), not by running TFLite.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/tflite_softmax.h"

using namespace qattn;
namespace tf = qattn::ref::tflite;

namespace {

std::vector<std::int8_t> row(const std::vector<int>& q, double beta, double scale) {
  std::vector<std::int8_t> in(q.begin(), q.end()), out(q.size());
  const std::unique_ptr<bool[]> visible(new bool[q.size()]);
  std::fill(visible.get(), visible.get() + q.size(), true);
  tf::softmax_int8_row(in, std::span<const bool>(visible.get(), q.size()), tf::prepare_softmax(beta, scale), out);
  return out;
}

std::vector<std::int8_t> i8(const std::vector<int>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("tflite-int8: constants equal gemmlowp's published literals", "[tflite-int8]") {
  // GEMMLOWP_EXP_BARREL_SHIFTER(k, literal) in fixedpoint.h: round(2^31 e^-(2^k)) for k = -2 .. 4.
  const std::int32_t published[] = {1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242};
  for (int k = -2; k <= 4; ++k) {
    INFO("k = " << k);
    CHECK(tf::exp_barrel_multiplier(k) == published[k + 2]);
  }
  // The interval form's e^-1/8 (1895147668) and 1/3 (715827883): its value at a = -1/8 is e^-1/8 itself.
  CHECK(tf::exp_on_interval_between_negative_one_quarter_and_0_excl(-(1 << 28)) == 1895147668);
}

TEST_CASE("tflite-int8: rounding primitives on worked ties and saturation", "[tflite-int8]") {
  CHECK(tf::rounding_divide_by_pot(3, 1) == 2);    // 1.5 -> 2
  CHECK(tf::rounding_divide_by_pot(-3, 1) == -2);  // -1.5 -> -2: half away from zero
  CHECK(tf::rounding_divide_by_pot(5, 2) == 1);    // 1.25 -> 1
  CHECK(tf::rounding_divide_by_pot(-6, 2) == -2);  // -1.5 -> -2
  CHECK(tf::rounding_divide_by_pot(-5, 2) == -1);  // -1.25 -> -1
  CHECK(tf::rounding_divide_by_pot(7, 0) == 7);
  CHECK(tf::saturating_rounding_doubling_high_mul(1 << 30, 1 << 30) == 1 << 29);  // 1/2 x 1/2 in Q0.31
  CHECK(tf::saturating_rounding_doubling_high_mul(INT32_MIN, INT32_MIN) == INT32_MAX);
  CHECK(tf::saturating_rounding_doubling_high_mul(3, 1 << 30) == 2);    // 1.5 -> 2
  CHECK(tf::saturating_rounding_doubling_high_mul(-3, 1 << 30) == -1);  // -1.5 -> -1: ties toward +inf (sqrdmulh)
  CHECK(tf::saturating_rounding_doubling_high_mul(-1, 1 << 30) == 0);   // -0.5 -> 0
  CHECK(tf::saturating_rounding_doubling_high_mul(-5, 1 << 29) == -1);  // -1.25 -> -1
  CHECK(tf::saturating_rounding_doubling_high_mul(-7, 1 << 29) == -2);  // -1.75 -> -2
  CHECK(tf::saturating_shift_left(1 << 25, 5) == 1 << 30);
  CHECK(tf::saturating_shift_left(1 << 26, 5) == INT32_MAX);
  CHECK(tf::saturating_shift_left(-(1 << 26), 5) == INT32_MIN);
  CHECK(tf::rounding_half_sum(3, 4) == 4);    // 3.5 -> 4
  CHECK(tf::rounding_half_sum(-3, -4) == -4);
}

TEST_CASE("tflite-int8: exp_on_negative_values, golden values and its error contract", "[tflite-int8]") {
  CHECK(tf::exp_on_negative_values(0) == INT32_MAX);
  CHECK(tf::exp_on_negative_values(-1) == 2147483124);
  CHECK(tf::exp_on_negative_values(-(1 << 24)) == 1672462419);   // a = -1/4
  CHECK(tf::exp_on_negative_values(-(1 << 26)) == 790015308);    // a = -1
  CHECK(tf::exp_on_negative_values(-(1 << 27)) == 290630390);    // a = -2
  CHECK(tf::exp_on_negative_values(-3 * (1 << 26) + 12345) == 106936615);
  CHECK(tf::exp_on_negative_values(-31 * (1 << 26)) == 0);
  CHECK(tf::exp_on_negative_values(INT32_MIN) == 0);
  // Contract (doc §3): |e - 2^31 e^a| <= 2.5e-7 in Q0.31 for a in [-16, 0]; largest seen 2.28e-7 near a = 0.
  double worst = 0;
  for (std::int64_t a = -(std::int64_t{16} << 26); a <= 0; a += 99991) {
    const double exact = std::ldexp(std::exp(std::ldexp(static_cast<double>(a), -26)), 31);
    worst = std::max(worst, std::abs(tf::exp_on_negative_values(static_cast<std::int32_t>(a)) - exact));
  }
  CHECK(worst <= 2.5e-7 * 2147483648.0);
  CHECK(worst > 1e-8 * 2147483648.0);  // the contract is tight: the Taylor form is not exact
}

TEST_CASE("tflite-int8: 1 / (1 + x) and the reciprocal of a Q12.19 sum", "[tflite-int8]") {
  int nbou = -1;
  CHECK(tf::reciprocal(1 << 20, 12, &nbou) == INT32_MAX);  // sum 2: 2^1 (1 + 0)
  CHECK(nbou == 1);
  CHECK(tf::reciprocal(1 << 19, 12, &nbou) == INT32_MAX);  // sum 1
  CHECK(nbou == 0);
  CHECK(tf::reciprocal(3 << 19, 12, &nbou) == 1431655762);  // sum 3 = 2 (1 + 1/2): 2/3 in Q0.31
  CHECK(nbou == 1);
  // Contract (doc §4): |r - 2^31 / (1 + x)| <= 1e-8 in Q0.31 for x in [0, 1).
  double worst = 0;
  for (std::int64_t a = 0; a < (std::int64_t{1} << 31); a += 1000003) {
    const double exact = 2147483648.0 / (1 + std::ldexp(static_cast<double>(a), -31));
    worst = std::max(worst, std::abs(tf::one_over_one_plus_x_for_x_in_0_1(static_cast<std::int32_t>(a)) - exact));
  }
  CHECK(worst <= 1e-8 * 2147483648.0);
}

TEST_CASE("tflite-int8: PreprocessSoftmaxScaling and CalculateInputRadius", "[tflite-int8]") {
  const tf::SoftmaxParams a = tf::prepare_softmax(1, 0.0625);  // 2^-4 2^26 = 2^22 = 0.5 2^23
  CHECK(a.input_multiplier == 1 << 30);
  CHECK(a.input_left_shift == 23);
  CHECK(a.diff_min == -248);  // floor(31 2^26 / 2^23)
  const tf::SoftmaxParams b = tf::prepare_softmax(1, 0.1);
  CHECK(b.input_multiplier == 1717986918);
  CHECK(b.input_left_shift == 23);
  CHECK(b.diff_min == -248);
  const tf::SoftmaxParams c = tf::prepare_softmax(0.5, 0.02);
  CHECK(c.input_multiplier == 1374389535);
  CHECK(c.input_left_shift == 20);
  CHECK(c.diff_min == -1984);
  CHECK_THROWS_AS(tf::prepare_softmax(1e-6, 1e-6), InputError);
}

TEST_CASE("tflite-int8: golden rows", "[tflite-int8]") {
  CHECK(row({5}, 1, 0.1) == i8({127}));     // one entry: P = 255/256, not 1 (output saturates at 127)
  CHECK(row({3, 3}, 1, 0.1) == i8({0, 0}));  // P = 1/2 each
  CHECK(row({0, -16}, 1, 0.0625) == i8({59, -59}));  // logits 0 and -1
  CHECK(row({127, 100, 0, -128, 64, -5}, 1, 0.05) == i8({68, -77, -128, -128, -120, -128}));
  CHECK(row({10, 9, 8, 7, 6, 5, 4, 3}, 1, 0.25) == i8({-63, -77, -88, -97, -104, -109, -113, -117}));
  CHECK(row({-128, 127}, 1, 0.1) == i8({-128, 127}));  // d = -255 < diff_min = -248: dropped before exp
}

TEST_CASE("tflite-int8: the registry method quantises, masks and refuses", "[tflite-int8]") {
  const auto& reg = ref::reference_registry();
  // calib=fixed, s = 1/16: logits 0 and -1 are the int8 values 0 and -16 of the golden row above.
  const RowMatrixXd p = reg.create("tflite-int8:calib=fixed,s=0.0625")->softmax_rows((RowMatrixXd(1, 2) << 0, -1).finished());
  CHECK(p(0, 0) == 187.0 / 256);
  CHECK(p(0, 1) == 69.0 / 256);
  // Quantize: fl32(x / s) rounded half away from zero, then the zero point and the clamp.
  CHECK(tf::quantize_int8(0.09375, 0.0625f, 0) == 2);   // 1.5 -> 2
  CHECK(tf::quantize_int8(-0.09375, 0.0625f, 0) == -2);
  CHECK(tf::quantize_int8(100, 0.0625f, 0) == 127);
  CHECK(tf::quantize_int8(-3, 0.0625f, -100) == -128);
  // -inf is masked; a fully masked row is zeros.
  RowMatrixXd m(2, 3);
  m << 0, -INFINITY, -1, -INFINITY, -INFINITY, -INFINITY;
  const RowMatrixXd pm = reg.create("tflite-int8:calib=fixed,s=0.0625")->softmax_rows(m);
  CHECK(pm(0, 1) == 0);
  CHECK(pm(0, 0) == 187.0 / 256);
  CHECK(pm.row(1).isZero(0));
  // Rows TFLite has no result for: S = sum e^(x - max) >= 512 makes the output shift floor(log2 S) + 23 pass 31;
  // 511 equal entries (S = 511, output shift 31) still run: each 256/511 = 0.50098 of a step rounds up to
  // P = 1/256 (the row sums to 2); 512 do not.
  const RowMatrixXd p511 = reg.create("tflite-int8")->softmax_rows(RowMatrixXd::Zero(1, 511));
  CHECK((p511.array() == 1.0 / 256).all());
  const auto refusal = [&](Eigen::Index n) {
    try {
      reg.create("tflite-int8")->softmax_rows(RowMatrixXd::Zero(1, n));
    } catch (const InputError& e) {
      return e.field() + ": " + e.reason();
    }
    return std::string("no refusal");
  };
  CHECK_THAT(refusal(512), Catch::Contains("row sum: the sum of exponentials e^(x - max) is 512.0"));
  CHECK_THAT(refusal(4096), Catch::Contains("overflows TFLite's Q12.19 int32 accumulator"));  // 4096 2^19 = 2^31
  // beta s <= 2^-26 has no TFLite multiplier.
  CHECK_THROWS_AS(reg.create("tflite-int8:calib=fixed,s=1e-6,beta=1e-6")->softmax_rows(RowMatrixXd::Zero(1, 3)),
                  InputError);
}

TEST_CASE("tflite-int8: minmax calibration is TFLite's asymmetric activation range", "[tflite-int8]") {
  // Range [-2, 0.55] (0 inside): scale 2.55 / 255 = 0.01, zero point round(-128 + 200) = 72.
  RowMatrixXd x(1, 3);
  x << -2, 0.55, 0;
  const RowMatrixXd p = ref::reference_registry().create("tflite-int8")->softmax_rows(x);
  // The int8 values are 72 - 200 = -128, 72 + 55 = 127 and 72: d = -255, 0, -55 at scale fl32(0.01).
  const std::vector<std::int8_t> q = {tf::quantize_int8(-2, 0.01f, 72), tf::quantize_int8(0.55, 0.01f, 72),
                                      tf::quantize_int8(0, 0.01f, 72)};
  CHECK(q == i8({-128, 127, 72}));
  std::vector<std::int8_t> out(3);
  const bool visible[3] = {true, true, true};
  tf::softmax_int8_row(q, visible, tf::prepare_softmax(1, 0.01f), out);
  for (int j = 0; j < 3; ++j) CHECK(p(0, j) == (out[j] + 128) / 256.0);
  CHECK(std::abs(p(0, 1) - std::exp(0.55) / (std::exp(-2) + std::exp(0.55) + 1)) < 2.0 / 256);
}

TEST_CASE("tflite-int8: the exponential table gives the arithmetic's row, bit for bit", "[tflite]") {
  std::mt19937 g(7);
  std::uniform_int_distribution<int> code(-128, 127);
  for (const float scale : {0.001f, 0.02f, 0.0625f, 0.3f, 2.0f}) {
    INFO("input scale " << scale);
    const tf::SoftmaxParams params = tf::prepare_softmax(1, scale);
    const tf::ExpTable table = tf::exp_table(params);
    std::vector<std::int8_t> q(300), direct(300), looked_up(300);
    for (std::int8_t& x : q) x = static_cast<std::int8_t>(code(g));
    std::unique_ptr<bool[]> visible(new bool[q.size()]);
    for (std::size_t j = 0; j < q.size(); ++j) visible[j] = j % 7 != 3;
    const std::span<const bool> vis(visible.get(), q.size());
    try {
      tf::softmax_int8_row(q, vis, params, direct);
    } catch (const InputError&) {
      CHECK_THROWS_AS(tf::softmax_int8_row(q, vis, params, looked_up, &table), InputError);
      continue;
    }
    tf::softmax_int8_row(q, vis, params, looked_up, &table);
    CHECK(looked_up == direct);
    for (std::int32_t d = std::max(params.diff_min, -255); d <= 0; ++d) CHECK(table[static_cast<std::size_t>(-d)] == tf::exp_of_diff(d, params));
  }
}
