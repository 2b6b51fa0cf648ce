// The "tflite-int8" method: TensorFlow Lite's int8 softmax (qattn/reference/tflite_softmax.h,
// docs/methods/tflite-int8.md) and its registry entry.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/tflite_softmax.h"

namespace qattn::ref::tflite {

constexpr std::int32_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t kInt32Min = std::numeric_limits<std::int32_t>::min();
constexpr std::int32_t kOneQ0_31 = kInt32Max;  // 1.0 is not representable in Q0.31: gemmlowp's One() is 2^31 - 1
constexpr int kScaledDiffIntegerBits = 5;      // the exp input in Q5.26
constexpr int kAccumulationIntegerBits = 12;   // the row sum in Q12.19

std::int32_t saturating_rounding_doubling_high_mul(std::int32_t a, std::int32_t b) {
  if (a == kInt32Min && b == kInt32Min) return kInt32Max;
  const std::int64_t ab = static_cast<std::int64_t>(a) * b;
  const std::int64_t nudge = ab >= 0 ? (std::int64_t{1} << 30) : 1 - (std::int64_t{1} << 30);
  return static_cast<std::int32_t>((ab + nudge) / (std::int64_t{1} << 31));  // C++ division truncates toward 0
}

std::int32_t rounding_divide_by_pot(std::int32_t x, int exponent) {
  const std::int32_t mask = static_cast<std::int32_t>((std::int64_t{1} << exponent) - 1);
  const std::int32_t remainder = x & mask;
  const std::int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);  // ties go away from zero
  return (x >> exponent) + (remainder > threshold ? 1 : 0);       // >> of a negative int32 is arithmetic (C++20)
}

std::int32_t saturating_shift_left(std::int32_t x, int exponent) {
  if (exponent == 0) return x;
  const std::int32_t threshold = static_cast<std::int32_t>((std::int64_t{1} << (31 - exponent)) - 1);
  if (x > threshold) return kInt32Max;
  if (x < -threshold) return kInt32Min;
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(x) << exponent);
}

std::int32_t rounding_half_sum(std::int32_t a, std::int32_t b) {
  const std::int64_t sum = static_cast<std::int64_t>(a) + b;
  return static_cast<std::int32_t>((sum + (sum >= 0 ? 1 : -1)) / 2);
}

namespace {

// round(2^31 v), half away from zero, for a constant v in (0, 1).
std::int32_t q0_31(double v) { return static_cast<std::int32_t>(std::round(std::ldexp(v, 31))); }

}  // namespace

std::int32_t exp_on_interval_between_negative_one_quarter_and_0_excl(std::int32_t a) {
  static const std::int32_t kExpMinusOneEighth = q0_31(std::exp(-1.0 / 8));  // 1895147668
  static const std::int32_t kOneThird = q0_31(1.0 / 3);                     // 715827883
  const auto mul = saturating_rounding_doubling_high_mul;
  // x = a + 1/8 in [-1/8, 1/8): e^a = e^-1/8 (1 + x + x^2/2 + x^3/6 + x^4/24 + ...)
  const std::int32_t x = a + (1 << 28);
  const std::int32_t x2 = mul(x, x), x3 = mul(x2, x), x4 = mul(x2, x2);
  const std::int32_t x4_over_4 = rounding_divide_by_pot(x4, 2);
  const std::int32_t poly = rounding_divide_by_pot(mul(x4_over_4 + x3, kOneThird) + x2, 1);  // x^4/24 + x^3/6 + x^2/2
  return kExpMinusOneEighth + mul(kExpMinusOneEighth, x + poly);
}

std::int32_t exp_barrel_multiplier(int k) { return q0_31(std::exp(-std::ldexp(1.0, k))); }

std::int32_t exp_on_negative_values(std::int32_t a) {
  constexpr int kFractionalBits = 31 - kScaledDiffIntegerBits;  // 26
  constexpr std::int32_t kOneQuarter = 1 << (kFractionalBits - 2);
  // a = (a mod 1/4 - 1/4) - r with r >= 0 a multiple of 1/4: e^a = e^(a mod 1/4 - 1/4) prod over set bits of r
  const std::int32_t a_mod_quarter_minus_one_quarter = (a & (kOneQuarter - 1)) - kOneQuarter;
  std::int32_t result = exp_on_interval_between_negative_one_quarter_and_0_excl(
      saturating_shift_left(a_mod_quarter_minus_one_quarter, kScaledDiffIntegerBits));  // Q5.26 -> Q0.31
  const std::int64_t remainder = static_cast<std::int64_t>(a_mod_quarter_minus_one_quarter) - a;
  for (int k = -2; k <= 4; ++k)  // every k < kScaledDiffIntegerBits: no clamp below -32 is needed in Q5.26
    if (remainder & (std::int64_t{1} << (kFractionalBits + k)))
      result = saturating_rounding_doubling_high_mul(result, exp_barrel_multiplier(k));
  return a == 0 ? kOneQ0_31 : result;
}

