#include "qattn/reference/mma.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <climits>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "qattn/float_format.h"

namespace qattn::ref {
namespace {

constexpr int kNoExponent = INT_MIN / 4;  // a zero operand under the leading-bit rule: never the maximum

const LowpFormat& binary32() {
  static const LowpFormat f{"binary32", 8, 23, 127, true, LowpSpecials::ieee};
  return f;
}

// Every code of an input format, decoded once: its value and its exponent under each rule.
struct DecodedFormat {
  std::vector<double> value;
  std::vector<int> field_exponent;
  std::vector<int> leading_exponent;
};

DecodedFormat decode_all(const LowpFormat& f) {
  const std::size_t n = std::size_t{1} << f.bits();
  DecodedFormat d;
  d.value.resize(n);
  d.field_exponent.resize(n);
  d.leading_exponent.resize(n);
  for (std::size_t code = 0; code < n; ++code) {
    const double v = lowp_decode(static_cast<std::uint32_t>(code), f);
    d.value[code] = v;
    const bool finite_nonzero = std::isfinite(v) && v != 0;
    d.leading_exponent[code] = finite_nonzero ? std::ilogb(v) : kNoExponent;
    d.field_exponent[code] = finite_nonzero ? std::max(std::ilogb(v), f.emin()) : f.emin();
  }
  return d;
}

const DecodedFormat& decoded(MmaInput input) {
  static const std::array<DecodedFormat, 6> all{decode_all(fp8_e4m3fn()),    decode_all(fp8_e5m2()),
                                                 decode_all(fp16_binary16()), decode_all(bf16_bfloat16()),
                                                 decode_all(fp4_e2m1()),      decode_all(fp8_e4m3fnuz())};
  return all[static_cast<std::size_t>(input)];
}

// The bits of a held code that the input format reads: 16, 8, or E2M1's low nibble.
std::uint16_t code_mask(MmaInput input) {
  return input == MmaInput::e2m1 ? 0x0f : mma_input_bits(input) == 8 ? 0xff : 0xffff;
}

// x rounded toward zero to `bits` significant bits (x a double holding an integer or any finite value).
double truncate_significand(double x, int bits) {
  if (x == 0) return x;
  const int drop = std::ilogb(x) + 1 - bits;
  if (drop <= 0) return x;
  return std::ldexp(std::trunc(std::ldexp(x, -drop)), drop);
}

float to_float_rz(double x) {
  const float f = static_cast<float>(x);
  if (static_cast<double>(f) == x) return f;
  return static_cast<float>(lowp_round(x, binary32(), LowpRounding::rz, LowpOverflow::non_saturating));
}

// acc + p rounded toward zero onto FP22, from the exact sum: s = fl(acc + p) and its error t (TwoSum); where s is
// already on FP22's grid and the exact sum lies below it in magnitude, the result is the next FP22 value toward 0.
double fp22_add_rz(double acc, double p) {
  const double s = acc + p;
  const double bp = s - acc;
  const double t = (acc - (s - bp)) + (p - bp);
  const LowpFormat& fp22 = fp22_accumulator();
  const double r = lowp_round(s, fp22, LowpRounding::rz, LowpOverflow::non_saturating);
  if (r != s || t == 0 || (t > 0) == (s > 0)) return r;
  const int e = std::max(std::ilogb(s), fp22.emin());
  const double ulp_below = std::ldexp(1.0, (std::fabs(s) == std::ldexp(1.0, e) && e > fp22.emin() ? e - 1 : e) -
                                               fp22.mantissa_bits);
  return s > 0 ? s - ulp_below : s + ulp_below;
}

// A scale code's value: UE8M0 2^(code - 127) (0xFF NaN), UE4M3 the E4M3 value of the code without its sign bit.
double scale_value(MmaScale scale, std::uint8_t code) {
  if (scale == MmaScale::ue8m0) return code == 0xff ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, code - 127);
  return lowp_decode(code & 0x7fu, fp8_e4m3fn());  // the sign bit ignored; 0x7F is NaN
}

void check_model(const MmaModel& m) {
  if (m.step_products < 1 || m.fraction_bits < 0 || m.fraction_bits > 40 || m.sum_bits < 1 || m.sum_bits > 24 ||
      m.promote_steps < 0 || m.sum_fraction_bits < 0 || m.sum_fraction_bits > 40 || m.c_drop_below < 0 ||
      m.group_products < 0 || m.scale_block < 0)
    throw std::invalid_argument("mma model " + m.name + ": parameters out of range (" + m.describe() + ")");
  if (m.partition == MmaPartition::k_mod4_pairs && m.step_products % 2 != 0)
    throw std::invalid_argument("mma model " + m.name + ": k_mod4_pairs needs an even step_products");
  const bool scaled = m.scale != MmaScale::none;
  if (scaled != (m.scale_block > 0) || (m.group_products > 0 && !scaled) ||
      (m.scale == MmaScale::ue4m3 && m.group_products == 0) ||
      (m.group_products > 0 && (m.step_products % m.group_products != 0 || m.scale_block % m.group_products != 0)) ||
      (scaled && (m.partition != MmaPartition::contiguous || m.align != MmaAlign::fused || m.per_product)))
    throw std::invalid_argument("mma model " + m.name + ": block scales need scale_block > 0, a contiguous fused "
                                "step, and groups (for UE4M3 scales) that divide the step and the block");
  if (m.align == MmaAlign::group_then_c &&
      (m.accumulator != MmaAccumulator::f32 || m.partition != MmaPartition::contiguous || m.c_add != MmaCAdd::fused ||
       m.promote_steps > 0 || m.per_product || m.exponent_rule == MmaExponentRule::field))
    throw std::invalid_argument("mma model " + m.name + ": group_then_c takes an f32 accumulator, contiguous steps, C "
                                "fused, no promotion and a field_zero_* or leading_bit exponent rule");
}

}  // namespace

