// A description's checks (flash_kernel.h: check_kernel, validate) and step (1)'s change of basis.
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flash_call.h"
#include "qattn/error.h"

namespace qattn::ref {

double flash_detail::format_max(KernelFormat f) {

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

using flash_detail::format_max;
using flash_detail::is_int;
using flash_detail::shown;

namespace {

// Q and K: the format, groups, S's unit, and each format's scale, smoothing and FlashQ range rules.
std::optional<KernelProblem> check_qk(const FlashKernel& k) {
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
  return std::nullopt;
}

// The exponent (where the scale enters, base, SAS), the rescale threshold, the row sum's threads and tiles, the
// software exp2 and the reference rule.
std::optional<KernelProblem> check_softmax(const FlashKernel& k) {
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
  // a Q/K check, in its place in the order (the first problem found is the one reported)
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
  return std::nullopt;
}

// P~ and P: the offset and scale, P~ tiles (p.max) with the exact P V unit, the formats P may take.
std::optional<KernelProblem> check_p(const FlashKernel& k) {
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
    if (k.softmax.row_sum_of != RowSumOf::unrounded)
      return KernelProblem{"softmax.row_sum_of", "P~ tiles (p.max): unrounded (the rounded values are codes in each "
                                                 "tile's own units)"};
  }
  if (k.p.format == KernelFormat::int4 || k.p.format == KernelFormat::mxfp4)
    return KernelProblem{"p.format", "e4m3, e5m2, int8, fp16, bf16, fp32 or nvfp4"};
  return std::nullopt;
}

// V's format, NVFP4 P and V (block16 scales, the b200-nvf4 unit, P's block scales), the fused promotion.
std::optional<KernelProblem> check_v_format_and_nvfp4(const FlashKernel& k) {
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
  return std::nullopt;
}

// V's scale rule with the formats, arithmetic and finalize it takes; v.smooth and v.max.
std::optional<KernelProblem> check_v_scale(const FlashKernel& k) {
  const KernelFormat vf = k.v.format;
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
  return std::nullopt;
}

// P V's unit against P's and V's formats, the promotion and key block sizes, O's format.
std::optional<KernelProblem> check_pv_and_output(const FlashKernel& k) {
  const KernelFormat vf = k.v.format;
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

}  // namespace

std::optional<KernelProblem> check_kernel(const FlashKernel& k) {
  // in this order: the first problem found is the one reported
  for (const auto check :
       {check_qk, check_softmax, check_p, check_v_format_and_nvfp4, check_v_scale, check_pv_and_output})
    if (std::optional<KernelProblem> p = check(k)) return p;
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

}  // namespace qattn::ref