std::int32_t one_over_one_plus_x_for_x_in_0_1(std::int32_t a) {
  static const std::int32_t k48Over17 = static_cast<std::int32_t>(std::round(std::ldexp(48.0 / 17, 29)));  // Q2.29
  static const std::int32_t kMinus32Over17 = static_cast<std::int32_t>(std::round(std::ldexp(-32.0 / 17, 29)));
  constexpr std::int32_t kOneQ2_29 = 1 << 29;
  const auto mul = saturating_rounding_doubling_high_mul;
  const std::int32_t half_denominator = rounding_half_sum(a, kOneQ0_31);  // d = (1 + a) / 2 in [1/2, 1), Q0.31
  std::int32_t x = k48Over17 + mul(half_denominator, kMinus32Over17);    // Q0.31 x Q2.29 -> Q2.29
  for (int i = 0; i < 3; ++i) {                                          // x <- x + x (1 - d x)
    const std::int32_t one_minus_dx = kOneQ2_29 - mul(half_denominator, x);
    x = x + saturating_shift_left(mul(x, one_minus_dx), 2);  // Q2.29 x Q2.29 = Q4.27 -> Q2.29
  }
  return saturating_shift_left(x, 1);  // x ~ 1 / d = 2 / (1 + a): as Q1.30 it is 1 / (1 + a); to Q0.31
}

std::int32_t reciprocal(std::int32_t sum, int integer_bits, int* num_bits_over_unit) {
  const int headroom_plus_one = std::countl_zero(static_cast<std::uint32_t>(sum));
  *num_bits_over_unit = integer_bits - headroom_plus_one;
  const std::int32_t shifted_sum_minus_one =
      static_cast<std::int32_t>((static_cast<std::uint32_t>(sum) << headroom_plus_one) - (std::uint32_t{1} << 31));
  return one_over_one_plus_x_for_x_in_0_1(shifted_sum_minus_one);
}

SoftmaxParams prepare_softmax(double beta, double input_scale) {
  const double real = std::min(beta * input_scale * (1 << (31 - kScaledDiffIntegerBits)), 2147483647.0);
  if (!(real > 1.0))
    throw InputError("logits", "scale",
                     "beta * input scale = " + std::to_string(beta * input_scale) +
                         " is at most 2^-26: TFLite's softmax multiplier must exceed 1 (QuantizeMultiplierGreaterThanOne)");
  int shift = 0;
  const double q = std::frexp(real, &shift);  // real = q 2^shift, q in [1/2, 1)
  std::int64_t q_fixed = static_cast<std::int64_t>(std::round(q * 2147483648.0));
  if (q_fixed == (std::int64_t{1} << 31)) q_fixed /= 2, ++shift;
  SoftmaxParams p;
  p.input_multiplier = static_cast<std::int32_t>(q_fixed);
  p.input_left_shift = shift;
  // CalculateInputRadius(5, shift): the largest |d| whose d 2^shift stays within int32 before the multiply.
  const double radius = 1.0 * ((1 << kScaledDiffIntegerBits) - 1) * (std::int64_t{1} << (31 - kScaledDiffIntegerBits)) /
                        static_cast<double>(std::int64_t{1} << shift);
  p.diff_min = -static_cast<int>(std::floor(radius));
  return p;
}

std::int32_t exp_of_diff(std::int32_t d, const SoftmaxParams& params) {
  const std::int32_t a = saturating_rounding_doubling_high_mul(d * (1 << params.input_left_shift), params.input_multiplier);
  return exp_on_negative_values(a);
}

ExpTable exp_table(const SoftmaxParams& params) {
  ExpTable t{};
  for (std::int32_t k = 0; k < 256; ++k)
    if (-k >= params.diff_min) t[static_cast<std::size_t>(k)] = exp_of_diff(-k, params);
  return t;
}

