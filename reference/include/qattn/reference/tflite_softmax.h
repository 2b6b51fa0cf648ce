// The production int8 softmax of TensorFlow Lite (docs/methods/tflite-int8.md): TFLite's
// reference_ops::Softmax<int8_t, int8_t> with the parameters its kernel Prepare derives (PreprocessSoftmaxScaling,
// CalculateInputRadius; TFLITE_SINGLE_ROUNDING off, TFLITE_EMULATE_FLOAT off), as in TensorFlow 2.4-2.15 and
// TFLite Micro. The fixed-point primitives follow gemmlowp's fixedpoint.h semantics, each stated below.
//
// One row of int8 inputs q_j with input scale s and softmax beta:
//   (1) d_j = q_j - max_k q_k (int32)
//   (2) d_j < diff_min                      ->  output -128 (P = 0)
//   (3) a_j = SRDHM(d_j 2^left_shift, M) in Q5.26, where M 2^(left_shift - 31) = min(beta s 2^26, 2^31 - 1) / 2^26
//   (4) e_j = exp_on_negative_values(a_j) in Q0.31
//   (5) S = sum_j RDBP(e_j, 12) in Q12.19;  shifted_scale = 1 / (1 + x) with S = 2^nbou (1 + x), x in [0, 1)
//   (6) out_j = clamp(RDBP(SRDHM(shifted_scale, e_j), nbou + 23) - 128, -128, 127)
//   (7) P_j = (out_j + 128) / 256            (output scale 1/256, zero point -128, as TFLite requires)
// SRDHM = saturating rounding doubling high multiply, RDBP = rounding divide by a power of two.
// The input int8 tensor comes from float logits by TFLite's Quantize arithmetic: q = clamp(round(fl32(fl32(x) /
// s)) + z, -128, 127), round half away from zero (TfLiteRound = std::round); -inf logits are masked (P = 0).
#pragma once

#include <array>
#include <optional>

#include <cstdint>
#include <span>

#include "qattn/tensor.h"