std::string MmaModel::describe() const {
  std::ostringstream s;
  static const char* const inputs[] = {"e4m3", "e5m2", "f16", "bf16", "e2m1", "e4m3fnuz"};
  static const char* const rules[] = {"exponent fields", "leading bits",
                                      "exponent fields (a zero operand or accumulator at -126)",
                                      "exponent fields (a zero operand or accumulator does not count)"};
  s << inputs[static_cast<int>(input)];
  if (per_product) {
    s << ", per product: acc + a*b rounded toward zero onto FP22 (1-8-13)";
    return s.str();
  }
  if (scale != MmaScale::none)
    s << " with " << mma_scale_name(scale) << " scales per " << scale_block << " k"
      << (group_products > 0 ? ", groups of " + std::to_string(group_products) +
                                   " products summed exactly and scaled, aligned by the scales' exponents"
                             : ", the scales' exponents added to each product's");
  if (align == MmaAlign::group_then_c) {
    s << ", groups of " << step_products << " products" << (even_odd ? " (even and odd k apart)" : "")
      << " truncated toward zero at " << fraction_bits << " fraction bits below their largest exponent, then that "
      << "sum and C aligned to the larger exponent and truncated downward (the sum at " << sum_fraction_bits
      << " bits, C at " << fraction_bits << ")";
    if (c_drop_below > 0) s << ", C dropped more than " << c_drop_below << " binades below the sum";
    s << ", rounded to nearest even onto float32, E from " << rules[static_cast<int>(exponent_rule)];
    return s.str();
  }
  s << ", " << step_products << " products/step, " << fraction_bits << " fraction bits below 2^E (truncated)";
  if (accumulator == MmaAccumulator::f32) s << ", sum RZ to " << sum_bits << " bits";
  s << ", E from " << rules[static_cast<int>(exponent_rule)]
    << (partition == MmaPartition::k_mod4_pairs ? ", steps k mod 4 < 2 then >= 2" : "")
    << (c_add == MmaCAdd::fused ? ", C fused into the first step" : ", C added after in f32 (RNE)")
    << (accumulator == MmaAccumulator::f16 ? ", f16 accumulator: the sum rounded once to nearest even onto binary16"
                                           : "");
  if (promote_steps > 0) s << ", promoted to an f32 total (RNE) every " << promote_steps << " steps";
  return s.str();
}

