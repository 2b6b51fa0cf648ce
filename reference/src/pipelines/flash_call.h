// The flash loop's call, shared by its files (not installed): reference/src/pipelines/flash_kernel.cc runs the key loop
// (steps (3)-(6) of flash_kernel.h; step (5) in flash_kernel_pv.cc, the loop's state in flash_row_loop.h),
// flash_kernel_prepare.cc quantises Q, K and V (steps (1)-(2)),
// flash_kernel_fp4.cc holds the FP4 block steps, flash_kernel_check.cc the description's checks.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "qattn/reference/flash_kernel.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/sas.h"

namespace qattn::ref::flash_detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2eF32 = 1.44269504f;  // the log2 e of SageAttention's Triton quantiser (a float32 constant)
constexpr float kLog2SixthF32 = -2.584962500721156f;  // log2(1 / 6): NVFP4 P's block scale (SageAttention3's fp4_scale_log2)

// A value as an error message shows it: 9 significant digits, exponent where large or small.
std::string shown(double x);
std::string at(Eigen::Index i, Eigen::Index j);

inline bool is_int(KernelFormat f) { return f == KernelFormat::int4 || f == KernelFormat::int8; }

// The largest value of a P~/V format: the factor that puts a channel's amax at the top of the format.
double format_max(KernelFormat f);

// x rounded to nearest even onto E2M1 ({0, 0.5, 1, 1.5, 2, 3, 4, 6}), saturating, NaN to +6 (PTX
// cvt.rn.satfinite.e2m1x2.f32; equal to lowp_encode_f32 with e2m1, tests/unit/sage3_test.cc), times 2: an integer.
inline float e2m1_twice(float x) {
  const float a = std::fabs(x);
  // twice the value, counted over the midpoints; a tie (0.25, 0.75, ..., 5) goes to the even code
  const float t = static_cast<float>(a > 0.25f) + static_cast<float>(a >= 0.75f) + static_cast<float>(a > 1.25f) +
                  static_cast<float>(a >= 1.75f) + 2.0f * static_cast<float>(a > 2.5f) +
                  2.0f * static_cast<float>(a >= 3.5f) + 4.0f * static_cast<float>(a > 5.0f);
  return x != x ? 12.0f : std::copysign(t, x);
}

// The floor(log2) of a block scale as the block-scaled step reads it, -126 for a zero scale (field_zero_low).
inline std::int32_t scale_exponent(float s) { return s == 0 ? -126 : std::ilogb(s); }

// The FP4 block steps (flash_kernel_fp4.cc).
void nvf4_terms(const float* sum, float a_scale, std::int32_t a_exp, const float* b_scale, const std::int32_t* b_exp,
                double* term, std::int32_t* term_e, std::size_t n);
void nvf4_group_sums(const float* p, std::size_t n, const float* v, std::size_t stride, std::size_t cols, float* sum);
void nvf4_p_block(float* p, std::size_t n, float sc, float scale, float* twice);
float mxfp4_block(const float* x, float* twice);
float nvfp4_block(const float* x, std::size_t n, std::size_t stride, float* twice, std::size_t twice_stride);

// exp_b(x) in float32 by the description's implementation.
inline float exp_b(float x, SoftmaxBase base, ExpImpl impl) {
  if (impl == ExpImpl::f64_rounded)
    return static_cast<float>(base == SoftmaxBase::two ? std::exp2(static_cast<double>(x)) : std::exp(static_cast<double>(x)));
  return base == SoftmaxBase::two ? std::exp2(x) : std::exp(x);
}

// Q or K quantised: codes [L, d] and one scale per group (arith f32: float32 values widened; f64: float64).
struct IntQuantized {
  RowMatrixXi32 codes;
  std::vector<double> scales;
  std::vector<int> group;
};

class FlashCall final : public PreparedCall {
 public:
  FlashCall(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale, const AttentionMask& mask,
            const FlashKernel& kernel, std::shared_ptr<const FlashKeyCodes> keys);

