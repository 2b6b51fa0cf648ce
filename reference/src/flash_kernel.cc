#include "qattn/reference/flash_kernel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/sas.h"

namespace qattn::ref {

const MmaModel* pv_column_model(PvUnit unit) {
  switch (unit) {
    case PvUnit::h100_mma_e4m3: return &mma_preset("h100-mma-e4m3");

    default: return nullptr;
  }
}
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2eF32 = 1.44269504f;  // the log2 e of SageAttention's Triton quantiser (a float32 constant)
constexpr float kLog2SixthF32 = -2.584962500721156f;  // log2(1 / 6): NVFP4 P's block scale (SageAttention3's fp4_scale_log2)

// A value as an error message shows it: 9 significant digits, exponent where large or small.
std::string shown(double x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

std::string at(Eigen::Index i, Eigen::Index j) { return "[" + std::to_string(i) + ", " + std::to_string(j) + "]"; }

bool is_int(KernelFormat f) { return f == KernelFormat::int4 || f == KernelFormat::int8; }

// The largest value of a P~/V format: the factor that puts a channel's amax at the top of the format.
double format_max(KernelFormat f) {
  switch (f) {
    case KernelFormat::e4m3: return 448;
    case KernelFormat::e5m2: return 57344;
    case KernelFormat::int8: return 127;
    case KernelFormat::int4: return 7;
    case KernelFormat::fp16: return 65504;
    case KernelFormat::nvfp4: return 2688;
    case KernelFormat::mxfp4: return 6 * 0x1p127;
    case KernelFormat::bf16:
    case KernelFormat::fp32: return std::numeric_limits<float>::max();
  }
  return 1;
}

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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QATTN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QATTN_CLONES
#endif

// The block-scaled step's terms of one group for n outputs: sum[j] (4 times the exact sum of products: twice the E2M1
// values each) times a's scale / 4 and b's scales, and the exponents a_exp + b_exp[j] (-126 where a scale is zero;
// a_exp -100000 for a zero a scale).
QATTN_CLONES void nvf4_terms(const float* sum, float a_scale, std::int32_t a_exp, const float* b_scale,
                             const std::int32_t* b_exp, double* term, std::int32_t* term_e, std::size_t n) {
  const double a = static_cast<double>(a_scale * 0.25f);
  for (std::size_t j = 0; j < n; ++j) {
    term[j] = static_cast<double>(sum[j]) * a * static_cast<double>(b_scale[j]);
    term_e[j] = b_scale[j] == 0 ? -126 : std::max(a_exp + b_exp[j], std::int32_t{-126});
  }
}

// sum[c] = sum over j < n of p[j] v[j * stride + c]: the small integers of twice the E2M1 values, exact in float.
QATTN_CLONES void nvf4_group_sums(const float* p, std::size_t n, const float* v, std::size_t stride, std::size_t cols,
                                  float* sum) {
  std::fill(sum, sum + cols, 0.0f);
  for (std::size_t j = 0; j < n; ++j) {
    const float pj = p[j];
    if (pj == 0) continue;
    const float* vr = v + j * stride;
    for (std::size_t c = 0; c < cols; ++c) sum[c] += pj * vr[c];
  }
}

// P~ of n <= 16 keys over its block scale sc: twice the E2M1 codes into twice, and p = the decoded values times the
// block's E4M3 scale.
QATTN_CLONES void nvf4_p_block(float* p, std::size_t n, float sc, float scale, float* twice) {
  for (std::size_t j = 0; j < n; ++j) {
    const float tw = e2m1_twice(p[j] / sc);  // 0 / 0 in a block of masked keys: NaN, to 6 (scale 0)
    twice[j] = tw;
    p[j] = tw * 0.5f * scale;
  }
}

// The floor(log2) of a block scale as the block-scaled step reads it, -126 for a zero scale (field_zero_low).
inline std::int32_t scale_exponent(float s) { return s == 0 ? -126 : std::ilogb(s); }

// One MXFP4 block of 32 values (OCP MX v1.0): the scale 2^X, X = floor(log2 amax) - 2 (E2M1's emax) within
// [-127, 127] (-127 for an all-zero block), the codes E2M1(x / 2^X) (exact division), written as twice their values;
// returns 2^X.
float mxfp4_block(const float* x, float* twice) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const int e = amax == 0 ? -127 : std::clamp(std::ilogb(amax) - 2, -127, 127);
  const float scale = std::ldexp(1.0f, e);
  for (int i = 0; i < 32; ++i) twice[i] = e2m1_twice(x[i] / scale);
  return scale;
}

// One NVFP4 block of n <= 16 values x[i * stride]: the E4M3 scale SF = E4M3(fl32(amax / 6)) (nearest even,
// saturating), the codes E2M1(fl32(x fl32(1 / SF))), 0 where SF = 0, written as twice their values; returns SF.
float nvfp4_block(const float* x, std::size_t n, std::size_t stride, float* twice, std::size_t twice_stride) {
  float amax = 0;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i * stride]));
  const float sf = e4m3_round_saturate(amax / 6.0f);
  const float inv = sf == 0 ? 0.0f : 1.0f / sf;
  for (std::size_t i = 0; i < n; ++i) twice[i * twice_stride] = e2m1_twice(x[i * stride] * inv);
  return sf;
}

// P~ (float32) rounded to the P format.
inline float round_p(float x, KernelFormat f) {
  switch (f) {
    case KernelFormat::e4m3: return e4m3_round_saturate(x);
    case KernelFormat::e5m2:
      return static_cast<float>(lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate));
    case KernelFormat::int8: return std::nearbyint(x);
    case KernelFormat::fp16: return static_cast<float>(round_to_binary16(x));
    case KernelFormat::bf16: return static_cast<float>(round_to_bfloat16(x));
    default: return x;  // fp32; nvfp4 is quantised per block of keys in the loop
  }
}

float fp22(double x) {
  return static_cast<float>(lowp_round(x, fp22_accumulator(), LowpRounding::rz, LowpOverflow::non_saturating));
}

// exp_b(x) in float32 by the description's implementation.
inline float exp_b(float x, SoftmaxBase base, ExpImpl impl) {
  if (impl == ExpImpl::f64_rounded)
    return static_cast<float>(base == SoftmaxBase::two ? std::exp2(static_cast<double>(x)) : std::exp(static_cast<double>(x)));
  return base == SoftmaxBase::two ? std::exp2(x) : std::exp(x);
}

// The row sum over a block's values pr[b0, b1) into the row's partial sums `into`: each thread's columns in order
// ((j - b0) mod 8) / 2, or per 16-column tile of the mma layout, ((P_2t + P_2t+1) + P_8+2t) + P_8+2t+1 added at once
void row_sum(const FlashKernel::Softmax& sm, const float* pr, Eigen::Index b0, Eigen::Index b1, std::array<float, 4>& into) {
  const int threads = sm.row_sum_threads;
  if (sm.row_sum_tile == RowSumTile::lanes8) {  // FlashAttention-4's fadd_reduce, l r in lane 0
    std::array<float, 8> lane{};
    lane[0] = into[0];
    for (Eigen::Index j = b0; j < b1; ++j) lane[static_cast<std::size_t>((j - b0) % 8)] += pr[j];
    into[0] = ((lane[0] + lane[2]) + (lane[4] + lane[6])) + ((lane[1] + lane[3]) + (lane[5] + lane[7]));
  } else if (threads == 1) {
    for (Eigen::Index j = b0; j < b1; ++j) into[0] += pr[j];
  } else if (sm.row_sum_tile == RowSumTile::octets32) {
    for (Eigen::Index j = b0; j < b1; ++j) into[static_cast<std::size_t>((j - b0) % 32 / 8)] += pr[j];
  } else if (sm.row_sum_tile == RowSumTile::column) {
    for (Eigen::Index j = b0; j < b1; ++j) into[static_cast<std::size_t>((j - b0) % 8 / 2)] += pr[j];
  } else {
    const auto at_or_0 = [&](Eigen::Index j) { return j < b1 ? pr[j] : 0.0f; };
    for (Eigen::Index j0 = b0; j0 < b1; j0 += 16)
      for (int th = 0; th < 4; ++th) {
        const Eigen::Index c = j0 + 2 * th;
        into[static_cast<std::size_t>(th)] += ((at_or_0(c) + at_or_0(c + 1)) + at_or_0(c + 8)) + at_or_0(c + 9);
      }
  }
}

// Q or K quantised: codes [L, d] and one scale per group (arith f32: float32 values widened; f64: float64).
struct IntQuantized {
  RowMatrixXi32 codes;
  std::vector<double> scales;
  std::vector<int> group;
};

// Integer codes of x per group, scale fl32(amax / qmax) and codes trunc(fl32(fl32(x / s) + 0.5 sign)) (half away)
// or nearbyint (half even) in float32; an all-zero group has scale 0 and codes 0. x holds float32 values.
IntQuantized quantize_f32(const std::vector<float>& x, Eigen::Index rows, Eigen::Index cols, bool is_query,
                          const FlashKernel::Qk& qk) {
  const float qmax = qk.format == KernelFormat::int4 ? 7.0f : 127.0f;
  IntQuantized r;
  r.codes.resize(rows, cols);
  r.group.resize(static_cast<std::size_t>(rows));
  int groups = 0;
  for (Eigen::Index n = 0; n < rows; ++n) {
    r.group[static_cast<std::size_t>(n)] = sage_group_of(static_cast<int>(n), is_query, qk.granularity, qk.groups);
    groups = std::max(groups, r.group[static_cast<std::size_t>(n)] + 1);
  }
  std::vector<float> amax(static_cast<std::size_t>(groups), 0.0f);
  for (Eigen::Index n = 0; n < rows; ++n)
    for (Eigen::Index c = 0; c < cols; ++c) {
      float& a = amax[static_cast<std::size_t>(r.group[static_cast<std::size_t>(n)])];
      a = std::max(a, std::fabs(x[static_cast<std::size_t>(n * cols + c)]));
    }
  std::vector<float> s(amax.size());
  for (std::size_t g = 0; g < s.size(); ++g) s[g] = qk.scale == ScaleRule::amax_eps ? amax[g] / qmax + 1e-7f : amax[g] / qmax;
  r.scales.assign(s.begin(), s.end());
  for (Eigen::Index n = 0; n < rows; ++n) {
    const float sg = s[static_cast<std::size_t>(r.group[static_cast<std::size_t>(n)])];
    for (Eigen::Index c = 0; c < cols; ++c) {
      if (sg == 0) {
        r.codes(n, c) = 0;
        continue;
      }
      const float y = x[static_cast<std::size_t>(n * cols + c)] / sg;
      const float code = qk.rounding == QuantRounding::half_away ? std::trunc(y + (y >= 0 ? 0.5f : -0.5f)) : std::nearbyint(y);
      r.codes(n, c) = static_cast<std::int32_t>(std::clamp(code, -qmax, qmax));
    }
  }
  return r;
}

// x read as float32; values beyond float32 are refused, naming the tensor.
float to_f32(double x, const char* tensor, Eigen::Index i, Eigen::Index j, const std::string& name, const char* what) {
  const float f = static_cast<float>(x);
  if (!std::isfinite(f))
    throw InputError(tensor, at(i, j), shown(x) + " is beyond float32, in which " + name + " " + what + " " + tensor);
  return f;
}