void softmax_int8_row(std::span<const std::int8_t> q, std::span<const bool> visible, const SoftmaxParams& params,
                      std::span<std::int8_t> out, const ExpTable* table) {
  int max_in_row = std::numeric_limits<std::int8_t>::min();
  bool any = false;
  for (std::size_t j = 0; j < q.size(); ++j)
    if (visible[j]) max_in_row = std::max<int>(max_in_row, q[j]), any = true;
  std::vector<std::int32_t> e(q.size(), 0);
  std::vector<bool> counted(q.size(), false);
  std::int64_t sum = 0;  // Q12.19; TFLite's int32 sum, checked below
  for (std::size_t j = 0; j < q.size() && any; ++j) {
    const std::int32_t d = static_cast<std::int32_t>(q[j]) - max_in_row;
    if (!visible[j] || d < params.diff_min) continue;
    e[j] = table ? (*table)[static_cast<std::size_t>(-d)] : exp_of_diff(d, params);
    counted[j] = true;
    sum += rounding_divide_by_pot(e[j], kAccumulationIntegerBits);
  }
  if (sum > kInt32Max)
    throw InputError("logits", "row sum",
                     "the sum of exponentials overflows TFLite's Q12.19 int32 accumulator (more than 4096 entries near the "
                     "row maximum)");
  int num_bits_over_unit = 0;
  const std::int32_t shifted_scale =
      any ? reciprocal(static_cast<std::int32_t>(sum), kAccumulationIntegerBits, &num_bits_over_unit) : 0;
  const int exponent = num_bits_over_unit + 31 - 8;
  if (exponent > 31)  // TFLite: TFLITE_CHECK(0 <= exponent && exponent <= 31); older versions shift out of range
    throw InputError("logits", "row sum",
                     "the sum of exponentials e^(x - max) is " + std::to_string(std::ldexp(static_cast<double>(sum), -19)) +
                         " >= 512: TFLite's int8 output shift num_bits_over_unit + 23 exceeds 31 (every P of the row "
                         "would lie below 1/512)");
  for (std::size_t j = 0; j < q.size(); ++j) {
    if (!counted[j]) {
      out[j] = -128;
      continue;
    }
    const std::int32_t unsat = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted_scale, e[j]), exponent);
    out[j] = static_cast<std::int8_t>(std::clamp(unsat - 128, -128, 127));
  }
}

std::int8_t quantize_int8(double x, float scale, std::int32_t zero_point) {
  const float v = static_cast<float>(x) / scale;
  const std::int64_t r = static_cast<std::int64_t>(std::round(v)) + zero_point;
  return static_cast<std::int8_t>(std::clamp<std::int64_t>(r, -128, 127));
}

namespace {

struct Quantization {
  float scale = 1;
  std::int32_t zero_point = 0;
};

// The input scale and zero point for the visible logits of `block` (a row, or the whole call).
Quantization calibrate(const LogitRange& range, const Int8SoftmaxParams& p) {
  if (p.calibration == Calibration::fixed) return {static_cast<float>(p.fixed_scale), 0};
  const double lo = range.lo, hi = range.hi;
  if (p.calibration == Calibration::absmax) {
    const double m = std::max(-lo, hi);
    return {m > 0 ? static_cast<float>(m / 127) : 1.0f, 0};
  }
  if (hi == lo) return {1.0f, 0};
  const double scale = (hi - lo) / 255;
  const double zero_point = std::round(-128 - lo / scale);
  return {static_cast<float>(scale), static_cast<std::int32_t>(std::clamp(zero_point, -128.0, 127.0))};
}

void softmax_block(const MatrixView& logits, Eigen::Index r0, Eigen::Index rows, const Int8SoftmaxParams& p,
                   const LogitRange& range, RowMatrixXd& probs) {
  const Quantization qz = calibrate(range, p);
  const SoftmaxParams params = prepare_softmax(p.beta, qz.scale);
  const std::size_t n = static_cast<std::size_t>(logits.cols());
  // One exponential per int8 difference, where the block has more entries than differences
  const std::optional<ExpTable> table = rows * logits.cols() > 256 ? std::optional<ExpTable>(exp_table(params)) : std::nullopt;
  std::vector<std::int8_t> q(n), out(n);
  std::unique_ptr<bool[]> visible(new bool[n]);
  for (Eigen::Index i = r0; i < r0 + rows; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      const double x = logits(i, static_cast<Eigen::Index>(j));
      visible[j] = !std::isinf(x);
      if (visible[j] && std::abs(x) > FLT_MAX)
        throw InputError("logits", "[" + std::to_string(i) + ", " + std::to_string(j) + "]",
                         "beyond float32, the input format of TFLite's Quantize");
      q[j] = visible[j] ? quantize_int8(x, qz.scale, qz.zero_point) : 0;
    }
    softmax_int8_row(q, std::span<const bool>(visible.get(), n), params, out, table ? &*table : nullptr);
    for (std::size_t j = 0; j < n; ++j) probs(i, static_cast<Eigen::Index>(j)) = (out[j] + 128) / 256.0;
  }
}

}  // namespace