const LowpFormat& mma_input_format(MmaInput input) {
  switch (input) {
    case MmaInput::e4m3: return fp8_e4m3fn();
    case MmaInput::e5m2: return fp8_e5m2();
    case MmaInput::f16: return fp16_binary16();
    case MmaInput::bf16: return bf16_bfloat16();
    case MmaInput::e2m1: return fp4_e2m1();
    case MmaInput::e4m3fnuz: return fp8_e4m3fnuz();
  }
  throw std::invalid_argument("mma: unknown input format");
}

int mma_input_bits(MmaInput input) { return input == MmaInput::f16 || input == MmaInput::bf16 ? 16 : 8; }

double mma_scale_value(MmaScale scale, std::uint8_t code) {
  if (scale == MmaScale::none) throw std::invalid_argument("mma_scale_value: no scale format");
  return scale_value(scale, code);
}

const char* mma_scale_name(MmaScale scale) {
  return scale == MmaScale::ue8m0 ? "UE8M0" : scale == MmaScale::ue4m3 ? "UE4M3" : "no";
}

namespace {

// A preset with every parameter of `base` but its name and provenance (the caller sets the ones it changes).
MmaModel variant_of(const MmaModel& base, const char* name, std::string provenance) {
  MmaModel m = base;
  m.name = name;
  m.provenance = std::move(provenance);
  return m;
}

// The presets measured on an H100: every output of their vector files reproduced.
void add_h100_presets(std::vector<MmaModel>& p) {
  MmaModel wgmma;
  wgmma.name = "h100-wgmma-e4m3";
  wgmma.provenance = "H100 FP8 wgmma, cuBLASLt fast accumulation (torch._scaled_mm use_fast_accum=True), "
                     "K = 32..4096: every output of wgmma_cublaslt_e4m3.npz";
  p.push_back(wgmma);
  MmaModel promote = variant_of(wgmma, "h100-wgmma-e4m3-promote",
                                "H100 FP8 wgmma, cuBLASLt default mode (promotion to an f32 total every 4 k-steps = "
                                "128 k), K = 32..4096: every output of wgmma_cublaslt_e4m3.npz");
  promote.promote_steps = 4;
  p.push_back(promote);
  MmaModel hmma = variant_of(wgmma, "h100-hmma-f16",
                             "H100 mma.sync.m16n8k16 f16 -> f32 (HMMA.16816.F32): every output of "
                             "mma_sync_m16n8k16_f16f32.npz and of the f16-subnormal probe set probe_f16f32_subnormal");
  hmma.input = MmaInput::f16;
  hmma.step_products = 16;
  hmma.fraction_bits = 25;
  hmma.sum_bits = 24;
  hmma.exponent_rule = MmaExponentRule::field_zero_low;
  p.push_back(hmma);
  MmaModel bf = variant_of(hmma, "h100-hmma-bf16", "H100 mma.sync.m16n8k16 bf16 -> f32 (HMMA.16816.F32.BF16): every "
                                                   "output of mma_sync_m16n8k16_bf16f32.npz");
  bf.input = MmaInput::bf16;
  p.push_back(bf);
  MmaModel acc16 = variant_of(hmma, "h100-hmma-f16-acc16", "H100 mma.sync.m16n8k16 f16 -> f16 (HMMA.16816.F16): "
                                                           "every output of mma_sync_m16n8k16_f16f16.npz");
  acc16.accumulator = MmaAccumulator::f16;
  // The leading-bit rule, as measured: the f16f16 vectors hold no subnormal operand, so they do not decide between
  // it and the field rule the f32 probe showed (both reproduce every output); sage1's f16 P~V runs on this preset
  // (hmma_f16_acc16_step). docs/mma.md "Open: f16 subnormal operands with an f16 accumulator".
  acc16.exponent_rule = MmaExponentRule::leading_bit;
  p.push_back(acc16);
  MmaModel mma8 = variant_of(hmma, "h100-mma-e4m3",
                             "H100 (sm_90) mma.sync.m16n8k32 e4m3 -> f32, which runs as two HMMA.16816.F32 on the "
                             "operands converted to f16: every output of mma_sync_m16n8k32_e4m3.npz");
  mma8.input = MmaInput::e4m3;
  mma8.exponent_rule = MmaExponentRule::leading_bit;  // the operands reach the HMMA as f16, where E4M3's
                                                       // subnormals are normal: their leading bit is their exponent
  mma8.partition = MmaPartition::k_mod4_pairs;
  mma8.c_add = MmaCAdd::after;
  p.push_back(mma8);
}

// The presets from MMA-Sim's published bit-accurate model (not measured here): ../shared/data/mmasim's vectors.
void add_mmasim_presets(std::vector<MmaModel>& p) {
  const std::string mmasim = "MMA-Sim model, not measured here (arXiv 2511.10909; its authors validated it on the "
                             "GPU): every output of mmasim_vectors.npz";
  auto from_model = [&](const char* name, MmaInput input, int step, int fraction_bits, const char* instruction) {
    MmaModel m;
    m.name = name;
    m.provenance = std::string(instruction) + "; " + mmasim;
    m.input = input;
    m.step_products = step;
    m.fraction_bits = fraction_bits;
    m.sum_bits = 24;
    m.exponent_rule = MmaExponentRule::field_zero_low;
    m.measured = false;
    return m;
  };
  p.push_back(from_model("b200-tcgen05-f16", MmaInput::f16, 16, 25, "B200 tcgen05.mma kind::f16, f16 -> f32"));
  p.push_back(from_model("b200-tcgen05-bf16", MmaInput::bf16, 16, 25, "B200 tcgen05.mma kind::f16, bf16 -> f32"));
  MmaModel b_acc16 = from_model("b200-tcgen05-f16-acc16", MmaInput::f16, 16, 25,
                                "B200 tcgen05.mma kind::f16, f16 -> f16 accumulator");
  b_acc16.accumulator = MmaAccumulator::f16;
  p.push_back(b_acc16);
  p.push_back(from_model("b200-tcgen05-e4m3", MmaInput::e4m3, 32, 25,
                         "B200 tcgen05.mma kind::f8f6f4 unscaled, e4m3 -> f32"));
  p.push_back(from_model("b200-tcgen05-e5m2", MmaInput::e5m2, 32, 25,
                         "B200 tcgen05.mma kind::f8f6f4 unscaled, e5m2 -> f32"));
  MmaModel mxf8 = from_model("b200-mxf8-e4m3", MmaInput::e4m3, 32, 25,
                             "B200 tcgen05.mma kind::mxf8f6f4.block32, e4m3 with UE8M0 scales -> f32");
  mxf8.scale = MmaScale::ue8m0;
  mxf8.scale_block = 32;
  p.push_back(mxf8);
  MmaModel mxf4 = from_model("b200-mxf4", MmaInput::e2m1, 64, 35,
                             "B200 tcgen05.mma kind::mxf4nvf4.block32, e2m1 with UE8M0 scales (MXFP4) -> f32");
  mxf4.scale = MmaScale::ue8m0;
  mxf4.scale_block = 32;
  mxf4.group_products = 16;
  p.push_back(mxf4);
  MmaModel nvf4 = variant_of(mxf4, "b200-nvf4", "B200 tcgen05.mma kind::mxf4nvf4.block16, e2m1 with UE4M3 scales "
                                                "(NVFP4) -> f32; " + mmasim);
  nvf4.scale = MmaScale::ue4m3;
  nvf4.scale_block = 16;
  p.push_back(nvf4);
  MmaModel ada = from_model("ada-mma-e4m3", MmaInput::e4m3, 16, 13,
                            "Ada (sm_89) mma.sync.m16n8k32 e4m3 -> f32: two fused steps of 16 per instruction");
  ada.sum_bits = 14;
  p.push_back(ada);
  // MMA-Sim's Ada FP8 unit with an f16 accumulator (nv_ptx/sim.py: F = 13, "RNE-FP16"; arithmetic/fdpa.py: the
  // exact sum of the truncated terms rounded once to nearest even onto binary16), as its code states it:
  // mmasim_vectors.npz holds no set of it, so no vector validates it here.
  MmaModel ada16 = variant_of(ada, "ada-mma-e4m3-acc16",
                              "Ada (sm_89) mma.sync.m16n8k32 e4m3 -> f16 accumulator: two fused steps of 16 per "
                              "instruction, each rounded to nearest even onto binary16; MMA-Sim's model as its code "
                              "states it (arXiv 2511.10909; nv_ptx/sim.py, arithmetic/fdpa.py), no vectors of it here");
  ada16.accumulator = MmaAccumulator::f16;
  ada16.sum_bits = 24;
  ada16.validated = false;
  p.push_back(ada16);
  auto cdna3 = [&](const char* name, MmaInput input, int step, const char* instruction) {
    MmaModel m = from_model(name, input, step, 24, instruction);
    m.align = MmaAlign::group_then_c;
    m.sum_fraction_bits = 31;
    m.exponent_rule = MmaExponentRule::field_zero_none;
    return m;
  };
  p.push_back(cdna3("mi300-mfma-f16", MmaInput::f16, 8, "MI300 (CDNA3) v_mfma_f32_*_f16"));
  p.push_back(cdna3("mi300-mfma-bf16", MmaInput::bf16, 8, "MI300 (CDNA3) v_mfma_f32_*_bf16"));
  MmaModel fnuz = cdna3("mi300-mfma-e4m3fnuz", MmaInput::e4m3fnuz, 16, "MI300 (CDNA3) v_mfma_f32_*_fp8_fp8 (E4M3FNUZ)");
  fnuz.even_odd = true;
  fnuz.c_drop_below = 25;
  p.push_back(fnuz);
}

}  // namespace