// E4M3 codes of one tensor and its descales, one per group of rows (`groups` rows each; 0: the whole tensor): amax:
// descale fl32(amax / 448), X8 = E4M3(fl32(fl32(X) / descale)); one: descale 1, X8 = E4M3(fl32(X)), refusing what
// torch's cast makes NaN (|x| >= 464).
std::vector<std::uint8_t> e4m3_groups(const MatrixView& x, ScaleRule rule, Eigen::Index groups, const char* tensor,
                                      const std::string& name, std::vector<float>& descale) {
  const Eigen::Index per = groups > 0 ? groups : std::max<Eigen::Index>(1, x.rows());
  descale.assign(static_cast<std::size_t>(std::max<Eigen::Index>(1, (x.rows() + per - 1) / per)), 1.0f);
  std::vector<float> amax(descale.size(), 0.0f);
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      float& a = amax[static_cast<std::size_t>(i / per)];
      a = std::max(a, std::fabs(to_f32(x(i, j), tensor, i, j, name, "reads")));
    }
  for (std::size_t g = 0; g < descale.size(); ++g)
    descale[g] = rule != ScaleRule::one && amax[g] > 0 ? amax[g] / 448.0f : 1.0f;
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(x.rows() * x.cols()));
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      const float xf = static_cast<float>(x(i, j));
      const float y = rule != ScaleRule::one ? xf / descale[static_cast<std::size_t>(i / per)] : xf;
      if (rule == ScaleRule::one && !(std::fabs(y) < 464.0f))
        throw InputError(tensor, at(i, j),
                         shown(xf) + " is beyond E4M3's range: torch's .to(float8_e4m3fn) makes it NaN (" + name +
                             " casts without a scale; a scale of amax / 448 per tensor avoids it)");
      codes[static_cast<std::size_t>(i * x.cols() + j)] =
          static_cast<std::uint8_t>(lowp_encode(e4m3_round_saturate(y), fp8_e4m3fn()));
    }
  return codes;
}

}  // namespace

float fa4_ex2_emulation(float x) {
  constexpr float c1 = 0x1.63ea32p-1f, c2 = 0x1.d20d48p-3f, c3 = 0x1.3be13ap-4f;
  if (x > 127.0f) return std::numeric_limits<float>::infinity();  // beyond FA4's domain: as the hardware's exp2
  if (std::fabs(x) < 0x1p-126f) x = 0.0f;
  x = std::fmax(x, -127.0f);
  const float n = std::floor(x);  // RD(x + 1.5 2^23) - 1.5 2^23, exact for |x| < 2^22
  const float f = x - n;          // exact, in [0, 1)
  const float p = std::fma(std::fma(std::fma(c3, f, c2), f, c1), f, 1.0f);
  const std::uint32_t bits =
      std::bit_cast<std::uint32_t>(p) + (static_cast<std::uint32_t>(static_cast<std::int32_t>(n)) << 23);
  return (bits & 0x7f800000u) == 0 ? 0.0f : std::bit_cast<float>(bits);
}

namespace {

class FlashCall final : public PreparedCall {
 public:
  FlashCall(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale, const AttentionMask& mask,
            const FlashKernel& kernel, std::shared_ptr<const FlashKeyCodes> keys);