LogitRange& LogitRange::add(const MatrixView& logits) {
  RowMatrixXd storage;
  const double* data = packed_rows(logits, storage);
  for (Eigen::Index i = 0; i < logits.size(); ++i) {
    const double x = data[i];
    if (std::isinf(x)) continue;  // -inf: masked
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  return *this;
}

RowMatrixXd tflite_int8_softmax_rows(const MatrixView& logits, const Int8SoftmaxParams& p,
                                     std::optional<LogitRange> tensor_range) {
  RowMatrixXd probs(logits.rows(), logits.cols());
  if (logits.size() == 0) return probs;
  if (p.scope == CalibrationScope::tensor || p.calibration == Calibration::fixed)
    softmax_block(logits, 0, logits.rows(), p, tensor_range ? *tensor_range : LogitRange{}.add(logits), probs);
  else
    for (Eigen::Index i = 0; i < logits.rows(); ++i) softmax_block(logits, i, 1, p, LogitRange{}.add(logits.row(i)), probs);
  return probs;
}

}  // namespace qattn::ref::tflite

namespace qattn::ref {
namespace {

class TfliteInt8Method final : public SoftmaxModelMethod {
 public:
  explicit TfliteInt8Method(tflite::Int8SoftmaxParams p) : p_(p) {}
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override {
    if (const std::unique_ptr<LogitScope> scope = logit_scope()) return softmax_with_scope(*scope, logits);
    return tflite::tflite_int8_softmax_rows(logits, p_);
  }

 protected:
  // scope=tensor: the range of the call's finite logits (a minimum and maximum: the same in any order).
  std::unique_ptr<LogitScope> logit_scope() const override {
    class Range final : public LogitScope {
     public:
      explicit Range(const tflite::Int8SoftmaxParams& p) : p_(p) {}
      void observe(int, const RowMatrixXd& logits) override { range_.add(logits); }
      RowMatrixXd softmax_rows(const MatrixView& logits) const override {
        return tflite::tflite_int8_softmax_rows(logits, p_, range_);
      }

     private:
      tflite::Int8SoftmaxParams p_;
      tflite::LogitRange range_;
    };
    if (p_.scope != tflite::CalibrationScope::tensor || p_.calibration == tflite::Calibration::fixed) return nullptr;
    return std::make_unique<Range>(p_);
  }

 private:
  tflite::Int8SoftmaxParams p_;
};

constexpr Choice<tflite::Calibration> kCalibrations[] = {
    {"minmax", tflite::Calibration::minmax}, {"absmax", tflite::Calibration::absmax}, {"fixed", tflite::Calibration::fixed}};
constexpr Choice<tflite::CalibrationScope> kScopes[] = {{"tensor", tflite::CalibrationScope::tensor},
                                                        {"row", tflite::CalibrationScope::row}};

}  // namespace

void register_tflite_int8_method(Registry& registry) {
  MethodEntry e;
  e.name = "tflite-int8";
  e.summary = "TensorFlow Lite int8 softmax: int8 input with its scale, gemmlowp fixed-point exp (Q5.26 -> Q0.31), "
              "Q12.19 sum, Newton-Raphson reciprocal, int8 P with scale 1/256 and zero point -128";
  e.params = {
      {"calib", ParamType::choice, "minmax",
       "input int8 quantisation: minmax (asymmetric, TFLite activations), absmax (symmetric), fixed (scale s)",
       choice_names(kCalibrations)},
      {"scope", ParamType::choice, "tensor", "range taken over the whole call (a calibrated model) or each row",
       choice_names(kScopes)},
      {"s", ParamType::real, "0.0625", "input scale for calib=fixed", {}, 1e-6, 1e6},
      {"beta", ParamType::real, "1", "softmax beta (TFLite SoftmaxOptions)", {}, 1e-6, 1e6},
  };
  e.presets = {{"tflite", {{"calib", "minmax"}, {"scope", "tensor"}, {"beta", "1"}},
                "as a converted TFLite model runs it: asymmetric int8 input over the tensor's range"},
               {"row-absmax", {{"calib", "absmax"}, {"scope", "row"}},
                "the int8 kernel alone: each row quantised symmetrically to its own max |x|"}};
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    tflite::Int8SoftmaxParams p;
    p.calibration = choice_value(m, "calib", kCalibrations);
    p.scope = choice_value(m, "scope", kScopes);
    p.fixed_scale = m.real("s");
    p.beta = m.real("beta");
    return std::make_unique<TfliteInt8Method>(p);
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "logits converted to float32 for TFLite's Quantize; beyond 3.4e38, or a row sum beyond the Q12.19 "
                    "accumulator, is refused";
  e.kind = MethodKind::softmax_model;
  e.doc = "docs/methods/tflite-int8.md";
  // The int8 grid depends on the values (a shift moves them across it): the range of the call (scope=tensor) or the
  // row; calib=fixed takes none.
  e.traits = [](const ParamMap& m) {
    return value_grid_traits(choice_value(m, "scope", kScopes) == tflite::CalibrationScope::row ||
                             choice_value(m, "calib", kCalibrations) == tflite::Calibration::fixed);
  };
  registry.add(std::move(e));
}

}  // namespace qattn::ref