 private:
  // rows_impl runs steps (3)-(6) through a RowLoop: the working state of one call's chunks of query rows, with one
  // member per step of the loop (flash_kernel.cc)
  struct RowLoop;
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index rows) const override;
  // step (3) for rows [c0, c0 + n), all keys; split[t]: row c0 + t reads keys from split[t] on from the buffer
  void logits(Eigen::Index c0, Eigen::Index n, RowMatrixXf& s, const std::vector<Eigen::Index>& split) const;
  void prepare_flashq_qk(const RowMatrixXd& q, const RowMatrixXd& k);
  void prepare_int_qk(const MatrixView& q, const MatrixView& k);
  void prepare_fp8_qk(const MatrixView& q, const MatrixView& k);
  void prepare_nvfp4_qk(const MatrixView& q, const MatrixView& k);
  void smooth_qk(RowMatrixXd& q, RowMatrixXd& k);
  void keep_delta_s_parts(RowMatrixXd& k, const MatrixView& k_raw);
  double delta_s_dot(const Eigen::Ref<const Eigen::RowVectorXd>& mean, Eigen::Index j) const;
  void nvfp4_logits(Eigen::Index c0, Eigen::Index n, RowMatrixXf& s) const;
  void prepare_v(const MatrixView& v);
  // prepare_v's longer cases by v.scale (flash_kernel_prepare.cc)
  void prepare_v_nvfp4(const MatrixView& v);
  void prepare_v_flashq(const MatrixView& v);
  void prepare_v_channel_f32(const MatrixView& v);
  void prepare_v_channel_f64(const MatrixView& v);
  // fl32(scale) log2 e in float32: in float64 and rounded once (softmax.scale_log2 f64, FlashAttention-3's host) or
  // as fl32(fl32(scale) fl32(log2 e)) (f32, SageAttention's kernels)
  float scale_log2() const {
    const float sf = static_cast<float>(scale);
    if (f.softmax.scale_log2 == ScaleArith::f32) return sf * static_cast<float>(std::numbers::log2e);
    return static_cast<float>(static_cast<double>(sf) * std::numbers::log2e);
  }

  // exp_b(x) by the description's implementation; SAS of the distance -x in float64, rounded to float32
  float ex(float x) const {
    if (f.softmax.exp == ExpImpl::sas) return static_cast<float>(sas_exp(-static_cast<double>(x), sas));
    return exp_b(x, f.softmax.base, f.softmax.exp);
  }

  const FlashKernel f;
  const double scale;
  const AttentionMask& mask;
  const Eigen::Index lq, lk, d, dv;
  Eigen::Index key_block = 64, lk_padded = 0;
  std::vector<Eigen::Index> block_begin;  // key block starts, then lk_padded
  std::shared_ptr<const FlashKeyCodes> kc;  // a ready-made key side (a KV cache) while the call is built, or null
  bool buffered = false;                    // the key side has a buffer: rows read keys past their split from it
  Eigen::Index settled_from = 0, chunk = 1;  // the key side's split rule
  SasParams sas;
  std::unique_ptr<IntMatmulAbt> qk_buffer;  // Q codes times the buffer's K codes
  // v.scale block: V's codes (and the buffer's), int8, and one scale per key block
  using RowMatrixXi8 = Eigen::Matrix<std::int8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMatrixXi8 v_int, v_int_buffer;
  std::vector<double> v_block_scale;
  // int S: the codes' products, the scales and groups; Delta S's parts (smooth_q)
  std::unique_ptr<IntMatmulAbt> qk;
  IntQuantized qq, kq;  // codes released once qk holds them
  MatrixView k_in;
  RowMatrixXd k_basis;        // K' after a change of basis, for Delta S
  Eigen::RowVectorXd k_mean;  // K' = K_in - k_mean (smooth_k without a change of basis), for Delta S
  RowMatrixXd q_block_mean;   // row b: the mean subtracted from the queries of block b
  // e4m3 S: Q8 [L_q, d], K8^T [d, L_k] codes; s2 (one Q and one K group), or s2 of each (Q block, K block) with
  // qk.granularity block: s2_table[q group][k group], K groups of k_group_rows keys
  std::vector<std::uint8_t> q8_codes, k8t_codes;
  float s2 = 1;
  RowMatrixXf s2_table;
  std::vector<int> q_group_of, k_group_of;  // the s2_table row of each query, column of each key
  // nvfp4 S: twice the E2M1 values of Q [L_q, d] and K [L_k, d] (integers, exact in float), the E4M3 block scales
  // and their exponents per 16 channels: Q [L_q, d / 16], K transposed [d / 16, L_k]
  RowMatrixXf q4, k4, q4_scale, k4_scale_t;
  Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> q4_exp, k4_exp_t;
  // nvfp4 V: twice the E2M1 values [L_k, d_v], scales and exponents per 16 keys of a channel [ceil(L_k / 16), d_v]
  RowMatrixXf v4, v4_scale;
  Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> v4_exp;
  // V as the PV unit reads it: values (float32, exact in the format) by row, or E4M3 codes by row / by column;
  // binary16 exponents for HMMA
  std::vector<float> v_values;
  std::vector<std::int8_t> v_exponents;
  std::vector<std::uint8_t> v_codes;
  Eigen::Matrix<std::uint16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> v_codes_t;
  Eigen::RowVectorXd v_scale, v_mean;  // per channel (scale: finalize f64)
  float v_descale = 1;                 // per tensor (finalize reciprocal)
};

}  // namespace qattn::ref::flash_detail