 private:
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

FlashCall::FlashCall(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                     const AttentionMask& mask, const FlashKernel& kernel, std::shared_ptr<const FlashKeyCodes> keys)
    : PreparedCall(q.rows()), f(kernel), scale(scale), mask(mask), lq(q.rows()), lk(k.rows()), d(q.cols()),
      dv(v.cols()), kc(std::move(keys)), k_in(k) {
  key_block = f.keys.block > 0 ? f.keys.block : fa3_fp8_key_block(d);
  sas.n_r = f.softmax.sas_nr;
  sas.poly = f.softmax.sas_poly == SasCubic::paper ? kSasPaperPoly : sas_lsq_poly();
  sas.half = f.softmax.sas_half;
  if (kc) {
    const std::size_t nb = kc->begin.size();
    if (f.qk.max == 0 || f.v.scale != VScale::block)
      throw SpecError(f.name + ": a ready-made key side takes FlashQ Q/K and V (qk.max > 0, v.scale block)");
    if (nb < 2 || kc->begin.front() != 0 || kc->begin.back() != lk || !std::is_sorted(kc->begin.begin(), kc->begin.end()) ||
        kc->k_scale.size() != nb - 1 || kc->v_scale.size() != nb - 1 || kc->k_settled.rows() != lk ||
        kc->k_settled.cols() != d || kc->v_settled.rows() != lk || kc->v_settled.cols() != dv ||
        kc->settled_from < 0 || kc->chunk < 1)
      throw std::logic_error(f.name + ": the key side's blocks, scales or codes do not fit K and V");
    buffered = kc->k_buffer.size() > 0;
    if (buffered && (kc->k_buffer.rows() != lk || kc->k_buffer.cols() != d || kc->v_buffer.rows() != lk ||
                     kc->v_buffer.cols() != dv))
      throw std::logic_error(f.name + ": the key side's buffer does not fit K and V");
    lk_padded = lk;
    block_begin = kc->begin;
    settled_from = kc->settled_from;
    chunk = kc->chunk;
  } else {
    lk_padded = f.keys.pad == KeyPad::zeros ? (lk + key_block - 1) / key_block * key_block : lk;
    for (Eigen::Index b0 = 0; b0 < lk_padded; b0 += key_block) block_begin.push_back(b0);
    block_begin.push_back(lk_padded);
  }
  if (f.pv.promote_keys % key_block != 0)
    throw SpecError(f.name + ": pv.promote_keys = " + std::to_string(f.pv.promote_keys) +
                    " is not a multiple of the key block (" + std::to_string(key_block) + " keys for d = " +
                    std::to_string(d) + ")");
  if (f.qk.format == KernelFormat::e4m3) {
    if (d > 256 || dv > 256)
      throw InputError("Q", "head_dim", "d = " + std::to_string(d) + ", d_v = " + std::to_string(dv) + ": e4m3 Q/K on the wgmma as "
                                            "FlashAttention-3's FP8 kernel takes head dimensions up to 256");
    prepare_fp8_qk(q, k);
  } else if (f.qk.format == KernelFormat::nvfp4 || f.qk.format == KernelFormat::mxfp4) {
    prepare_nvfp4_qk(q, k);
  } else {
    prepare_int_qk(q, k);
  }
  prepare_v(v);
  kc.reset();  // its codes are copied where the loop reads them
}

// Step (1) on the call's Q and K (copies): the change of basis, K smoothing, Q's block means (kept for Delta S).
void FlashCall::smooth_qk(RowMatrixXd& q, RowMatrixXd& k) {
  const FlashKernel::Qk& p = f.qk;
  transform_qk(q, k, p.transform, p.alpha, p.hadamard_seed, f.name);
  if (p.smooth_k && lk > 0) k.rowwise() -= Eigen::RowVectorXd(k.colwise().mean());
  if (p.smooth_q) {
    const Eigen::Index bq = p.groups.block_q;
    q_block_mean.resize((lq + bq - 1) / bq, d);
    for (Eigen::Index b0 = 0; b0 < lq; b0 += bq) {
      const Eigen::Index n = std::min(bq, lq - b0);
      q_block_mean.row(b0 / bq) = q.middleRows(b0, n).colwise().mean();
      for (Eigen::Index i = b0; i < b0 + n; ++i) q.row(i) -= q_block_mean.row(b0 / bq);
    }
  }
}

// Delta S reads K' only with smooth_q. Without a change of basis K' is K_in - mean (or K_in), formed again from the
// caller's K and the mean (the same doubles) instead of held.
void FlashCall::keep_delta_s_parts(RowMatrixXd& k, const MatrixView& k_raw) {
  const FlashKernel::Qk& p = f.qk;
  if (p.smooth_q && p.transform == QkTransform::none && p.smooth_k && lk > 0) k_mean = k_raw.colwise().mean();
  if (p.smooth_q && p.transform != QkTransform::none) k_basis = std::move(k);
}

// mean K'_j in float64, the dot product of Delta S
double FlashCall::delta_s_dot(const Eigen::Ref<const Eigen::RowVectorXd>& mean, Eigen::Index j) const {
  if (k_basis.size()) return mean.dot(k_basis.row(j));
  if (k_mean.size()) return mean.dot(k_in.row(j) - k_mean);
  return mean.dot(k_in.row(j));
}

// FlashQ (flashq.h): Q per block of block_q rows, K per block of block_k keys (or the key side's codes), each
// s = amax / qk.max in float64, codes nearest even in [-qk.max, qk.max].
void FlashCall::prepare_flashq_qk(const RowMatrixXd& q, const RowMatrixXd& k) {
  const auto blocks = [&](const RowMatrixXd& x, Eigen::Index rows_per, IntQuantized& out) {
    out.codes.resize(x.rows(), x.cols());
    out.group.resize(static_cast<std::size_t>(x.rows()));
    for (Eigen::Index b0 = 0; b0 < x.rows(); b0 += rows_per) {
      const Eigen::Index n = std::min(rows_per, x.rows() - b0);
      FlashQBlock blk = flashq_quantize_block(x.middleRows(b0, n), f.qk.max);
      out.codes.middleRows(b0, n) = blk.values;
      out.scales.push_back(blk.scale);
      std::fill_n(out.group.begin() + b0, n, static_cast<int>(out.scales.size() - 1));
    }
  };
  blocks(q, f.qk.groups.block_q, qq);
  if (!kc) {
    blocks(k, f.qk.groups.block_k, kq);
    return;
  }
  kq.codes = kc->k_settled;
  kq.scales = kc->k_scale;
  kq.group.resize(static_cast<std::size_t>(lk));
  for (std::size_t b = 0; b + 1 < kc->begin.size(); ++b)
    std::fill(kq.group.begin() + kc->begin[b], kq.group.begin() + kc->begin[b + 1], static_cast<int>(b));
  if (buffered) qk_buffer = std::make_unique<IntMatmulAbt>(qq.codes, kc->k_buffer);
}

void FlashCall::prepare_int_qk(const MatrixView& q_in, const MatrixView& k_raw) {
  const FlashKernel::Qk& p = f.qk;
  RowMatrixXd q = q_in;
  RowMatrixXd k = k_raw;
  smooth_qk(q, k);
  if (p.max > 0) {
    prepare_flashq_qk(q, k);
  } else if (p.arith == ScaleArith::f32) {
    std::vector<float> xq(static_cast<std::size_t>(lq * d)), xk(static_cast<std::size_t>(lk * d));
    const float factor = static_cast<float>(scale * static_cast<double>(kLog2eF32));
    for (Eigen::Index i = 0; i < lq; ++i)
      for (Eigen::Index c = 0; c < d; ++c) {
        float x = to_f32(q(i, c), "Q", i, c, f.name, "quantises");
        if (f.softmax.scale_at == ScaleAt::q) {
          x *= factor;
          if (!std::isfinite(x)) throw_logit_overflow(f.name, "float32", i, 0);
        }
        xq[static_cast<std::size_t>(i * d + c)] = x;
      }
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < d; ++c) xk[static_cast<std::size_t>(j * d + c)] = to_f32(k(j, c), "K", j, c, f.name, "quantises");
    qq = quantize_f32(xq, lq, d, true, p);
    kq = quantize_f32(xk, lk, d, false, p);
  } else {
    const int bits = p.format == KernelFormat::int4 ? 4 : 8;
    const SageRounding r = p.rounding == QuantRounding::half_away ? SageRounding::half_away : SageRounding::half_even;
    SageQuantized sq = sage_quantize(q, true, p.granularity, bits, r, p.groups);
    qq = IntQuantized{std::move(sq.values), std::move(sq.scales), std::move(sq.group)};
    SageQuantized sk = sage_quantize(k, false, p.granularity, bits, r, p.groups);
    kq = IntQuantized{std::move(sk.values), std::move(sk.scales), std::move(sk.group)};
  }
  qk = std::make_unique<IntMatmulAbt>(qq.codes, kq.codes);
  qq.codes.resize(0, 0);
  kq.codes.resize(0, 0);
  if (f.softmax.scale_at == ScaleAt::exp) {  // S = fl32(A); s2 per (Q group, K group) = fl32(scale_log2 fl32(s_Q s_K))
    const float sl2 = scale_log2();
    s2_table.resize(static_cast<Eigen::Index>(qq.scales.size()), static_cast<Eigen::Index>(kq.scales.size()));
    for (std::size_t a = 0; a < qq.scales.size(); ++a)
      for (std::size_t b = 0; b < kq.scales.size(); ++b)
        s2_table(static_cast<Eigen::Index>(a), static_cast<Eigen::Index>(b)) =
            sl2 * static_cast<float>(static_cast<float>(qq.scales[a]) * static_cast<float>(kq.scales[b]));
    q_group_of = qq.group;
    k_group_of = kq.group;
  }
  keep_delta_s_parts(k, k_raw);
}

void FlashCall::prepare_fp8_qk(const MatrixView& q_in, const MatrixView& k_in_) {
  // incoherent processing: Q and K through the change of basis first (float64), then read as float32
  RowMatrixXd qt, kt;
  const bool transformed = f.qk.transform != QkTransform::none;
  if (transformed) {
    qt = q_in, kt = k_in_;
    transform_qk(qt, kt, f.qk.transform, f.qk.alpha, f.qk.hadamard_seed, f.name);
  }
  const MatrixView q = transformed ? MatrixView(qt) : q_in, k = transformed ? MatrixView(kt) : k_in_;
  const bool blocks = f.qk.granularity == SageGranularity::block;
  const Eigen::Index q_group_rows = blocks ? f.qk.groups.block_q : 0, k_group_rows = blocks ? f.qk.groups.block_k : 0;
  std::vector<float> q_descale, k_descale;
  q8_codes = e4m3_groups(q, f.qk.scale, q_group_rows, "Q", f.name, q_descale);
  const std::vector<std::uint8_t> k8 = e4m3_groups(k, f.qk.scale, k_group_rows, "K", f.name, k_descale);
  if (blocks) {
    for (Eigen::Index i = 0; i < lq; ++i) q_group_of.push_back(static_cast<int>(i / q_group_rows));
    for (Eigen::Index j = 0; j < lk; ++j) k_group_of.push_back(static_cast<int>(j / k_group_rows));
  }
  k8t_codes.resize(k8.size());
  for (Eigen::Index j = 0; j < lk; ++j)
    for (Eigen::Index c = 0; c < d; ++c)
      k8t_codes[static_cast<std::size_t>(c * lk + j)] = k8[static_cast<std::size_t>(j * d + c)];
  // The host's softmax_scale_log2 (float = float * double), then the kernel's *= q_descale * k_descale.
  const float softmax_scale_log2 = scale_log2();
  s2 = softmax_scale_log2 * (q_descale[0] * k_descale[0]);
  if (blocks) {
    s2_table.resize(static_cast<Eigen::Index>(q_descale.size()), static_cast<Eigen::Index>(k_descale.size()));
    for (std::size_t a = 0; a < q_descale.size(); ++a)
      for (std::size_t b = 0; b < k_descale.size(); ++b)
        s2_table(static_cast<Eigen::Index>(a), static_cast<Eigen::Index>(b)) = softmax_scale_log2 * (q_descale[a] * k_descale[b]);
  }
}

void FlashCall::prepare_nvfp4_qk(const MatrixView& q_in, const MatrixView& k_raw) {
  const FlashKernel::Qk& p = f.qk;
  RowMatrixXd q = q_in;
  RowMatrixXd k = k_raw;
  smooth_qk(q, k);
  // d padded with zero channels to whole blocks of 16 (NVFP4) or 32 (MXFP4); they add exact zeros to S. The scales
  // are kept per group of 16 (an MX block's scale twice).
  const bool mx = p.format == KernelFormat::mxfp4;
  const Eigen::Index block = mx ? 32 : 16, groups = (d + block - 1) / block * (block / 16);
  // One operand: values read as float32, NVFP4 per 16 channels of each row, or MXFP4 per 32.
  const auto quantize = [&](const RowMatrixXd& x, const char* tensor, RowMatrixXf& twice, RowMatrixXf& scale) {
    twice.resize(x.rows(), groups * 16);
    scale.resize(x.rows(), groups);
    std::array<float, 32> row;
    for (Eigen::Index i = 0; i < x.rows(); ++i)
      for (Eigen::Index b0 = 0; b0 < groups * 16; b0 += block) {
        for (Eigen::Index c = 0; c < block; ++c)
          row[static_cast<std::size_t>(c)] = b0 + c < d ? to_f32(x(i, b0 + c), tensor, i, b0 + c, f.name, "quantises") : 0.0f;
        if (mx) {
          scale(i, b0 / 16) = scale(i, b0 / 16 + 1) = mxfp4_block(row.data(), &twice(i, b0));
        } else {
          scale(i, b0 / 16) = nvfp4_block(row.data(), 16, 1, &twice(i, b0), 1);
        }
      }
  };
  RowMatrixXf k_scale;
  quantize(q, "Q", q4, q4_scale);
  quantize(k, "K", k4, k_scale);
  k4_scale_t = k_scale.transpose();
  q4_exp.resize(lq, groups);
  k4_exp_t.resize(groups, lk);
  for (Eigen::Index i = 0; i < lq; ++i)
    for (Eigen::Index g = 0; g < groups; ++g) q4_exp(i, g) = scale_exponent(q4_scale(i, g));
  for (Eigen::Index g = 0; g < groups; ++g)
    for (Eigen::Index j = 0; j < lk; ++j) k4_exp_t(g, j) = scale_exponent(k4_scale_t(g, j));
  keep_delta_s_parts(k, k_raw);
  s2 = scale_log2();  // no descales: the block scales are inside the products
}

// S on b200-nvf4: per key tile, each group's exact sums (a float GEMM of the small integers), then d in steps of 64
// (4 groups) from C = Delta S (raw, float32) or 0.
void FlashCall::nvfp4_logits(Eigen::Index c0, Eigen::Index n, RowMatrixXf& s) const {
  constexpr Eigen::Index kKeyTile = 512, kStepGroups = 4;
  const Eigen::Index groups = q4.cols() / 16;  // d in whole blocks
  std::vector<RowMatrixXf> sums(static_cast<std::size_t>(groups));
  std::vector<double> term(static_cast<std::size_t>(kStepGroups * kKeyTile));
  std::vector<std::int32_t> term_e(term.size());
  for (Eigen::Index k0 = 0; k0 < lk; k0 += kKeyTile) {
    const Eigen::Index cols = std::min(kKeyTile, lk - k0);
    for (Eigen::Index g = 0; g < groups; ++g)
      sums[static_cast<std::size_t>(g)].noalias() = q4.block(c0, g * 16, n, 16) * k4.block(k0, g * 16, cols, 16).transpose();
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t;
      float* acc = &s(t, k0);
      if (f.qk.smooth_q) {  // Delta S = mean_b K'_j, raw (its scale enters with S's), as the first step's C
        const auto mean = q_block_mean.row(i / f.qk.groups.block_q);
        for (Eigen::Index j = 0; j < cols; ++j) acc[j] = static_cast<float>(delta_s_dot(mean, k0 + j));
      } else {
        std::fill(acc, acc + cols, 0.0f);
      }
      for (Eigen::Index g0 = 0; g0 < groups; g0 += kStepGroups) {
        const Eigen::Index ng = std::min(kStepGroups, groups - g0);
        for (Eigen::Index g = 0; g < ng; ++g) {
          const float qs = q4_scale(i, g0 + g);
          nvf4_terms(&sums[static_cast<std::size_t>(g0 + g)](t, 0), qs, qs == 0 ? -100000 : q4_exp(i, g0 + g),
                     &k4_scale_t(g0 + g, k0), &k4_exp_t(g0 + g, k0), term.data() + g * cols, term_e.data() + g * cols,
                     static_cast<std::size_t>(cols));
        }
        scaled_group_step(acc, term.data(), term_e.data(), static_cast<std::size_t>(ng), static_cast<std::size_t>(cols),
                          static_cast<std::size_t>(cols));
      }
    }
  }
}

