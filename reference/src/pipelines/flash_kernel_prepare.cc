// The flash loop's steps (1)-(2) (flash_kernel.h): Q, K and V as the loop reads them, once per call.
#include <algorithm>
#include <functional>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flash_call.h"
#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"

namespace qattn::ref::flash_detail {

// A value as an error message shows it: 9 significant digits, exponent where large or small.
std::string shown(double x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

std::string at(Eigen::Index i, Eigen::Index j) { return "[" + std::to_string(i) + ", " + std::to_string(j) + "]"; }

namespace {

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
    if (f.qk.transform != QkTransform::none || f.qk.smooth_k || f.qk.smooth_q || f.softmax.ex2_emu_freq > 0)
      throw SpecError(f.name + ": a ready-made key side takes K's codes as they are: no qk.transform, smoothing or "
                               "software exp2");
    const bool increasing = std::adjacent_find(kc->begin.begin(), kc->begin.end(), std::greater_equal<>()) == kc->begin.end();
    if (nb < 2 || kc->begin.front() != 0 || kc->begin.back() != lk || !increasing || kc->settled_from > lk ||
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

// V as the P V unit reads it (quantised once, with Q and K), by v.scale; then the unit's own layouts (HMMA's binary16
// exponents, the per-channel code columns of an mma_dot unit).
void FlashCall::prepare_v(const MatrixView& v) {
  const FlashKernel::V& p = f.v;
  v_scale = Eigen::RowVectorXd::Ones(dv);
  v_mean = Eigen::RowVectorXd::Zero(dv);
  if (p.scale == VScale::block16) return prepare_v_nvfp4(v);
  if (p.scale == VScale::block) return prepare_v_flashq(v);
  const std::size_t count = static_cast<std::size_t>(lk * dv);
  if (p.scale == VScale::tensor) {  // E4M3 per tensor (validate); decoded for the units that read values
    std::vector<float> descale;
    v_codes = e4m3_groups(v, p.rule, 0, "V", f.name, descale);
    v_descale = descale[0];
    if (f.pv.unit == PvUnit::fp32 || f.pv.unit == PvUnit::fp22) {
      v_values.resize(count);
      for (std::size_t i = 0; i < count; ++i) v_values[i] = static_cast<float>(lowp_decode(v_codes[i], fp8_e4m3fn()));
    }
  } else if (p.format == KernelFormat::fp16 && p.scale == VScale::none) {  // binary16 as is, refused beyond it
    v_values.resize(count);
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < dv; ++c) {
        const double x = round_to_binary16(v(j, c));
        if (!std::isfinite(x))
          throw InputError("V", at(j, c),
                           shown(v(j, c)) + " is beyond binary16 (65504), in which " + f.name + " holds V");
        v_values[static_cast<std::size_t>(j * dv + c)] = static_cast<float>(x);
      }
  } else if (p.arith == ScaleArith::f32) {
    prepare_v_channel_f32(v);
  } else {
    prepare_v_channel_f64(v);
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

// v.scale block16, NVFP4: per channel, blocks of 16 keys (the last one padded with zeros)
void FlashCall::prepare_v_nvfp4(const MatrixView& v) {
  const Eigen::Index blocks = (lk + 15) / 16;
  v4.resize(lk, dv);
  v4_scale.resize(blocks, dv);
  v4_exp.resize(blocks, dv);
  std::array<float, 16> x;
  for (Eigen::Index c = 0; c < dv; ++c)
    for (Eigen::Index b = 0; b < blocks; ++b) {
      const Eigen::Index n = std::min<Eigen::Index>(16, lk - b * 16);
      for (Eigen::Index i = 0; i < n; ++i)
        x[static_cast<std::size_t>(i)] = to_f32(v(b * 16 + i, c), "V", b * 16 + i, c, f.name, "quantises");
      v4_scale(b, c) =
          nvfp4_block(x.data(), static_cast<std::size_t>(n), 1, &v4(b * 16, c), static_cast<std::size_t>(dv));
      v4_exp(b, c) = scale_exponent(v4_scale(b, c));
    }
}

// v.scale block, FlashQ: int8 per key block over every channel, amax / v.max (or the key side's codes and scales)
void FlashCall::prepare_v_flashq(const MatrixView& v) {
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
  const int range = f.v.max > 0 ? static_cast<int>(f.v.max) : 127;
  for (Eigen::Index b0 = 0; b0 < lk; b0 += key_block) {
    const Eigen::Index n = std::min(key_block, lk - b0);
    FlashQBlock blk = flashq_quantize_block(v.middleRows(b0, n), range);
    v_int.middleRows(b0, n) = blk.values.cast<std::int8_t>();  // in [-range, range]
    v_block_scale.push_back(blk.scale);
  }
}

// v.scale channel, float32: v8 = E4M3(fl32(fl32(v) fl32(max / amax))) (or E5M2), the scale fl32(amax / max)
void FlashCall::prepare_v_channel_f32(const MatrixView& v) {
  const FlashKernel::V& p = f.v;
  const std::size_t count = static_cast<std::size_t>(lk * dv);
  RowMatrixXd v8(lk, dv);
  const float range = static_cast<float>(p.max > 0 ? p.max : format_max(p.format));
  const LowpFormat& format = p.format == KernelFormat::e5m2 ? fp8_e5m2() : fp8_e4m3fn();
  for (Eigen::Index c = 0; c < dv; ++c) {
    float amax = 0;
    for (Eigen::Index j = 0; j < lk; ++j)
      amax = std::max(amax, std::fabs(to_f32(v(j, c), "V", j, c, f.name, "scales")));
    v_scale(c) = amax > 0 ? amax / range : 1.0f;  // an all-zero channel: scale 1 (the kernels divide 0 by 0)
    const float recip = amax > 0 ? range / amax : 1.0f;
    for (Eigen::Index j = 0; j < lk; ++j)
      v8(j, c) = lowp_round(static_cast<float>(v(j, c)) * recip, format, LowpRounding::rne, LowpOverflow::saturate);
  }
  v_values.resize(count);
  if (p.format == KernelFormat::e4m3) v_codes.resize(count);
  for (Eigen::Index j = 0; j < lk; ++j)
    for (Eigen::Index c = 0; c < dv; ++c) {
      const auto at_jc = static_cast<std::size_t>(j * dv + c);
      if (p.format == KernelFormat::e4m3)
        v_codes[at_jc] = static_cast<std::uint8_t>(lowp_encode(v8(j, c), fp8_e4m3fn()));
      v_values[at_jc] = static_cast<float>(v8(j, c));
    }
}

// v.scale channel, float64: V (- its token mean, v.smooth) scaled per channel to the format's top (v.max), rounded;
// held as E4M3 codes for the units that read codes, else as values
void FlashCall::prepare_v_channel_f64(const MatrixView& v) {
  const FlashKernel::V& p = f.v;
  const std::size_t count = static_cast<std::size_t>(lk * dv);
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
        case KernelFormat::e4m3:
          v8(j, c) = lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate);
          break;
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
      for (Eigen::Index c = 0; c < dv; ++c)
        v_values[static_cast<std::size_t>(j * dv + c)] = static_cast<float>(v8(j, c));
  }
}

}  // namespace qattn::ref::flash_detail