const std::vector<MmaModel>& mma_presets() {
  static const std::vector<MmaModel> presets = [] {
    std::vector<MmaModel> p;
    add_h100_presets(p);
    add_mmasim_presets(p);
    MmaModel fp22;
    fp22.name = "per-product-fp22";
    fp22.provenance = "a bound, not hardware: SageAttention2 Sec. 3.4 read as an FP22 (1-8-13) accumulator rounded "
                      "toward zero after every product; matches no measured instruction (docs/mma.md)";
    fp22.per_product = true;
    fp22.step_products = 1;
    fp22.validated = false;
    fp22.measured = false;
    p.push_back(fp22);
    return p;
  }();
  return presets;
}

const MmaModel& mma_preset(std::string_view name) {
  std::string names;
  for (const MmaModel& m : mma_presets()) {
    if (m.name == name) return m;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  throw std::invalid_argument("unknown mma model '" + std::string(name) + "' (the presets: " + names + ")");
}

namespace {

// An operand's exponent in a table for its rule: a zero operand reads kZeroOperand where the rule treats zero apart.
constexpr int kZeroOperand = INT_MIN / 8;

struct ExponentReader {
  const std::vector<int>* table;  // per code
  int zero_product;               // a product with a zero operand (kNoExponent: it does not count)
  int zero_acc;                   // a zero accumulator
  bool clamp_acc;                 // a subnormal accumulator reads acc_emin (its field), not its leading bit
  int acc_emin;                   // -126 (float32) or -14 (an f16 accumulator)
};

struct RuleTables {
  std::vector<int> field, leading, field_zero;  // field_zero: subnormals at emin, zero at kZeroOperand
};

const RuleTables& rule_tables(MmaInput input) {
  static const std::array<RuleTables, 6> all = [] {
    std::array<RuleTables, 6> t;
    for (std::size_t i = 0; i < t.size(); ++i) {
      const DecodedFormat& d = decoded(static_cast<MmaInput>(i));
      t[i].field = d.field_exponent;
      t[i].leading = d.leading_exponent;
      t[i].field_zero = d.field_exponent;
      for (std::size_t code = 0; code < d.value.size(); ++code)
        if (d.value[code] == 0) t[i].field_zero[code] = kZeroOperand;
    }
    return t;
  }();
  return all[static_cast<std::size_t>(input)];
}

ExponentReader exponent_reader(const MmaModel& m) {
  const RuleTables& t = rule_tables(m.input);
  const int emin = m.accumulator == MmaAccumulator::f16 ? -14 : -126;
  switch (m.exponent_rule) {
    case MmaExponentRule::field: return {&t.field, 0, kNoExponent, true, -126};  // as measured on the H100's wgmma
    case MmaExponentRule::leading_bit: return {&t.leading, kNoExponent, kNoExponent, false, emin};
    case MmaExponentRule::field_zero_low: return {&t.field_zero, -126, -126, true, emin};
    case MmaExponentRule::field_zero_none: return {&t.field_zero, kNoExponent, kNoExponent, true, emin};
  }
  throw std::invalid_argument("mma: unknown exponent rule");
}

int product_exponent(const ExponentReader& r, int ea, int eb) {
  return ea == kZeroOperand || eb == kZeroOperand ? r.zero_product : ea + eb;
}

// The accumulator's exponent: a subnormal reads its format's minimum normal exponent under the field rules (-126 for
// float32, -14 for an f16 accumulator's binary16).
int acc_exponent(const ExponentReader& r, double acc) {
  if (acc == 0) return r.zero_acc;
  return r.clamp_acc ? std::max(std::ilogb(acc), r.acc_emin) : std::ilogb(acc);
}

// The CDNA3 step (align = group_then_c): products [s0, s1) of the step and the accumulator acc.
double group_then_c_step(const MmaModel& m, const DecodedFormat& dec, const ExponentReader& r, std::uint16_t mask,
                         std::span<const std::uint16_t> a, std::span<const std::uint16_t> b, std::size_t s0,
                         std::size_t s1, double acc) {
  // One sum of the products s0 + first, s0 + first + stride, ...: each truncated toward zero at fraction_bits below
  // their largest exponent. Returns the sum in units of 2^(E - fraction_bits) and E (kNoExponent: no product counts).
  auto partial = [&](std::size_t first, std::size_t stride) {
    int e = kNoExponent;
    for (std::size_t i = s0 + first; i < s1; i += stride)
      e = std::max(e, product_exponent(r, (*r.table)[a[i] & mask], (*r.table)[b[i] & mask]));
    double sum = 0;
    if (e > kNoExponent / 2)
      for (std::size_t i = s0 + first; i < s1; i += stride)
        sum += std::trunc(std::ldexp(dec.value[a[i] & mask] * dec.value[b[i] & mask], m.fraction_bits - e));
    return std::pair{sum, e};
  };
  double sum = 0;  // in units of 2^(e_g - fraction_bits)
  int e_g = kNoExponent;
  if (m.even_odd) {
    const auto [even, e_even] = partial(0, 2);
    const auto [odd, e_odd] = partial(1, 2);
    e_g = std::max(e_even, e_odd);
    if (e_g > kNoExponent / 2)  // both truncated downward at the larger exponent's fraction_bits
      for (const auto& [part, e] : {std::pair{even, e_even}, std::pair{odd, e_odd}})
        if (e > kNoExponent / 2) sum += std::floor(std::ldexp(part, e - e_g));
  } else {
    std::tie(sum, e_g) = partial(0, 1);
  }
  const int e_c = acc_exponent(r, acc);
  const int e = std::max(e_g, e_c);
  if (e <= kNoExponent / 2) return 0.0;  // no term has an exponent: every one is zero, and the sum is +0
  // Units of 2^(e - sum_fraction_bits): the sum truncated downward there, acc downward at fraction_bits.
  double total = 0.0;  // an exact zero sum is +0
  if (e_g > kNoExponent / 2) total += std::floor(std::ldexp(sum, e_g - e + m.sum_fraction_bits - m.fraction_bits));
  const bool dropped = m.c_drop_below > 0 && e_g > kNoExponent / 2 && acc != 0 && e_c < e_g - m.c_drop_below;
  if (!dropped)
    total += std::ldexp(std::floor(std::ldexp(acc, m.fraction_bits - e)), m.sum_fraction_bits - m.fraction_bits);
  return static_cast<double>(static_cast<float>(std::ldexp(total, e - m.sum_fraction_bits)));  // RNE onto float32
}

// One call's operands as the model reads them: each code masked to its format's bits and decoded, and each
// product's block scales.
struct DotOperands {
  const MmaModel& m;
  const DecodedFormat& dec;
  std::uint16_t mask;
  std::span<const std::uint16_t> a, b;
  std::span<const std::uint8_t> sa, sb;
  std::size_t k, block;
  bool scaled;

  double product(std::size_t i) const { return dec.value[a[i] & mask] * dec.value[b[i] & mask]; }
  // A product's value with its block's scales (without groups: exact powers of two).
  double scale_of(std::size_t i) const {
    return scaled ? scale_value(m.scale, sa[i / block]) * scale_value(m.scale, sb[i / block]) : 1.0;
  }
};

// align = group_then_c (CDNA3): the steps of step_products one by one (group_then_c_step); once a step overflows to
// +-inf, the rest adds in IEEE arithmetic.
float group_then_c_dot(const DotOperands& o, const ExponentReader& reader, float c) {
  const std::size_t n = static_cast<std::size_t>(o.m.step_products), k = o.k;
  double acc = c;
  for (std::size_t s0 = 0; s0 < k; s0 += n) {
    acc = group_then_c_step(o.m, o.dec, reader, o.mask, o.a, o.b, s0, std::min(k, s0 + n), acc);
    if (!std::isfinite(acc)) {
      for (std::size_t i = s0 + n; i < k; ++i) acc += o.product(i);
      break;
    }
  }
  return static_cast<float>(acc);
}

// align = fused: each step's terms and its accumulator aligned to their largest exponent E, truncated at
// fraction_bits below it and summed exactly, then rounded onto the accumulator (f32 RZ at sum_bits, or f16 RNE);
// C fused into the first step, added after, or promoted into an f32 total every promote_steps steps.
float fused_dot(const DotOperands& o, const ExponentReader& reader, float c) {
  const MmaModel& m = o.m;
  const std::size_t k = o.k, n = static_cast<std::size_t>(m.step_products);
  const std::vector<int>& exponent = *reader.table;
  // The i-th k in step order. k_mod4_pairs: within each chunk of 2n (or the rest of k), first the k with
  // k mod 4 < 2, then the others.
  auto kth = [&](std::size_t i) -> std::size_t {
    if (m.partition == MmaPartition::contiguous) return i;
    const std::size_t base = i / (2 * n) * (2 * n), half = std::min(2 * n, k - base) / 2, j = i - base;
    return j < half ? base + j / 2 * 4 + j % 2 : base + (j - half) / 2 * 4 + 2 + (j - half) % 2;
  };
  // The step's terms besides acc: one per product, or one per group of group_products (the group's exact sum times
  // its scales, at the scales' exponents).
  const std::size_t g = m.group_products > 0 ? static_cast<std::size_t>(m.group_products) : 1;
  auto term_exponent = [&](std::size_t i) {
    if (m.group_products > 0) {
      const double sa_v = scale_value(m.scale, o.sa[i / o.block]), sb_v = scale_value(m.scale, o.sb[i / o.block]);
      return sa_v == 0 || sb_v == 0 ? reader.zero_product : std::ilogb(sa_v) + std::ilogb(sb_v);
    }
    const int e = product_exponent(reader, exponent[o.a[kth(i)] & o.mask], exponent[o.b[kth(i)] & o.mask]);
    return o.scaled && e > kNoExponent / 2 ? e + std::ilogb(o.scale_of(i)) : e;
  };
  auto term_value = [&](std::size_t i) {
    double v = 0;
    for (std::size_t j = i; j < std::min(k, i + g); ++j) v += o.product(kth(j));
    return v * o.scale_of(i);  // exact: E2M1 group sums and UE4M3 scales hold few bits
  };
  const bool promote = m.promote_steps > 0;
  double acc = (m.c_add == MmaCAdd::fused && !promote) ? static_cast<double>(c) : 0.0;
  float total = promote ? c : 0.0f;
  std::size_t step = 0;
  for (std::size_t s0 = 0; s0 < k; s0 += n, ++step) {
    const std::size_t s1 = std::min(k, s0 + n);
    int e_max = acc_exponent(reader, acc);
    for (std::size_t i = s0; i < s1; i += g) e_max = std::max(e_max, term_exponent(i));
    if (e_max > kNoExponent / 2) {
      // Units of 2^(E - fraction_bits): every truncated term is an integer below 2^(fraction_bits + 12) and their
      // sum below 2^(fraction_bits + 18), so the double sum is exact (fraction_bits <= 35 in every preset).
      const int unit = e_max - m.fraction_bits;
      double sum = 0.0;  // an exact zero sum is +0, whatever the signs of zero C and zero products
      sum += std::trunc(std::ldexp(acc, -unit));
      for (std::size_t i = s0; i < s1; i += g) sum += std::trunc(std::ldexp(term_value(i), -unit));
      if (m.accumulator == MmaAccumulator::f16)  // one rounding of the exact sum (HMMA.16816.F16)
        acc = lowp_round(std::ldexp(sum, unit), fp16_binary16(), LowpRounding::rne, LowpOverflow::non_saturating);
      else
        acc = to_float_rz(std::ldexp(truncate_significand(sum, m.sum_bits), unit));
      if (!std::isfinite(acc)) {  // an f16 accumulator overflowed to +-inf: the rest adds in IEEE arithmetic
        for (std::size_t i = s1; i < k; ++i) acc += o.product(kth(i));
        break;
      }
    }
    if (promote && (step + 1) % static_cast<std::size_t>(m.promote_steps) == 0) {
      total += static_cast<float>(acc);
      acc = 0;
    }
  }
  if (promote) return total + static_cast<float>(acc);
  if (m.c_add == MmaCAdd::after) return static_cast<float>(acc) + c;
  return static_cast<float>(acc);
}

}  // namespace

float mma_dot(const MmaModel& m, std::span<const std::uint16_t> a, std::span<const std::uint16_t> b, float c,
              std::span<const std::uint8_t> sa, std::span<const std::uint8_t> sb) {
  check_model(m);
  if (a.size() != b.size()) throw std::invalid_argument("mma_dot: a and b differ in length");
  const std::size_t k = a.size(), block = static_cast<std::size_t>(m.scale_block);
  const DotOperands o{m, decoded(m.input), code_mask(m.input), a, b, sa, sb, k, block, m.scale != MmaScale::none};
  if (o.scaled && (k % block != 0 || sa.size() != k / block || sb.size() != k / block))
    throw std::invalid_argument("mma_dot: model " + m.name + " takes k a multiple of " + std::to_string(block) +
                                " and k / " + std::to_string(block) + " scale codes for a and for b");
  bool finite = std::isfinite(c);
  for (std::size_t i = 0; i < k && finite; ++i)
    finite = std::isfinite(o.dec.value[a[i] & o.mask]) && std::isfinite(o.dec.value[b[i] & o.mask]);
  for (std::size_t i = 0; i < sa.size() && o.scaled; ++i)
    if (std::isnan(scale_value(m.scale, sa[i])) || std::isnan(scale_value(m.scale, sb[i])))
      return std::numeric_limits<float>::quiet_NaN();
  if (!finite) {
    double s = c;
    for (std::size_t i = 0; i < k; ++i) s += o.product(i) * o.scale_of(i);
    return static_cast<float>(s);
  }
  if (m.per_product) {
    double acc = c;
    for (std::size_t i = 0; i < k; ++i) acc = fp22_add_rz(acc, o.product(i));
    return static_cast<float>(acc);
  }
  const ExponentReader reader = exponent_reader(m);
  if (m.align == MmaAlign::group_then_c) return group_then_c_dot(o, reader, c);
  if (m.partition == MmaPartition::k_mod4_pairs && k % 4 != 0)
    throw std::invalid_argument("mma model " + m.name + ": k = " + std::to_string(k) + " is not a multiple of 4");
  return fused_dot(o, reader, c);
}

void mma_matmul(const MmaModel& m, std::span<const std::uint16_t> a, std::span<const std::uint16_t> bt,
                std::span<const float> c, std::span<float> d, std::size_t rows, std::size_t cols, std::size_t depth,
                std::span<const std::uint8_t> sa, std::span<const std::uint8_t> sbt) {
  const std::size_t blocks = m.scale_block > 0 ? depth / static_cast<std::size_t>(m.scale_block) : 0;
  if (a.size() != rows * depth || bt.size() != cols * depth || d.size() != rows * cols ||
      (!c.empty() && c.size() != rows * cols) || sa.size() != rows * blocks || sbt.size() != cols * blocks)
    throw std::invalid_argument("mma_matmul: the sizes of A, Bt, C, D and the scales do not match rows, cols and depth");
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      d[i * cols + j] = mma_dot(m, a.subspan(i * depth, depth), bt.subspan(j * depth, depth),
                                c.empty() ? 0.0f : c[i * cols + j], sa.subspan(i * blocks, blocks),
                                sbt.subspan(j * blocks, blocks));
}

}  // namespace qattn::ref