namespace qattn::ref::tflite {

// ---- gemmlowp fixed-point primitives on int32 raw values ------------------------------------------------------
// a b / 2^31 rounded to nearest, ties toward +infinity (-1.5 -> -1, 1.5 -> 2): gemmlowp adds 2^30 (1 - 2^30 for a
// negative product) and divides truncating, which is floor((a b + 2^30) / 2^31), as sqrdmulh does. The only
// overflow, a = b = -2^31, saturates to 2^31 - 1.
std::int32_t saturating_rounding_doubling_high_mul(std::int32_t a, std::int32_t b);
// x / 2^exponent rounded half away from zero, 0 <= exponent <= 31 (srshl / vrshr with a sign fix-up).
std::int32_t rounding_divide_by_pot(std::int32_t x, int exponent);
// x 2^exponent, saturating to [-2^31, 2^31 - 1], 0 <= exponent <= 31 (SaturatingRoundingMultiplyByPOT<+e>).
std::int32_t saturating_shift_left(std::int32_t x, int exponent);
// (a + b) / 2 rounded half away from zero, in 64 bits (RoundingHalfSum).
std::int32_t rounding_half_sum(std::int32_t a, std::int32_t b);

// e^a for a in [-1/4, 0) in Q0.31 (raw a in [-2^29, 0)), by the Taylor expansion around -1/8 to the 4th power.
std::int32_t exp_on_interval_between_negative_one_quarter_and_0_excl(std::int32_t a);
// e^a for a <= 0 in Q5.26 (raw), result in Q0.31: the fraction modulo 1/4 by the interval form, then one multiply
// by e^-(2^k) for each set bit k = -2 .. 4 of the rest; a = 0 gives 2^31 - 1.
std::int32_t exp_on_negative_values(std::int32_t a);
// The 7 barrel-shifter multipliers round(2^31 e^-(2^k)), k = -2 .. 4, computed from std::exp (the test checks them
// against gemmlowp's published literals).
std::int32_t exp_barrel_multiplier(int k);
// 1 / (1 + a) for a in [0, 1) in Q0.31 (raw), by three Newton-Raphson steps from 48/17 - 32/17 d in Q2.29.
std::int32_t one_over_one_plus_x_for_x_in_0_1(std::int32_t a);
// GetReciprocal: for a sum in Q(integer_bits).(31 - integer_bits), the Q0.31 value 1 / (1 + x) and num_bits_over_unit
// with sum = 2^num_bits_over_unit (1 + x).
std::int32_t reciprocal(std::int32_t sum, int integer_bits, int* num_bits_over_unit);

// ---- the softmax ------------------------------------------------------------------------------------------
struct SoftmaxParams {
  std::int32_t input_multiplier = 0;  // M in (3), in [2^30, 2^31)
  int input_left_shift = 0;
  int diff_min = 0;                   // -CalculateInputRadius(5, left_shift)
};
// PreprocessSoftmaxScaling(beta, input_scale, 5) and CalculateInputRadius. Throws InputError (tensor "logits",
// field "scale") when beta s 2^26 <= 1, where TFLite's QuantizeMultiplierGreaterThanOne check fails.
SoftmaxParams prepare_softmax(double beta, double input_scale);

// One row: int8 q with visible[j] (false = masked: output -128) into out. Throws InputError (field "row sum") where
// TFLite has no result: a sum of exponentials S >= 512, where the output shift nbou + 23 = floor(log2 S) + 23
// exceeds 31 (TFLite checks it), and, beyond that, a Q12.19 sum past int32 (4096 entries at the maximum).
// exp_of_diff(d) is the Q0.31 exponential of the int8 difference d = q - max (diff_min <= d <= 0); an ExpTable holds
// it for every d in [-255, 0] that is >= diff_min, at index -d (the same values: a lookup instead of the arithmetic).
using ExpTable = std::array<std::int32_t, 256>;
std::int32_t exp_of_diff(std::int32_t d, const SoftmaxParams& params);
ExpTable exp_table(const SoftmaxParams& params);
void softmax_int8_row(std::span<const std::int8_t> q, std::span<const bool> visible, const SoftmaxParams& params,
                      std::span<std::int8_t> out, const ExpTable* table = nullptr);

// How the float logits become the int8 input tensor.
enum class Calibration {
  minmax,  // TFLite's asymmetric activation quantisation of the range [min(x, 0), max(x, 0)] (scale = range / 255)
  absmax,  // symmetric: scale = max |x| / 127, zero point 0
  fixed,   // a given scale, zero point 0
};
enum class CalibrationScope { tensor, row };

struct Int8SoftmaxParams {
  Calibration calibration = Calibration::minmax;
  CalibrationScope scope = CalibrationScope::tensor;
  double fixed_scale = 0.0625;  // Calibration::fixed
  double beta = 1.0;
};

// The int8 quantisation of one logit: fl32 division by the fl32 scale, TfLiteRound, zero point, clamp.
std::int8_t quantize_int8(double x, float scale, std::int32_t zero_point);

// The range calibration reads: the minimum and maximum of the finite logits, and 0 (TFLite's activation ranges
// always hold 0); -inf entries are masked and left out.
struct LogitRange {
  double lo = 0, hi = 0;
  LogitRange& add(const MatrixView& logits);
};

// Row-wise softmax of float logits [rows, L] through the int8 kernel; probabilities (out + 128) / 256. With
// tensor_range, scope=tensor calibrates on it (the whole call's, when logits are a block of its rows) instead of the
// logits' own range.
RowMatrixXd tflite_int8_softmax_rows(const MatrixView& logits, const Int8SoftmaxParams& p,
                                     std::optional<LogitRange> tensor_range = std::nullopt);

}  // namespace qattn::ref::tflite