void FlashCall::prepare_v(const MatrixView& v) {
  const FlashKernel::V& p = f.v;
  const std::size_t count = static_cast<std::size_t>(lk * dv);
  v_scale = Eigen::RowVectorXd::Ones(dv);
  v_mean = Eigen::RowVectorXd::Zero(dv);
  if (p.scale == VScale::block16) {  // NVFP4: per channel, blocks of 16 keys (the last one padded with zeros)
    const Eigen::Index blocks = (lk + 15) / 16;
    v4.resize(lk, dv);
    v4_scale.resize(blocks, dv);
    v4_exp.resize(blocks, dv);
    std::array<float, 16> x;
    for (Eigen::Index c = 0; c < dv; ++c)
      for (Eigen::Index b = 0; b < blocks; ++b) {
        const Eigen::Index n = std::min<Eigen::Index>(16, lk - b * 16);
        for (Eigen::Index i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = to_f32(v(b * 16 + i, c), "V", b * 16 + i, c, f.name, "quantises");
        v4_scale(b, c) = nvfp4_block(x.data(), static_cast<std::size_t>(n), 1, &v4(b * 16, c), static_cast<std::size_t>(dv));
        v4_exp(b, c) = scale_exponent(v4_scale(b, c));
      }
    return;
  }
  if (p.scale == VScale::block) {  // FlashQ: int8 per key block over every channel, amax / v.max (or the key side's)
    const auto int8_of = [&](const RowMatrixXi32& x) {
      if (x.size() && (x.minCoeff() < -128 || x.maxCoeff() > 127))
        throw std::logic_error(f.name + ": a V code leaves int8");  // not reached: FlashQ codes and clamped values
      return RowMatrixXi8(x.cast<std::int8_t>());
    };
    if (kc) {
      v_int = int8_of(kc->v_settled);
      if (buffered) v_int_buffer = int8_of(kc->v_buffer);
      v_block_scale = kc->v_scale;
      return;
    }
    v_int.resize(lk, dv);
    const int range = p.max > 0 ? static_cast<int>(p.max) : 127;
    for (Eigen::Index b0 = 0; b0 < lk; b0 += key_block) {
      const Eigen::Index n = std::min(key_block, lk - b0);
      FlashQBlock blk = flashq_quantize_block(v.middleRows(b0, n), range);
      v_int.middleRows(b0, n) = blk.values.cast<std::int8_t>();  // in [-range, range]
      v_block_scale.push_back(blk.scale);
    }
    return;
  }
  if (p.scale == VScale::tensor) {  // E4M3 per tensor (validate); decoded for the units that read values
    std::vector<float> descale;
    v_codes = e4m3_groups(v, p.rule, 0, "V", f.name, descale);
    v_descale = descale[0];
    if (f.pv.unit == PvUnit::fp32 || f.pv.unit == PvUnit::fp22) {
      v_values.resize(count);
      for (std::size_t i = 0; i < count; ++i) v_values[i] = static_cast<float>(lowp_decode(v_codes[i], fp8_e4m3fn()));
    }
  } else if (p.format == KernelFormat::fp16 && p.scale == VScale::none) {
    v_values.resize(count);
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < dv; ++c) {
        const double x = round_to_binary16(v(j, c));
        if (!std::isfinite(x))
          throw InputError("V", at(j, c), shown(v(j, c)) + " is beyond binary16 (65504), in which " + f.name + " holds V");
        v_values[static_cast<std::size_t>(j * dv + c)] = static_cast<float>(x);
      }
  } else if (p.arith == ScaleArith::f32) {  // per channel, float32: v8 = E4M3(fl32(fl32(v) fl32(max / amax)))
    RowMatrixXd v8(lk, dv);
    const float range = static_cast<float>(p.max > 0 ? p.max : format_max(p.format));
    for (Eigen::Index c = 0; c < dv; ++c) {
      float amax = 0;
      for (Eigen::Index j = 0; j < lk; ++j) amax = std::max(amax, std::fabs(to_f32(v(j, c), "V", j, c, f.name, "scales")));
      v_scale(c) = amax > 0 ? amax / range : 1.0f;  // an all-zero channel: scale 1 (the kernels divide 0 by 0)
      const float recip = amax > 0 ? range / amax : 1.0f;
      for (Eigen::Index j = 0; j < lk; ++j)
        v8(j, c) = lowp_round(static_cast<float>(v(j, c)) * recip, p.format == KernelFormat::e5m2 ? fp8_e5m2() : fp8_e4m3fn(),
                              LowpRounding::rne, LowpOverflow::saturate);
    }
    v_values.resize(count);
    if (p.format == KernelFormat::e4m3) v_codes.resize(count);
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < dv; ++c) {
        const auto at_jc = static_cast<std::size_t>(j * dv + c);
        if (p.format == KernelFormat::e4m3) v_codes[at_jc] = static_cast<std::uint8_t>(lowp_encode(v8(j, c), fp8_e4m3fn()));
        v_values[at_jc] = static_cast<float>(v8(j, c));
      }
  } else {  // per channel, float64: V (- mean) scaled to the format's top, rounded
    RowMatrixXd v8 = v;
    if (p.smooth && lk > 0) {
      v_mean = v.colwise().mean();
      v8.rowwise() -= v_mean;
    }
    const double range = p.format == KernelFormat::fp16 ? 1 : p.max > 0 ? p.max : format_max(p.format);
    for (Eigen::Index c = 0; c < dv; ++c) {
      const double amax = lk ? v8.col(c).cwiseAbs().maxCoeff() : 0.0;
      v_scale(c) = p.format == KernelFormat::fp16 ? 1.0 : (amax > 0 ? amax / range : 1.0);
      for (Eigen::Index j = 0; j < lk; ++j) {
        const double x = v8(j, c) / v_scale(c);
        switch (p.format) {
          case KernelFormat::e4m3: v8(j, c) = lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate); break;
          case KernelFormat::e5m2: v8(j, c) = lowp_round(x, fp8_e5m2(), LowpRounding::rne, LowpOverflow::saturate); break;
          case KernelFormat::int8: v8(j, c) = std::clamp(std::nearbyint(x), -127.0, 127.0); break;
          default: v8(j, c) = round_to_binary16(x); break;
        }
      }
    }
    if (f.pv.unit == PvUnit::h100_wgmma_e4m3 || f.pv.unit == PvUnit::b200_tcgen05_e4m3 ||
        f.pv.unit == PvUnit::ada_mma_e4m3 || f.pv.unit == PvUnit::ada_mma_e4m3_acc16 ||
        pv_column_model(f.pv.unit) != nullptr) {
      v_codes.resize(count);
      for (Eigen::Index j = 0; j < lk; ++j)
        for (Eigen::Index c = 0; c < dv; ++c)
          v_codes[static_cast<std::size_t>(j * dv + c)] = static_cast<std::uint8_t>(lowp_encode(v8(j, c), fp8_e4m3fn()));
    } else {
      v_values.resize(count);
      for (Eigen::Index j = 0; j < lk; ++j)
        for (Eigen::Index c = 0; c < dv; ++c) v_values[static_cast<std::size_t>(j * dv + c)] = static_cast<float>(v8(j, c));
    }
  }
  if (f.pv.unit == PvUnit::h100_hmma_f16_acc16) {
    v_exponents.resize(count);
    for (std::size_t i = 0; i < count; ++i) v_exponents[i] = hmma_f16_exponent(v_values[i]);
  }
  if (pv_column_model(f.pv.unit) != nullptr) {
    v_codes_t.resize(dv, lk);
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < dv; ++c) v_codes_t(c, j) = v_codes[static_cast<std::size_t>(j * dv + c)];
    v_codes.clear();
    v_codes.shrink_to_fit();
  }
}

void FlashCall::logits(Eigen::Index c0, Eigen::Index n, RowMatrixXf& s, const std::vector<Eigen::Index>& split) const {
  if (f.qk.format == KernelFormat::nvfp4 || f.qk.format == KernelFormat::mxfp4) {
    nvfp4_logits(c0, n, s);
    return;
  }
  if (f.qk.format == KernelFormat::e4m3) {  // an FP8 unit: d in steps of 32 from zero, each output alone
    constexpr Eigen::Index kKeyTile = 512;
    constexpr std::size_t kStep = 32;
    std::array<float, 256> q_row;  // d <= 256 (the constructor's check)
    std::array<std::int8_t, 256> q_row_e;
    std::vector<float> k_tile(static_cast<std::size_t>(d * kKeyTile));
    std::vector<std::int8_t> k_tile_e(k_tile.size());
    s.topRows(n).setZero();
    for (Eigen::Index k0 = 0; k0 < lk; k0 += kKeyTile) {
      const auto cols = static_cast<std::size_t>(std::min(kKeyTile, lk - k0));
      for (Eigen::Index c = 0; c < d; ++c)
        e4m3_decode(k8t_codes.data() + c * lk + k0, cols, k_tile.data() + c * kKeyTile, k_tile_e.data() + c * kKeyTile);
      for (Eigen::Index t = 0; t < n; ++t) {
        e4m3_decode(q8_codes.data() + (c0 + t) * d, static_cast<std::size_t>(d), q_row.data(), q_row_e.data());
        for (Eigen::Index d0 = 0; d0 < d; d0 += static_cast<Eigen::Index>(kStep))
          (f.qk.unit == SUnit::b200_tcgen05_e4m3 ? tcgen05_e4m3_step : wgmma_e4m3_step)(&s(t, k0), q_row.data() + d0, static_cast<std::size_t>(std::min<Eigen::Index>(kStep, d - d0)),
                          k_tile.data() + d0 * kKeyTile, k_tile_e.data() + d0 * kKeyTile,
                          static_cast<std::size_t>(kKeyTile), cols);
      }
    }
    return;
  }
  RowMatrixXi32 a = qk->rows(c0, n);  // exact
  if (buffered) {  // keys from the row's split on: the buffer's codes
    const RowMatrixXi32 a2 = qk_buffer->rows(c0, n);
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index from = split[static_cast<std::size_t>(t)];
      a.row(t).tail(lk - from) = a2.row(t).tail(lk - from);
    }
  }
  std::vector<float> factor(kq.scales.size());
  std::vector<float> delta_s(f.qk.smooth_q ? static_cast<std::size_t>(lk) : 0);
  Eigen::Index delta_block = -1;
  const bool sequential = f.softmax.scale_at == ScaleAt::q;
  const bool raw = f.softmax.scale_at == ScaleAt::exp;  // S = fl32(A), its scale in the exponent
  const double log2e = f.softmax.base == SoftmaxBase::two ? std::numbers::log2e : 1.0;
  for (Eigen::Index t = 0; t < n; ++t) {
    const Eigen::Index i = c0 + t;
    const double sqi = qq.scales[static_cast<std::size_t>(qq.group[static_cast<std::size_t>(i)])];
    if (raw) {
      for (Eigen::Index j = 0; j < lk; ++j) s(t, j) = static_cast<float>(a(t, j));
      continue;
    }
    if (!sequential)
      for (std::size_t g = 0; g < kq.scales.size(); ++g)
        factor[g] = static_cast<float>(log2e == 1.0 ? sqi * kq.scales[g] * scale : sqi * kq.scales[g] * scale * log2e);
    if (f.qk.smooth_q && i / f.qk.groups.block_q != delta_block) {  // Delta S of the block, fp32
      delta_block = i / f.qk.groups.block_q;
      const auto mean = q_block_mean.row(delta_block);
      for (Eigen::Index j = 0; j < lk; ++j) {
        delta_s[static_cast<std::size_t>(j)] = static_cast<float>(delta_s_dot(mean, j) * scale * log2e);
      }
    }
    const float sqf = static_cast<float>(sqi);
    for (Eigen::Index j = 0; j < lk; ++j) {
      const std::size_t g = static_cast<std::size_t>(kq.group[static_cast<std::size_t>(j)]);
      float x = sequential ? static_cast<float>(a(t, j)) * sqf * static_cast<float>(kq.scales[g])
                           : static_cast<float>(a(t, j)) * factor[g];
      if (f.qk.smooth_q) x += delta_s[static_cast<std::size_t>(j)];
      s(t, j) = x;
    }
  }
}

