// The contract checker of a flash kernel description (docs/kernels-as-data.md "Contracts"). Each contract bounds
// what one stage can reach from the description alone, whatever the inputs, or states the input range it needs.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "qattn/reference/kernel_file.h"
#include "qattn/reference/lowp_float.h"

namespace qattn::ref {
namespace {

std::string num(double x) {
  char b[48];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

// The largest finite value of a P format, and its name.
double format_max(KernelFormat f) {
  switch (f) {
    case KernelFormat::e4m3: return 448;
    case KernelFormat::nvfp4: return 2688;  // E2M1's 6 under an E4M3 block scale of at most 448
    case KernelFormat::mxfp4: return 6 * 0x1p127;
    case KernelFormat::e5m2: return 57344;
    case KernelFormat::int8: return 127;
    case KernelFormat::int4: return 7;
    case KernelFormat::fp16: return 65504;
    case KernelFormat::bf16: return 3.3895313892515355e38;
    case KernelFormat::fp32: return std::numeric_limits<float>::max();
  }
  return 0;
}

// The largest value the format rounds to zero (round to nearest, ties to even): half its smallest positive value.
double flush_level(KernelFormat f) {
  switch (f) {
    case KernelFormat::e4m3: return std::ldexp(1.0, -10);   // smallest subnormal 2^-9
    case KernelFormat::nvfp4: return std::ldexp(1.0, -11);  // E2M1's 0.5 under the smallest block scale, 2^-9
    case KernelFormat::mxfp4: return std::ldexp(1.0, -129);  // 0.5 under 2^-127
    case KernelFormat::e5m2: return std::ldexp(1.0, -17);   // 2^-16
    case KernelFormat::int8:
    case KernelFormat::int4: return 0.5;                    // nearest integer
    case KernelFormat::fp16: return std::ldexp(1.0, -25);   // 2^-24
    case KernelFormat::bf16: return std::ldexp(1.0, -134);  // 2^-133
    case KernelFormat::fp32: return std::ldexp(1.0, -150);  // 2^-149
  }
  return 0;
}

std::string format_name(KernelFormat f) {
  switch (f) {
    case KernelFormat::e4m3: return "e4m3";
    case KernelFormat::nvfp4: return "nvfp4";
    case KernelFormat::mxfp4: return "mxfp4";
    case KernelFormat::e5m2: return "e5m2";
    case KernelFormat::int8: return "int8";
    case KernelFormat::int4: return "int4";
    case KernelFormat::fp16: return "fp16";
    case KernelFormat::bf16: return "bf16";
    case KernelFormat::fp32: return "fp32";
  }
  return "?";
}

}  // namespace

std::vector<std::string> kernel_unvalidated_parts(const FlashKernel& k) {
  std::vector<std::string> parts;
  const auto model_unit = [&](const char* stage, const char* preset) {
    parts.push_back(std::string(stage) + " on " + preset + ": MMA-Sim's model, not measured here");
  };
  switch (k.qk.unit) {
    case SUnit::b200_tcgen05_e4m3: model_unit("S", "b200-tcgen05-e4m3"); break;
    case SUnit::b200_nvf4: model_unit("S", "b200-nvf4"); break;
    case SUnit::b200_mxf4: model_unit("S", "b200-mxf4"); break;
    default: break;  // exact integer products; the H100's wgmma (measured)
  }
  if (k.softmax.exp == ExpImpl::sas)
    parts.push_back("exp: SAS as TurboAttention's paper states it (Eq. 13-15); no official code exists to check it");
  else if (k.softmax.exp == ExpImpl::f64_rounded)
    parts.push_back("exp: the GPU's ex2.approx, taken as exact then rounded once to float32");
  else
    parts.push_back("exp: the C library's expf/exp2f, not the GPU's ex2.approx");
  switch (k.pv.unit) {
    case PvUnit::fp22: parts.push_back("P V: the per-product FP22 bound, which matches no measured instruction"); break;
    case PvUnit::ada_mma_e4m3: model_unit("P V", "ada-mma-e4m3"); break;
    case PvUnit::ada_mma_e4m3_acc16:
      parts.push_back("P V on ada-mma-e4m3-acc16: MMA-Sim's model as its code states it, with no vectors");
      break;
    case PvUnit::b200_tcgen05_e4m3: model_unit("P V", "b200-tcgen05-e4m3"); break;
    case PvUnit::b200_nvf4: model_unit("P V", "b200-nvf4"); break;
    default: break;  // float32 adds; the H100's measured units
  }
  return parts;
}

namespace {

// The exponential's base as a contract states it: its name, b^x and log_b(x).
struct ExpBase {
  bool two;
  std::string name() const { return two ? "2" : "e"; }
  double pow(double x) const { return two ? std::exp2(x) : std::exp(x); }
  double log(double x) const { return two ? std::log2(x) : std::log(x); }
};

// (1) The largest P~: the max is kept while the growth is within the threshold, so an exponent reaches
// offset + threshold before the rescale moves it.
KernelContract largest_p_contract(const FlashKernel& k) {
  const ExpBase base{k.softmax.base == SoftmaxBase::two};
  const std::string b = base.name();
  const double theta = k.softmax.rescale_threshold;
  const double p_max = k.p.max > 0 ? k.p.max : format_max(k.p.format);
  KernelContract c;
  c.name = "largest P~ within p.format";
  const double top = k.p.scale * base.pow(k.p.offset + theta);
  c.bound = "p.scale " + b + "^(p.offset + softmax.rescale_threshold) = " + num(k.p.scale) + " " + b + "^(" +
            num(k.p.offset) + " + " + num(theta) + ") = " + num(top);
  c.limit = num(p_max) + " (" + (k.p.max > 0 ? std::string("p.max") : format_name(k.p.format) + " max") + ")";
  // An excess below 2^-16 of the format's top is float32 rounding of the offset (SageAttention3's log2 2688 held as
  // a float32 constant reaches 2688.0007): below the resolution of every P format here.
  c.violated = top > p_max * (1 + 0x1p-16);
  if (k.p.max > 0) {  // each tile is scaled by its own largest P~: no offset reaches past p.max
    c.bound = "each tile's largest P~ (" + num(top) + " at most) scaled to p.max";
    c.violated = false;
  }
  if (c.violated)
    c.fix = "p.offset + softmax.rescale_threshold <= log_" + b + "(" + num(p_max) + " / p.scale) = " +
            num(base.log(p_max / k.p.scale)) + ": the largest weights saturate while the row sum counts them in full";
  return c;
}

// (2) Diffuse mass: one key at the row max (P~ = p.scale b^offset) and keys - 1 keys at the format's flush level.
// Their weights round to zero in P, so the output loses their share of the row's mass; with the row sum taken
// before the rounding (row_sum_of unrounded) the sum still counts it, and O shrinks by that share.
KernelContract diffuse_mass_contract(const FlashKernel& k, const ContractOptions& o) {
  KernelContract c;
  const double top = k.p.scale * ExpBase{k.softmax.base == SoftmaxBase::two}.pow(k.p.offset);
  // A tile scaled to [0, p.max] by its largest P~ (at most top) flushes below half a step: reached in every key
  // block when another query row of the tile sits at the top there. SAS flushes below e^n_r of the max. The
  // higher of the levels holds.
  double tau = k.p.max > 0 ? top / (2 * k.p.max) : flush_level(k.p.format);
  std::string level = k.p.max > 0 ? "half a step of the tile's [0, p.max], the step set in every key block by another "
                                    "row of the tile at the top"
                                  : format_name(k.p.format);
  if (k.softmax.exp == ExpImpl::sas && top * std::exp(k.softmax.sas_nr) > tau) {
    tau = top * std::exp(k.softmax.sas_nr);
    level = "SAS's threshold e^n_r";
  }
  const double n = static_cast<double>(o.keys - 1);
  const double lost = n * tau / (top + n * tau);
  c.name = "diffuse mass kept (" + std::to_string(o.keys) + " keys)";
  c.bound = "one key at P~ = " + num(top) + ", " + std::to_string(o.keys - 1) + " at the flush level " + num(tau) +
            " (" + level + "): " + num(100 * lost) + "% of the row's mass lost";
  c.limit = num(100 * o.tolerance) + "%";
  c.violated = lost > o.tolerance;
  if (c.violated && (k.p.max > 0 || k.softmax.exp == ExpImpl::sas)) {
    // both levels are relative to the row's max: no offset moves them; p.max 127 is the most the codes hold
    const double at127 = n / 254 / (1 + n / 254);
    const double nr = std::log(o.tolerance / (1 - o.tolerance) / n);  // the SAS threshold that keeps the limit
    c.fix = "p.format to a floating format (pv.unit and V to match) or shorter rows: the level is relative to the "
            "row's max, so no offset moves it, and p.max 127 still loses " + num(100 * at127) + "%" +
            (k.softmax.exp == ExpImpl::sas ? "; with softmax.sas_nr <= " + num(nr) + " for SAS's own threshold" : "");
  }
  else if (c.violated)
    c.fix = "raise p.offset or p.scale (P~ at the max " + num(top) + ") so that the flush level sits further below "
            "it, as FlashInfer's 2^8 pre-scale of P (p.offset 8), or choose a p.format with a smaller subnormal";
  return c;
}

// (3) An FP16 accumulator over the keys it holds before promotion. V is held unscaled on HMMA.F16 (fp16 V); on
// Ada's FP8 unit P~ and V are E4M3 codes: V scaled per channel to v.max (or the format's largest), or per tensor to
// 448, and both bounds rounded as the codes are (E4M3(447.89) = 448).
KernelContract fp16_accumulator_contract(const FlashKernel& k) {
  KernelContract c;
  c.name = "P V's FP16 accumulator within binary16";
  const bool fp8 = k.pv.unit == PvUnit::ada_mma_e4m3_acc16;
  const auto e4m3 = [](double x) { return lowp_round(x, fp8_e4m3fn(), LowpRounding::rne, LowpOverflow::saturate); };
  const ExpBase base{k.softmax.base == SoftmaxBase::two};
  const double p_top = k.p.scale * base.pow(k.p.offset + k.softmax.rescale_threshold);
  const double top = fp8 ? e4m3(p_top) : p_top;
  const bool scaled_v = fp8;
  if (k.pv.promote_keys == 0) {
    c.bound = "one accumulator over every key: unbounded in L_k";
    c.limit = "65504";
    c.violated = true;
    c.fix = "pv.promote_keys > 0: promote the FP16 accumulator to float32 every N keys";
  } else if (scaled_v) {
    const bool channel = k.v.scale == VScale::channel;
    const double v_top = e4m3(channel && k.v.max > 0 ? k.v.max : format_max(k.v.format));
    const double bound = static_cast<double>(k.pv.promote_keys) * top * v_top;
    c.bound = std::to_string(k.pv.promote_keys) + " keys x largest P~ code " + num(top) + " x largest V code " +
              num(v_top) + " = " + num(bound);
    c.limit = "65504";
    c.violated = bound > 65504;
    if (c.violated)
      c.fix = std::string(channel ? "" : "v.scale channel with ") + "v.max <= " +
              num(65504 / (static_cast<double>(k.pv.promote_keys) * top)) +
              " (its E4M3 value; SageAttention2's sm89 fp32+fp16: 2.25), or fewer pv.promote_keys";
  } else {
    const double per_v = static_cast<double>(k.pv.promote_keys) * top;
    c.bound = std::to_string(k.pv.promote_keys) + " keys x largest P~ " + num(top) + " x max|V| = " + num(per_v) +
              " max|V|";
    c.limit = "65504: holds for inputs with max|V| <= " + num(65504 / per_v) + " (V is held unscaled)";
  }
  return c;
}

// (4) The integer products of Q K^T: int32 partial sums of d products of codes.
KernelContract int_products_contract(const FlashKernel& k) {
  KernelContract c;
  const double qmax = k.qk.max > 0 ? k.qk.max : k.qk.format == KernelFormat::int8 ? 127 : 7;
  c.name = "integer Q K^T within int32";
  c.bound = "d x " + num(qmax) + " x " + num(qmax) + " = " + num(qmax * qmax) + " d";
  c.limit = "2^31 - 1: holds for head dimensions d <= " + num(std::floor(2147483647.0 / (qmax * qmax)));
  return c;
}

// The k of P V's matrix unit, in keys: 1 where the unit adds key by key.
int pv_unit_k(PvUnit unit) {
  if (unit == PvUnit::b200_nvf4) return 64;
  if (unit == PvUnit::h100_hmma_f16_acc16) return 16;
  if (unit == PvUnit::h100_wgmma_e4m3 || unit == PvUnit::b200_tcgen05_e4m3 || unit == PvUnit::ada_mma_e4m3 ||
      unit == PvUnit::ada_mma_e4m3_acc16 || pv_column_model(unit) != nullptr)
    return 32;
  return 1;
}

// (5) The matrix unit's k: a key block that is not a whole number of its steps is a partial step no kernel issues.
KernelContract pv_steps_contract(const FlashKernel& k, int step) {
  KernelContract c;
  c.name = "keys.block a whole number of P V steps";
  c.bound = k.keys.block == 0 ? "FlashAttention-3's FP8 tile (160, 128, 224, 160, 128 keys)"
                              : std::to_string(k.keys.block) + " keys";
  c.limit = "a multiple of " + std::to_string(step) + " (the unit's k)";
  c.violated = k.keys.block % step != 0;
  if (c.violated) c.fix = "keys.block: a multiple of " + std::to_string(step);
  return c;
}

}  // namespace

std::vector<KernelContract> kernel_contracts(const FlashKernel& k, const ContractOptions& o) {
  std::vector<KernelContract> out = {largest_p_contract(k), diffuse_mass_contract(k, o)};
  if (k.pv.unit == PvUnit::h100_hmma_f16_acc16 || k.pv.unit == PvUnit::ada_mma_e4m3_acc16)
    out.push_back(fp16_accumulator_contract(k));
  if (k.qk.format == KernelFormat::int8 || k.qk.format == KernelFormat::int4) out.push_back(int_products_contract(k));
  if (const int step = pv_unit_k(k.pv.unit); step > 1) out.push_back(pv_steps_contract(k, step));
  return out;
}

}  // namespace qattn::ref