AttentionResult FlashCall::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  const FlashKernel::Softmax& sm = f.softmax;
  const bool unmasked = mask.empty();
  // A P~ tile (p.max) spans block_q query rows: the rows computed are [first, last), whole tiles around the asked ones
  const bool tiled = f.p.max > 0;
  const Eigen::Index tile_rows = tiled ? f.qk.groups.block_q : 1;
  const Eigen::Index first = r0 / tile_rows * tile_rows;
  const Eigen::Index last = std::min(lq, (r0 + rows + tile_rows - 1) / tile_rows * tile_rows);
  const RowMatrixXb visible = unmasked ? RowMatrixXb() : mask.rows(first, last - first, lq).visible(last - first, lk);
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  const Eigen::Index bk = key_block;  // pad zeros: the keys of the last block past L_k exist, logit 0 and V = 0
  const Eigen::Index blocks = static_cast<Eigen::Index>(block_begin.size()) - 1;
  const bool in_exp = sm.scale_at == ScaleAt::exp;
  const bool scaled_max = sm.max_rule == MaxRule::scaled;  // the max of fma(S, s2, -offset) (validate: in_exp)
  const bool grouped = s2_table.size() > 0;                  // s2 per (Q block, K block)
  std::vector<float> s2_keys(grouped ? static_cast<std::size_t>(lk_padded) : 0);
  const float offset = static_cast<float>(f.p.offset), p_scale = static_cast<float>(f.p.scale);
  const float threshold = static_cast<float>(sm.rescale_threshold);
  const Eigen::Index emu_freq = sm.ex2_emu_freq;
  const int threads = sm.row_sum_threads;
  const Eigen::Index promote_blocks = f.pv.promote_keys / bk;  // 0: one accumulator
  const PvUnit unit = f.pv.unit;
  const bool ada = unit == PvUnit::ada_mma_e4m3 || unit == PvUnit::ada_mma_e4m3_acc16;
  const bool codes_by_row = unit == PvUnit::h100_wgmma_e4m3 || unit == PvUnit::b200_tcgen05_e4m3 || ada;
  const bool sas_exp = sm.exp == ExpImpl::sas;  // SAS(0) != 1: every rescale is computed
  const bool from_rescales = f.output.p_from == PFrom::rescales;
  const bool running = sm.row_sum_update == RowSumUpdate::running;
  const bool sum_unrounded = sm.row_sum_of == RowSumOf::unrounded;
  // Rows go in chunks: each key block serves every row of the chunk before the next block, so the block's V stays
  // in cache. Each row's operations, and their order, are those of the row alone (a P~ tile's rows share a chunk),
  // so the chunk's size changes no bit: 64 rows up to 8192 keys, 32 beyond (the chunk's logits and P are
  // 2 x rows x L_k floats), or whole tiles.
  const Eigen::Index kChunkRows = tiled ? tile_rows * std::max<Eigen::Index>(1, 64 / tile_rows)
                                  : lk_padded <= 8192 ? 64
                                                      : 32;
  RowMatrixXf s(kChunkRows, lk_padded), p8(kChunkRows, lk_padded), out(kChunkRows, dv), buf(kChunkRows, dv),
      ref_block(kChunkRows, blocks);
  RowMatrixXf rescale_block(from_rescales ? kChunkRows : 0, from_rescales ? blocks : 0);
  RowMatrixXd tile_scale(tiled ? kChunkRows : 0, tiled ? blocks : 0);
  std::vector<float> m(kChunkRows), m_next(kChunkRows), rescale_of(kChunkRows);
  std::vector<std::array<float, 4>> l(kChunkRows), part_of(kChunkRows);
  std::vector<char> any(kChunkRows), active(kChunkRows);
  std::vector<Eigen::Index> split(static_cast<std::size_t>(kChunkRows), lk);
  std::vector<float> vb(codes_by_row ? static_cast<std::size_t>(bk * dv) : 0);
  std::vector<std::int64_t> acc64(unit == PvUnit::exact ? static_cast<std::size_t>(dv) : 0);
  // nvfp4 P: twice its E2M1 values and its block scales; the P V step's group sums and terms
  const bool p_nvfp4 = f.p.format == KernelFormat::nvfp4;
  RowMatrixXf p4(p_nvfp4 ? kChunkRows : 0, p_nvfp4 ? lk_padded : 0), p4s(p_nvfp4 ? kChunkRows : 0, p_nvfp4 ? blocks * bk / 16 : 0);
  std::vector<float> nvf4_sum(p_nvfp4 ? static_cast<std::size_t>(dv) : 0);
  std::vector<double> nvf4_term(p_nvfp4 ? static_cast<std::size_t>(4 * dv) : 0);
  std::vector<std::int32_t> nvf4_term_e(nvf4_term.size());
  std::vector<std::int8_t> vbe(vb.size());
  for (Eigen::Index c0 = first; c0 < last; c0 += kChunkRows) {
    const Eigen::Index n = std::min(kChunkRows, last - c0);
    if (buffered)  // a decode step reads the chunks settled by the time its last visible key arrived
      for (Eigen::Index t = 0; t < n; ++t) {
        Eigen::Index seen = lk;
        if (!unmasked)
          for (seen = lk; seen > 0 && !visible(c0 + t - first, seen - 1);) --seen;
        split[static_cast<std::size_t>(t)] =
            seen <= settled_from ? settled_from : settled_from + chunk * ((seen - settled_from) / chunk);
      }
    logits(c0, n, s, split);
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, row = i - first;
      float* sr = &s(t, 0);
      for (Eigen::Index j = 0; j < lk; ++j) {
        const float s2j = grouped ? s2_table(q_group_of[static_cast<std::size_t>(i)], k_group_of[static_cast<std::size_t>(j)]) : s2;
        if (!unmasked && !visible(row, j)) sr[j] = kNegInf;
        else if (!std::isfinite(in_exp ? sr[j] * s2j : sr[j])) throw_logit_overflow(f.name, "float32", i, j);
      }
      for (Eigen::Index j = lk; j < lk_padded; ++j) sr[j] = 0.0f;
    }
    std::fill(m.begin(), m.end(), kNegInf);
    for (auto& x : l) x.fill(0.0f);
    std::fill(any.begin(), any.end(), 0);
    if (from_rescales) rescale_block.setOnes();
    out.setZero();
    buf.setZero();
    // (4)-(5) the key blocks
    for (Eigen::Index bi = 0; bi < blocks; ++bi) {
      const Eigen::Index b = f.keys.order == KeyOrder::forward ? bi : blocks - 1 - bi;
      const Eigen::Index b0 = block_begin[static_cast<std::size_t>(b)], b1 = block_begin[static_cast<std::size_t>(b + 1)];
      const Eigen::Index real_end = std::min(lk, b1);  // padded keys have V = 0: their products vanish
      const bool promote = promote_blocks > 0 && ((bi + 1) % promote_blocks == 0 || bi + 1 == blocks);
      if (codes_by_row && real_end > b0)
        e4m3_decode(v_codes.data() + b0 * dv, static_cast<std::size_t>((real_end - b0) * dv), vb.data(), vbe.data());
      // (4) per row: the max, the rescale, P~ and (unrounded) the row sum
      for (Eigen::Index t = 0; t < n; ++t) {
        active[t] = 0;
        const float* sr = &s(t, 0);
        float* pr = &p8(t, 0);
        if (grouped)
          for (Eigen::Index j = b0; j < b1; ++j)
            s2_keys[static_cast<std::size_t>(j)] =
                s2_table(q_group_of[static_cast<std::size_t>(c0 + t)], k_group_of[static_cast<std::size_t>(std::min(j, lk - 1))]);
        const auto s2_of = [&](Eigen::Index j) { return grouped ? s2_keys[static_cast<std::size_t>(j)] : s2; };
        float m_new = m[t];
        if (scaled_max) {
          for (Eigen::Index j = b0; j < b1; ++j)
            if (sr[j] != kNegInf) m_new = std::max(m_new, std::fma(sr[j], s2_of(j), -offset));
        } else {
          for (Eigen::Index j = b0; j < b1; ++j) m_new = std::max(m_new, sr[j]);
        }
        if (m_new == kNegInf) {  // nothing visible yet
          ref_block(t, b) = kNegInf;
          continue;
        }
        // the max is kept while its growth, in exponent units, is within the threshold (FA4); else it moves
        const bool raw_exp = in_exp && !scaled_max;  // m in raw S units: differences and the reference times s2
        if (threshold > 0 && m[t] != kNegInf && (raw_exp ? (m_new - m[t]) * s2 : m_new - m[t]) <= threshold) m_new = m[t];
        float rescale = 0;
        if (m[t] != kNegInf)
          rescale = m_new == m[t] && !sas_exp ? 1.0f : ex(raw_exp ? (m[t] - m_new) * s2 : m[t] - m_new);
        const float ref = raw_exp ? (sm.ref_rule == RefRule::fma ? std::fma(m_new, s2, -offset) : m_new * s2 - offset)
                          : scaled_max ? m_new
                                       : (offset != 0 ? m_new - offset : m_new);
        ref_block(t, b) = ref;
        if (from_rescales) rescale_block(t, b) = rescale;
        any[t] = 1;
        active[t] = 1;
        m_next[t] = m_new;
        rescale_of[t] = rescale;
        std::array<float, 4>& part = part_of[t];
        part.fill(0.0f);
        if (running)
          for (int th = 0; th < threads; ++th) l[t][static_cast<std::size_t>(th)] *= rescale;
        for (Eigen::Index j = b0; j < b1; ++j) {
          float pt = 0;
          if (sr[j] != kNegInf) {
            pt = ex(in_exp ? std::fma(sr[j], s2_of(j), -ref) : sr[j] - ref);
            if (p_scale != 1) pt *= p_scale;
          }
          pr[j] = pt;
        }
        // FlashAttention-4's software exp2 on its pairs, in a block whose keys are all visible and all real
        if (emu_freq > 0 && b0 + bk <= lk) {
          bool whole = true;
          for (Eigen::Index j = b0; j < b1 && whole; ++j) whole = sr[j] != kNegInf;
          const Eigen::Index fragments = bk / 32;
          for (Eigen::Index fr = sm.ex2_emu_start; whole && fr < fragments - 1; ++fr)
            for (Eigen::Index k = 0; k < 32; k += 2)
              if (k % emu_freq >= emu_freq - 4)
                for (const Eigen::Index j : {b0 + fr * 32 + k, b0 + fr * 32 + k + 1}) {
                  float pt = fa4_ex2_emulation(std::fma(sr[j], s2_of(j), -ref));
                  if (p_scale != 1) pt *= p_scale;
                  pr[j] = pt;
                }
        }
        if (sum_unrounded) row_sum(sm, pr, b0, b1, running ? l[t] : part);
      }
      // P~'s tiles (p.max): the largest P~ of the tile's rows, s_P = max / p.max in float64
      if (tiled)
        for (Eigen::Index t0 = 0; t0 < n; t0 += tile_rows) {
          float tile_max = 0;
          for (Eigen::Index t = t0; t < std::min(n, t0 + tile_rows); ++t)
            if (active[t])
              for (Eigen::Index j = b0; j < b1; ++j) tile_max = std::max(tile_max, p8(t, j));
          for (Eigen::Index t = t0; t < std::min(n, t0 + tile_rows); ++t)
            tile_scale(t, b) = static_cast<double>(tile_max) / f.p.max;
        }
      // (5) per row: P, the row sum (rounded), P V
      for (Eigen::Index t = 0; t < n; ++t) {
        if (!active[t]) continue;
        const float* sr = &s(t, 0);
        float* pr = &p8(t, 0);
        const float rescale = rescale_of[t];
        std::array<float, 4>& lt = l[t];
        const std::array<float, 4>& part = part_of[t];
        if (f.p.format == KernelFormat::e4m3)  // the hot case without the format switch, so that it vectorises
          for (Eigen::Index j = b0; j < b1; ++j) pr[j] = e4m3_round_saturate(pr[j]);
        else if (tiled) {  // codes nearest even in [0, p.max]; a tile of zeros stays zero
          const double sp = tile_scale(t, b);
          for (Eigen::Index j = b0; j < b1; ++j)
            pr[j] = sp > 0 ? static_cast<float>(std::clamp(std::nearbyint(pr[j] / sp), 0.0, double(f.p.max))) : 0.0f;
        } else if (f.p.format == KernelFormat::nvfp4)  // per 16 keys: P~ / scale to E2M1, the scale to E4M3
          for (Eigen::Index g0 = b0; g0 < b1; g0 += 16) {
            const Eigen::Index g1 = std::min(b1, g0 + 16);  // keys past L_k (masked padding) are absent
            float bmax = kNegInf;
            for (Eigen::Index j = g0; j < g1; ++j) bmax = std::max(bmax, sr[j]);
            const float sc = ex(std::fma(bmax, s2, -ref_block(t, b)) + kLog2SixthF32);
            const float scale = e4m3_round_saturate(sc);
            p4s(t, g0 / 16) = scale;
            nvf4_p_block(pr + g0, static_cast<std::size_t>(g1 - g0), sc, scale, &p4(t, g0));
          }
        else
          for (Eigen::Index j = b0; j < b1; ++j) pr[j] = round_p(pr[j], f.p.format);
        if (!sum_unrounded) row_sum(sm, pr, b0, b1, running ? lt : part_of[t]);
        if (!running)
          for (int th = 0; th < threads; ++th) lt[static_cast<std::size_t>(th)] = lt[static_cast<std::size_t>(th)] * rescale + part[static_cast<std::size_t>(th)];
        // P V: into the accumulator acc (one over the key loop when nothing promotes, else buf, added to out)
        float* o = &out(t, 0);
        float* acc = promote_blocks > 0 ? &buf(t, 0) : o;
        if (promote_blocks > 0 && !f.pv.promote_fma)
          for (Eigen::Index c = 0; c < dv; ++c) o[c] *= rescale;
        if (promote_blocks != 1) {
          if (unit == PvUnit::fp22)
            for (Eigen::Index c = 0; c < dv; ++c) acc[c] = fp22(static_cast<double>(acc[c]) * rescale);
          else
            for (Eigen::Index c = 0; c < dv; ++c) acc[c] *= rescale;
        } else {
          std::fill(acc, acc + dv, 0.0f);
        }
        switch (unit) {
          case PvUnit::exact: {  // the block's integer sum, exact, times s_P s_V in float64, rounded once
            std::fill(acc64.begin(), acc64.end(), 0);
            const Eigen::Index from = split[static_cast<std::size_t>(t)];
            for (Eigen::Index j = b0; j < real_end; ++j) {
              const auto code = static_cast<std::int64_t>(pr[j]);
              if (code == 0) continue;
              const std::int8_t* vr = buffered && j >= from ? &v_int_buffer(j, 0) : &v_int(j, 0);
              for (Eigen::Index c = 0; c < dv; ++c) acc64[static_cast<std::size_t>(c)] += code * vr[c];
            }
            const double pv_scale = tile_scale(t, b) * v_block_scale[static_cast<std::size_t>(b)];
            for (Eigen::Index c = 0; c < dv; ++c)
              acc[c] = static_cast<float>(static_cast<double>(acc64[static_cast<std::size_t>(c)]) * pv_scale);
            break;
          }
          case PvUnit::h100_hmma_f16_acc16:
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 16)
              hmma_f16_acc16_step(acc, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(16, real_end - s0)),
                                  v_values.data() + s0 * dv, v_exponents.data() + s0 * dv, static_cast<std::size_t>(dv),
                                  static_cast<std::size_t>(dv));
            break;
          case PvUnit::h100_wgmma_e4m3:
          case PvUnit::b200_tcgen05_e4m3:
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 32)
              (unit == PvUnit::b200_tcgen05_e4m3 ? tcgen05_e4m3_step : wgmma_e4m3_step)(acc, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(32, real_end - s0)),
                              vb.data() + (s0 - b0) * dv, vbe.data() + (s0 - b0) * dv, static_cast<std::size_t>(dv),
                              static_cast<std::size_t>(dv));
            break;
          case PvUnit::ada_mma_e4m3:  // each 32 keys one instruction: two steps of 16, the second even when empty
          case PvUnit::ada_mma_e4m3_acc16:
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 16) {
              const Eigen::Index cnt = std::clamp<Eigen::Index>(real_end - s0, 0, 16);
              ada_e4m3_step(acc, pr + s0, static_cast<std::size_t>(cnt), vb.data() + (s0 - b0) * dv,
                            vbe.data() + (s0 - b0) * dv, static_cast<std::size_t>(dv), static_cast<std::size_t>(dv),
                            unit == PvUnit::ada_mma_e4m3_acc16);
              if ((s0 - b0) % 32 == 0 && s0 + 16 >= real_end)  // the instruction's second step, of padding alone
                ada_e4m3_step(acc, pr, 0, vb.data(), vbe.data(), static_cast<std::size_t>(dv),
                              static_cast<std::size_t>(dv), unit == PvUnit::ada_mma_e4m3_acc16);
            }
            break;
          case PvUnit::h100_mma_e4m3: {  // each 32 keys one instruction (mma_dot), a short last chunk padded with 0
            const MmaModel& model = *pv_column_model(unit);
            std::array<std::uint16_t, 32> pc{}, vc{};
            for (Eigen::Index c = 0; c < dv; ++c) {
              float x = acc[c];
              for (Eigen::Index s0 = b0; s0 < real_end; s0 += 32) {
                const Eigen::Index cnt = std::min<Eigen::Index>(32, real_end - s0);
                pc.fill(0), vc.fill(0);
                for (Eigen::Index j = 0; j < cnt; ++j)
                  pc[static_cast<std::size_t>(j)] = static_cast<std::uint16_t>(lowp_encode(pr[s0 + j], fp8_e4m3fn())),
                  vc[static_cast<std::size_t>(j)] = v_codes_t(c, s0 + j);
                x = mma_dot(model, pc, vc, x);
              }
              acc[c] = x;
            }
            break;
          }
          case PvUnit::b200_nvf4:  // steps of 64 keys, groups of 16 aligned with V's blocks; keys past L_k absent
            for (Eigen::Index s0 = b0; s0 < real_end; s0 += 64) {
              const Eigen::Index ng = std::min<Eigen::Index>(4, (real_end - s0 + 15) / 16);
              for (Eigen::Index g = 0; g < ng; ++g) {
                const Eigen::Index g0 = s0 + 16 * g, g1 = std::min(real_end, g0 + 16);
                nvf4_group_sums(&p4(t, g0), static_cast<std::size_t>(g1 - g0), &v4(g0, 0), static_cast<std::size_t>(dv),
                                static_cast<std::size_t>(dv), nvf4_sum.data());
                const float ps = p4s(t, g0 / 16);
                nvf4_terms(nvf4_sum.data(), ps, ps == 0 ? -100000 : scale_exponent(ps), &v4_scale(g0 / 16, 0),
                           &v4_exp(g0 / 16, 0), nvf4_term.data() + g * dv, nvf4_term_e.data() + g * dv,
                           static_cast<std::size_t>(dv));
              }
              scaled_group_step(acc, nvf4_term.data(), nvf4_term_e.data(), static_cast<std::size_t>(ng),
                                static_cast<std::size_t>(dv), static_cast<std::size_t>(dv));
            }
            break;
          case PvUnit::fp22:
            for (Eigen::Index c = 0; c < dv; ++c) {
              float x = acc[c];
              for (Eigen::Index j = b0; j < real_end; ++j)
                x = fp22(static_cast<double>(x) + static_cast<double>(pr[j]) * v_values[static_cast<std::size_t>(j * dv + c)]);
              acc[c] = x;
            }
            break;
          case PvUnit::fp32:
            for (Eigen::Index c = 0; c < dv; ++c) {
              float x = acc[c];
              for (Eigen::Index j = b0; j < real_end; ++j) x += pr[j] * v_values[static_cast<std::size_t>(j * dv + c)];
              acc[c] = x;
            }
            break;
        }
        if (promote) {
          if (f.pv.promote_fma)
            for (Eigen::Index c = 0; c < dv; ++c) o[c] = std::fma(o[c], rescale, acc[c]);
          else
            for (Eigen::Index c = 0; c < dv; ++c) o[c] += acc[c];
          if (promote_blocks != 1) std::fill(acc, acc + dv, 0.0f);
        }
        m[t] = m_next[t];
      }
    }
    // (6) finalize
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t, row = i - r0;
      if (!any[t] || i < r0 || i >= r0 + rows) continue;  // no visible key: O = 0, P = 0; a tile's other rows
      const std::array<float, 4>& lt = l[t];
      const float sum = threads == 1 ? lt[0]
                        : sm.row_sum_combine == RowSumCombine::pairs_02_13 ? (lt[0] + lt[2]) + (lt[1] + lt[3])
                                                                          : (lt[0] + lt[1]) + (lt[2] + lt[3]);
      const float* o = &out(t, 0);
      switch (f.output.finalize) {
        case Finalize::divide:
          for (Eigen::Index c = 0; c < dv; ++c) {
            const float x = o[c] / sum;
            if (!std::isfinite(x))
              throw InputError("V", "values",
                               "row " + std::to_string(i) + ": P V overflows " + f.name + "'s FP16 accumulator (a block's "
                               "sum beyond 65504); the kernel would return inf there (docs/kernels-as-data.md)");
            r.o(row, c) = x;
          }
          break;
        case Finalize::f64:
          for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = static_cast<float>(o[c] * v_scale(c) / sum + v_mean(c));
          break;
        case Finalize::reciprocal: {
          const float os = (1.0f / sum) * v_descale;
          for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = o[c] * os;
          break;
        }
        case Finalize::reciprocal_channel: {  // fl32(fl32(O fl32(1 / l)) scale_c) (+ mean_c), float32
          const float inv = 1.0f / sum;
          for (Eigen::Index c = 0; c < dv; ++c) {
            float x = (o[c] * inv) * static_cast<float>(v_scale(c));
            if (f.v.smooth) x += static_cast<float>(v_mean(c));
            r.o(row, c) = x;
          }
          break;
        }
      }
      if (f.output.format == KernelFormat::fp16)
        for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = round_to_binary16(r.o(row, c));
      else if (f.output.format == KernelFormat::bf16)
        for (Eigen::Index c = 0; c < dv; ++c) r.o(row, c) = round_to_bfloat16(r.o(row, c));
      // P as probabilities: P8 base^(ref_block - ref_final) / l, the factor once per key block
      // the reference of the last block processed is the row's final one (the max only grows; a row's first
      // visible block is processed before its last)
      if (from_rescales) {  // p.from rescales: P8 s_P times the rescales applied after the block, over l
        double later = 1.0;
        for (Eigen::Index bi = blocks; bi-- > 0;) {
          const Eigen::Index b = f.keys.order == KeyOrder::forward ? bi : blocks - 1 - bi;
          const double weight = tiled ? tile_scale(t, b) : 1.0;
          if (ref_block(t, b) != kNegInf)
            for (Eigen::Index j = block_begin[static_cast<std::size_t>(b)]; j < std::min(lk, block_begin[static_cast<std::size_t>(b + 1)]); ++j)
              if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(row, j) = (p8(t, j) * weight) * (later / sum);
          later *= rescale_block(t, b);
        }
        continue;
      }
      const double last = ref_block(t, f.keys.order == KeyOrder::forward ? blocks - 1 : 0);
      for (Eigen::Index b = 0; b < blocks; ++b) {
        if (ref_block(t, b) == kNegInf) continue;
        const double x = static_cast<double>(ref_block(t, b)) - last;
        const double e = sm.base == SoftmaxBase::two ? std::exp2(x) : std::exp(x);
        for (Eigen::Index j = block_begin[static_cast<std::size_t>(b)]; j < std::min(lk, block_begin[static_cast<std::size_t>(b + 1)]); ++j)
          if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(row, j) = p8(t, j) * e / sum;
      }
    }
  }
  return r;
}


}  // namespace

std::optional<KernelProblem> check_kernel(const FlashKernel& k) {
  const bool qk_int = is_int(k.qk.format);
  const bool qk_mx = k.qk.format == KernelFormat::mxfp4;
  const bool qk_fp4 = k.qk.format == KernelFormat::nvfp4 || qk_mx;
  if (!qk_int && !qk_fp4 && k.qk.format != KernelFormat::e4m3)
    return KernelProblem{"qk.format", "must be int8, int4, e4m3, nvfp4 or mxfp4"};
  if (k.qk.groups.block_q < 1 || k.qk.groups.block_k < 1 || k.qk.groups.warp_q < 1 || k.qk.groups.warp_k < 1)
    return KernelProblem{"qk.groups", "every group size must be >= 1"};
  if (!(k.qk.alpha >= 0 && k.qk.alpha <= 1)) return KernelProblem{"qk.alpha", "must be in [0, 1]"};
  const bool fp8_unit = k.qk.unit == SUnit::h100_wgmma_e4m3 || k.qk.unit == SUnit::b200_tcgen05_e4m3;
  if (qk_int   ? k.qk.unit != SUnit::exact
      : qk_fp4 ? k.qk.unit != (qk_mx ? SUnit::b200_mxf4 : SUnit::b200_nvf4)
               : !fp8_unit)
    return KernelProblem{"qk.unit", qk_int   ? "integer Q/K: exact"
                                    : qk_mx  ? "mxfp4 Q/K: b200-mxf4"
                                    : qk_fp4 ? "nvfp4 Q/K: b200-nvf4"
                                             : "e4m3 Q/K: h100-wgmma-e4m3 or b200-tcgen05-e4m3"};
  if (qk_fp4) {
    if (k.softmax.scale_at != ScaleAt::exp || k.softmax.max_rule != MaxRule::raw)
      return KernelProblem{"softmax.scale_at", "nvfp4 Q/K (the block scales inside S): exp, with max_rule raw"};
    if (k.qk.arith != ScaleArith::f32) return KernelProblem{"qk.arith", "nvfp4 Q/K are scaled in float32: f32"};
  }
  if (k.qk.format == KernelFormat::e4m3) {
    if (k.qk.granularity != SageGranularity::tensor && k.qk.granularity != SageGranularity::block)
      return KernelProblem{"qk.granularity", "e4m3 Q/K: tensor, or block (a descale per block_q queries / block_k keys)"};
    if (k.qk.granularity == SageGranularity::block && k.softmax.max_rule != MaxRule::scaled)
      return KernelProblem{"softmax.max_rule", "e4m3 Q/K per block have an s2 per block pair: the max is taken of fma(S, s2, "
                                               "-offset), scaled"};
    if (k.qk.scale == ScaleRule::amax_eps) return KernelProblem{"qk.scale", "e4m3 Q/K: amax (descale amax / 448) or one"};
    if (k.qk.arith != ScaleArith::f32) return KernelProblem{"qk.arith", "e4m3 Q/K are scaled in float32: f32"};
    if (k.softmax.scale_at != ScaleAt::exp) return KernelProblem{"softmax.scale_at", "e4m3 Q/K (S on the FP8 wgmma): exp"};
    if (k.qk.smooth_k || k.qk.smooth_q)
      return KernelProblem{"qk.smooth_k", "e4m3 Q/K take no smoothing (smooth_k and smooth_q false)"};
  } else if (qk_int) {
    if (k.softmax.scale_at == ScaleAt::exp && k.softmax.max_rule != MaxRule::scaled)
      return KernelProblem{"softmax.max_rule", "integer Q/K with softmax.scale_at exp have an s2 per group pair: scaled"};
    if (k.softmax.scale_at == ScaleAt::exp && k.qk.smooth_q)
      return KernelProblem{"qk.smooth_q", "Delta S is added to dequantised S: softmax.scale_at dequant"};
    if (k.qk.scale == ScaleRule::one) return KernelProblem{"qk.scale", "integer Q/K: amax or amax+1e-7"};
    if (k.qk.max > 0 &&
        (k.qk.format != KernelFormat::int8 || k.qk.granularity != SageGranularity::block ||
         k.qk.scale != ScaleRule::amax || k.qk.arith != ScaleArith::f64 || k.qk.rounding != QuantRounding::half_even))
      return KernelProblem{"qk.max", "FlashQ's range R takes int8 Q/K per block: qk.granularity block, qk.scale amax, "
                                     "qk.arith f64, qk.rounding half-even"};
    if (k.qk.max < 0 || k.qk.max > 127) return KernelProblem{"qk.max", "0 (the format's largest) or 1 to 127"};
    if (k.qk.max == 0 && k.qk.arith == ScaleArith::f64 && k.qk.scale != ScaleRule::amax_eps)
      return KernelProblem{"qk.scale", "arith f64 (SageAttention2's quantiser) takes amax+1e-7"};
    if (k.softmax.scale_at == ScaleAt::q && k.qk.arith != ScaleArith::f32)
      return KernelProblem{"qk.arith", "softmax.scale_at q folds the scale into Q in float32: f32"};
  }
  if (k.softmax.max_rule == MaxRule::scaled && k.softmax.scale_at != ScaleAt::exp)
    return KernelProblem{"softmax.max_rule", "scaled takes the max of fma(S, s2, -offset): softmax.scale_at exp"};
  if ((k.softmax.scale_at == ScaleAt::q || k.softmax.scale_at == ScaleAt::exp) && k.softmax.base != SoftmaxBase::two)
    return KernelProblem{"softmax.base", "scale_at q and exp fold log2 e into the scale: 2"};
  if (k.softmax.exp == ExpImpl::sas) {
    if (k.softmax.base != SoftmaxBase::e || k.softmax.scale_at != ScaleAt::dequant || k.p.offset != 0 ||
        k.softmax.rescale_threshold != 0)
      return KernelProblem{"softmax.exp", "sas takes distances from the max in natural units: softmax.base e, "
                                          "softmax.scale_at dequant, p.offset 0, softmax.rescale_threshold 0"};
    if (!(k.softmax.sas_nr >= -64 && k.softmax.sas_nr <= -1e-3))
      return KernelProblem{"softmax.sas_nr", "the sparsity threshold n_r in [-64, -0.001]"};
  }
  if (k.qk.format != KernelFormat::int8 && k.qk.max != 0) return KernelProblem{"qk.max", "0 (FlashQ's R is for int8 Q/K)"};
  if (!(k.softmax.rescale_threshold >= 0) || !std::isfinite(k.softmax.rescale_threshold))
    return KernelProblem{"softmax.rescale_threshold", "must be finite and >= 0"};
  if (k.softmax.row_sum_threads != 1 && k.softmax.row_sum_threads != 4) return KernelProblem{"softmax.row_sum_threads", "1 or 4"};
  if (k.softmax.row_sum_tile == RowSumTile::lanes8 &&
      (k.softmax.row_sum_threads != 1 || k.softmax.row_sum_update != RowSumUpdate::running))
    return KernelProblem{"softmax.row_sum_tile", "lanes8 is one thread's running sum: row_sum_threads 1, row_sum_update "
                                                 "running"};
  if (k.softmax.ex2_emu_freq < 0 || k.softmax.ex2_emu_freq > 32 || k.softmax.ex2_emu_start < 0)
    return KernelProblem{"softmax.ex2_emu_freq", "0 (none) to 32, with ex2_emu_start >= 0"};
  if (k.softmax.ex2_emu_freq > 0) {
    if (k.softmax.base != SoftmaxBase::two || k.softmax.scale_at != ScaleAt::exp)
      return KernelProblem{"softmax.ex2_emu_freq", "the software exp2 takes softmax.base 2 and softmax.scale_at exp"};
    if (k.keys.block <= 0 || k.keys.block % 32 != 0)
      return KernelProblem{"softmax.ex2_emu_freq", "the software exp2 works in fragments of 32 keys: keys.block a "
                                                   "multiple of 32"};
    if (!(k.p.offset + k.softmax.rescale_threshold < 127))
      return KernelProblem{"softmax.ex2_emu_freq", "the software exp2 takes x <= 127: p.offset + rescale_threshold "
                                                   "below 127"};
  }
  if (k.softmax.row_sum_tile == RowSumTile::octets32 && k.softmax.row_sum_threads != 4)
    return KernelProblem{"softmax.row_sum_tile", "octets32 spreads a row over a quad of threads: row_sum_threads 4"};
  if (k.softmax.ref_rule == RefRule::fma &&
      (k.softmax.scale_at != ScaleAt::exp || k.softmax.max_rule != MaxRule::raw))
    return KernelProblem{"softmax.ref_rule", "fma forms the reference from a raw max: softmax.scale_at exp, max_rule raw"};
  if (k.softmax.row_sum_tile == RowSumTile::mma16 && k.softmax.row_sum_threads != 4)
    return KernelProblem{"softmax.row_sum_tile", "mma16 spreads a row over the quad of threads: row_sum_threads 4"};
  if (!std::isfinite(k.p.offset)) return KernelProblem{"p.offset", "must be finite"};
  if (!(k.p.scale > 0) || !std::isfinite(k.p.scale)) return KernelProblem{"p.scale", "must be finite and > 0"};
  if ((k.pv.unit == PvUnit::exact) != (k.p.max > 0))
    return KernelProblem{"p.max", "pv.unit exact takes P~ tiles scaled to [0, p.max] (p.max > 0), and p.max > 0 takes "
                                  "pv.unit exact"};
  if (k.pv.unit == PvUnit::exact) {
    if (k.p.format != KernelFormat::int8 || k.p.max > 127)
      return KernelProblem{"p.max", "1 to 127, with p.format int8 (P~ codes nearest even in [0, p.max])"};
    if (k.v.scale != VScale::block || k.qk.max == 0)
      return KernelProblem{"pv.unit", "exact takes FlashQ codes: v.scale block and qk.max > 0"};
    if (k.keys.block <= 0 || k.pv.promote_keys != k.keys.block || k.pv.promote_fma)
      return KernelProblem{"pv.promote_keys", "pv.unit exact adds each key block's sum to the rescaled O: "
                                              "pv.promote_keys = keys.block, pv.promote_fma false"};
    if (k.p.scale != 1) return KernelProblem{"p.scale", "pv.unit exact: 1 (the tile scale sets P's range)"};
  }
  if (k.p.format == KernelFormat::int4 || k.p.format == KernelFormat::mxfp4)
    return KernelProblem{"p.format", "e4m3, e5m2, int8, fp16, bf16, fp32 or nvfp4"};
  const KernelFormat vf = k.v.format;
  if (vf != KernelFormat::e4m3 && vf != KernelFormat::e5m2 && vf != KernelFormat::int8 && vf != KernelFormat::fp16 &&
      vf != KernelFormat::nvfp4)
    return KernelProblem{"v.format", "e4m3, e5m2, int8, fp16 or nvfp4"};
  if ((vf == KernelFormat::nvfp4) != (k.v.scale == VScale::block16))
    return KernelProblem{"v.scale", "nvfp4 V takes block16 scales, and block16 nvfp4 V"};
  if ((k.p.format == KernelFormat::nvfp4 || vf == KernelFormat::nvfp4) && k.pv.unit != PvUnit::b200_nvf4)
    return KernelProblem{"pv.unit", "nvfp4 P or V: b200-nvf4 (with both nvfp4)"};
  if (k.p.format == KernelFormat::nvfp4) {
    if (k.softmax.scale_at != ScaleAt::exp || k.softmax.max_rule != MaxRule::raw)
      return KernelProblem{"p.format", "nvfp4 P's block scales exp_b(fma(blockmax S, s2, -ref) + log2(1/6)) take "
                                       "softmax.scale_at exp and max_rule raw"};
    if (k.p.scale != 1) return KernelProblem{"p.scale", "nvfp4 P: 1 (its per-row factor is p.offset)"};
    if (k.keys.block <= 0 || k.keys.block % 64 != 0)
      return KernelProblem{"keys.block", "nvfp4 P: a multiple of 64 (the FP4 step's k), so that P's blocks of 16 "
                                         "line up with V's"};
  }
  if (k.pv.promote_fma && (k.keys.block <= 0 || k.pv.promote_keys != k.keys.block))
    return KernelProblem{"pv.promote_fma", "O = fma(O, r, acc) at each block: pv.promote_keys = keys.block"};
  switch (k.v.scale) {
    case VScale::block:
      if (vf != KernelFormat::int8 || k.pv.unit != PvUnit::exact)
        return KernelProblem{"v.scale", "block (FlashQ) takes v.format int8 and pv.unit exact"};
      if (k.output.finalize != Finalize::divide) return KernelProblem{"output.finalize", "v.scale block: divide"};
      if (k.v.arith != ScaleArith::f64 || k.v.smooth)
        return KernelProblem{"v.arith", "v.scale block scales in float64 without smoothing: f64, v.smooth false"};
      if (k.v.max != std::floor(k.v.max))
        return KernelProblem{"v.max", "v.scale block: an integer range (FlashQ's R: 119 or 126), or 0 for 127"};
      break;
    case VScale::block16:
      if (k.output.finalize != Finalize::reciprocal) return KernelProblem{"output.finalize", "v.scale block16: reciprocal"};
      break;
    case VScale::none:
      if (vf != KernelFormat::fp16) return KernelProblem{"v.scale", "none holds V as binary16: v.format fp16"};
      if (k.output.finalize != Finalize::divide) return KernelProblem{"output.finalize", "v.scale none: divide"};
      break;
    case VScale::tensor:
      if (vf != KernelFormat::e4m3) return KernelProblem{"v.scale", "tensor (a descale per tensor) takes v.format e4m3"};
      if (k.output.finalize != Finalize::reciprocal) return KernelProblem{"output.finalize", "v.scale tensor: reciprocal"};
      if (k.v.arith != ScaleArith::f32) return KernelProblem{"v.arith", "v.scale tensor scales in float32: f32"};
      if (k.v.rule == ScaleRule::amax_eps) return KernelProblem{"v.rule", "amax or one"};
      break;
    case VScale::channel:
      if (k.output.finalize != Finalize::f64 && k.output.finalize != Finalize::reciprocal_channel)
        return KernelProblem{"output.finalize", "v.scale channel: f64 or reciprocal-channel"};
      if (k.v.arith == ScaleArith::f32 && vf != KernelFormat::e4m3 && vf != KernelFormat::e5m2)
        return KernelProblem{"v.arith", "f32 scales V to an FP8 format (v.format e4m3 or e5m2); f64 for the others"};
      if (k.v.arith == ScaleArith::f32 && k.v.smooth) return KernelProblem{"v.smooth", "v.arith f32 takes no smoothing"};
      break;
  }
  if (k.v.smooth && k.v.scale != VScale::channel) return KernelProblem{"v.smooth", "needs v.scale channel"};
  if (!(k.v.max >= 0) || !std::isfinite(k.v.max))
    return KernelProblem{"v.max", "0 (the format's largest) or a positive value"};
  if (k.v.max > 0) {
    if ((k.v.scale != VScale::channel && k.v.scale != VScale::block) || vf == KernelFormat::fp16)
      return KernelProblem{"v.max", "applies to v.scale channel with an FP8 or int8 v.format, and to block; 0 otherwise"};
    if (k.v.max > format_max(vf)) return KernelProblem{"v.max", "at most v.format's largest, " + shown(format_max(vf))};
    // at least the format's smallest normal (int8: 1), so that amax / v.max and v.max / amax stay finite and nonzero
    const double least = vf == KernelFormat::e4m3 ? 0x1p-6 : vf == KernelFormat::e5m2 ? 0x1p-14 : 1.0;
    if (k.v.max < least) return KernelProblem{"v.max", "0, or at least v.format's smallest normal, " + shown(least)};
  }
  switch (k.pv.unit) {
    case PvUnit::h100_hmma_f16_acc16:
      if (k.p.format != KernelFormat::fp16 || vf != KernelFormat::fp16)
        return KernelProblem{"pv.unit", "h100-hmma-f16-acc16 takes binary16 P and V (p.format and v.format fp16)"};
      break;
    case PvUnit::h100_wgmma_e4m3:
    case PvUnit::h100_mma_e4m3:
    case PvUnit::ada_mma_e4m3:
    case PvUnit::ada_mma_e4m3_acc16:
    case PvUnit::b200_tcgen05_e4m3:
      if (k.p.format != KernelFormat::e4m3 || vf != KernelFormat::e4m3)
        return KernelProblem{"pv.unit", "an FP8 E4M3 instruction takes E4M3 P and V (p.format and v.format e4m3)"};
      break;
    case PvUnit::b200_nvf4:
      if (k.p.format != KernelFormat::nvfp4 || vf != KernelFormat::nvfp4)
        return KernelProblem{"pv.unit", "b200-nvf4 takes NVFP4 P and V (p.format and v.format nvfp4)"};
      break;
    default: break;
  }
  if (k.pv.promote_keys < 0) return KernelProblem{"pv.promote_keys", "0 (one accumulator) or a multiple of keys.block"};
  if (k.keys.block < 0) return KernelProblem{"keys.block", "a key count >= 1, or 0 for FlashAttention-3's FP8 tile"};
  const KernelFormat of = k.output.format;
  if (of != KernelFormat::fp32 && of != KernelFormat::fp16 && of != KernelFormat::bf16)
    return KernelProblem{"output.format", "fp32, fp16 or bf16"};
  return std::nullopt;
}

void validate(const FlashKernel& k) {
  if (const std::optional<KernelProblem> p = check_kernel(k))
    throw SpecError("kernel '" + k.name + "': " + p->field + ": " + p->why);
}

void transform_qk(RowMatrixXd& q, RowMatrixXd& k, QkTransform t, double alpha, std::uint64_t seed,
                  const std::string& name) {
  const Eigen::Index d = q.cols();
  switch (t) {
    case QkTransform::none: return;
    case QkTransform::hadamard: {
      if (d == 0 || (d & (d - 1)) != 0)
        throw InputError("Q", "shape", "head dimension " + std::to_string(d) + " is not a power of 2, which " + name +
                                           "'s qk-transform=hadamard needs");
      std::mt19937_64 gen(seed);
      std::vector<double> sign(static_cast<std::size_t>(d));
      for (double& s : sign) s = (gen() >> 63) != 0 ? -1.0 : 1.0;
      const double norm = 1.0 / std::sqrt(static_cast<double>(d));
      for (RowMatrixXd* m : {&q, &k})
        for (Eigen::Index i = 0; i < m->rows(); ++i) {
          double* x = m->row(i).data();
          for (Eigen::Index c = 0; c < d; ++c) x[c] *= sign[static_cast<std::size_t>(c)];
          for (Eigen::Index span = 1; span < d; span *= 2)  // butterflies, spans 1, 2, 4, ...
            for (Eigen::Index b = 0; b < d; b += 2 * span)
              for (Eigen::Index c = b; c < b + span; ++c) {
                const double u = x[c], w = x[c + span];
                x[c] = u + w, x[c + span] = u - w;
              }
          for (Eigen::Index c = 0; c < d; ++c) x[c] *= norm;
        }
      return;
    }
    case QkTransform::smoothquant:
    case QkTransform::qserve: {
      for (Eigen::Index c = 0; c < d; ++c) {
        const double qmax = q.rows() ? q.col(c).cwiseAbs().maxCoeff() : 0.0;
        const double kmax = k.rows() ? k.col(c).cwiseAbs().maxCoeff() : 0.0;
        double s = 1;  // Q_c / s, K_c * s
        if (t == QkTransform::smoothquant && qmax > 0 && kmax > 0) s = std::pow(qmax, alpha) / std::pow(kmax, 1 - alpha);
        if (t == QkTransform::qserve && kmax > 0) s = 1 / std::pow(kmax, alpha);
        q.col(c) /= s;
        k.col(c) *= s;
      }
      if (!q.allFinite() || !k.allFinite())
        throw InputError("Q", "values", "a channel scale of " + name + "'s qk-transform overflows float64; rescale the inputs");
      return;
    }
  }
}

int fa3_fp8_key_block(Eigen::Index head_dim) {
  return head_dim <= 64 ? 160 : head_dim <= 96 ? 128 : head_dim <= 128 ? 224 : head_dim <= 192 ? 160 : 128;
}

int fa3_fp8_query_tile(Eigen::Index head_dim) { return head_dim <= 96 ? 192 : 128; }

std::unique_ptr<PreparedCall> prepare_flash(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const FlashKernel& kernel) {
  return prepare_flash(q, k, v, scale, mask, kernel, nullptr);
}

std::unique_ptr<PreparedCall> prepare_flash(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const FlashKernel& kernel,
                                            std::shared_ptr<const FlashKeyCodes> keys) {
  validate(kernel);
  require_attention_shapes(q, k, v);
  return std::make_unique<FlashCall>(q, k, v, scale, mask, kernel, std::move(keys));
}

AttentionResult flash_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const FlashKernel& kernel) {
  if (q.rows() == 0) {
    validate(kernel);
    require_attention_shapes(q, k, v);
    return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  }
  return prepare_flash(q, k, v, scale, mask, kernel)->rows(0, q.rows());
}

}  // namespace qattn::ref
