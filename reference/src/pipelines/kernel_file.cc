#include "qattn/reference/kernel_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "qattn/error.h"

namespace qattn::ref {
namespace {

template <class E>
using Names = std::vector<std::pair<std::string, E>>;

const Names<KernelFormat> kFormats = {{"int4", KernelFormat::int4}, {"int8", KernelFormat::int8},
                                      {"e4m3", KernelFormat::e4m3}, {"e5m2", KernelFormat::e5m2},
                                      {"fp16", KernelFormat::fp16}, {"bf16", KernelFormat::bf16},
                                      {"fp32", KernelFormat::fp32}, {"nvfp4", KernelFormat::nvfp4},
                                      {"mxfp4", KernelFormat::mxfp4}};
const Names<SageGranularity> kGranularity = {{"tensor", SageGranularity::tensor}, {"block", SageGranularity::block},
                                             {"warp", SageGranularity::warp}, {"thread", SageGranularity::thread},
                                             {"token", SageGranularity::token}};
const Names<ScaleRule> kScaleRules = {{"amax", ScaleRule::amax}, {"amax+1e-7", ScaleRule::amax_eps}, {"one", ScaleRule::one}};
const Names<ScaleArith> kArith = {{"f32", ScaleArith::f32}, {"f64", ScaleArith::f64}};
const Names<QuantRounding> kRoundings = {{"half-away", QuantRounding::half_away}, {"half-even", QuantRounding::half_even}};
const Names<QkTransform> kTransforms = {{"none", QkTransform::none}, {"hadamard", QkTransform::hadamard},
                                        {"smoothquant", QkTransform::smoothquant}, {"qserve", QkTransform::qserve}};
const Names<VScale> kVScales = {{"none", VScale::none}, {"channel", VScale::channel}, {"tensor", VScale::tensor},
                                 {"block16", VScale::block16}, {"block", VScale::block}};
const Names<ScaleAt> kScaleAt = {{"q", ScaleAt::q}, {"dequant", ScaleAt::dequant}, {"exp", ScaleAt::exp}};
const Names<SoftmaxBase> kBases = {{"2", SoftmaxBase::two}, {"e", SoftmaxBase::e}};
const Names<ExpImpl> kExps = {{"f64-rounded", ExpImpl::f64_rounded}, {"libm-f32", ExpImpl::libm_f32}, {"sas", ExpImpl::sas}};
const Names<SasCubic> kCubics = {{"paper", SasCubic::paper}, {"lsq", SasCubic::lsq}};
const Names<PFrom> kPFrom = {{"exponents", PFrom::exponents}, {"rescales", PFrom::rescales}};
const Names<MaxRule> kMaxRules = {{"raw", MaxRule::raw}, {"scaled", MaxRule::scaled}};
const Names<RowSumUpdate> kUpdates = {{"block", RowSumUpdate::block}, {"running", RowSumUpdate::running}};
const Names<RowSumOf> kSumOf = {{"unrounded", RowSumOf::unrounded}, {"rounded", RowSumOf::rounded}};
const Names<PvUnit> kUnits = {{"fp32", PvUnit::fp32}, {"fp22", PvUnit::fp22},
                              {"h100-hmma-f16-acc16", PvUnit::h100_hmma_f16_acc16},
                              {"h100-wgmma-e4m3", PvUnit::h100_wgmma_e4m3}, {"h100-mma-e4m3", PvUnit::h100_mma_e4m3},
                              {"ada-mma-e4m3", PvUnit::ada_mma_e4m3}, {"ada-mma-e4m3-acc16", PvUnit::ada_mma_e4m3_acc16}, {"b200-tcgen05-e4m3", PvUnit::b200_tcgen05_e4m3},
                              {"b200-nvf4", PvUnit::b200_nvf4}, {"exact", PvUnit::exact}};
const Names<SUnit> kSUnits = {{"exact", SUnit::exact}, {"h100-wgmma-e4m3", SUnit::h100_wgmma_e4m3},
                               {"b200-tcgen05-e4m3", SUnit::b200_tcgen05_e4m3}, {"b200-nvf4", SUnit::b200_nvf4},
                               {"b200-mxf4", SUnit::b200_mxf4}};
const Names<KeyOrder> kOrders = {{"forward", KeyOrder::forward}, {"reverse", KeyOrder::reverse}};
const Names<KeyPad> kPads = {{"masked", KeyPad::masked}, {"zeros", KeyPad::zeros}};
const Names<Finalize> kFinalizes = {{"divide", Finalize::divide},
                                    {"f64", Finalize::f64},
                                    {"reciprocal", Finalize::reciprocal},
                                    {"reciprocal-channel", Finalize::reciprocal_channel}};
const Names<RowSumTile> kTiles = {{"column", RowSumTile::column}, {"mma16", RowSumTile::mma16},
                                  {"lanes8", RowSumTile::lanes8}, {"octets32", RowSumTile::octets32}};
const Names<RefRule> kRefRules = {{"mul-sub", RefRule::mul_sub}, {"fma", RefRule::fma}};
const Names<RowSumCombine> kCombines = {{"(0+2)+(1+3)", RowSumCombine::pairs_02_13}, {"(0+1)+(2+3)", RowSumCombine::pairs_01_23}};

template <class E>
std::vector<std::string> names_of(const Names<E>& n) {
  std::vector<std::string> r;
  for (const auto& [name, e] : n) r.push_back(name);
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

[[noreturn]] void bad_value(const std::string& field, const std::string& value, const std::string& takes) {
  throw SpecError("kernel field " + field + ": '" + value + "' is not allowed (" + takes + ")");
}

long long parse_integer(const std::string& field, const std::string& v, long long lo, long long hi) {
  std::size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo || x > hi)
    bad_value(field, v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double parse_real(const std::string& field, const std::string& v) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !std::isfinite(x)) bad_value(field, v, "a finite number");
  return x;
}

bool parse_bool(const std::string& field, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  bad_value(field, v, "true or false");
}

std::string real_text(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

// One field: its description, and how to read and write it as text.
struct FieldAccess {
  KernelField info;
  std::function<std::string(const FlashKernel&)> get;
  std::function<void(FlashKernel&, const std::string&)> set;
};

// A choice field on member `m` of the description (reached through `part`).
template <class E, class Part>
FieldAccess choice_at(std::string name, const Names<E>& names, Part FlashKernel::*part, E Part::*m, std::string doc) {
  const std::vector<std::string> choices = names_of(names);
  return {{name, KernelFieldType::choice, choices, std::move(doc)},
          [&names, part, m](const FlashKernel& k) {
            for (const auto& [n, e] : names)
              if (e == k.*part.*m) return n;
            return std::string("?");
          },
          [&names, part, m, name, choices](FlashKernel& k, const std::string& v) {
            for (const auto& [n, e] : names)
              if (n == v) {
                k.*part.*m = e;
                return;
              }
            bad_value(name, v, "one of " + join(choices));
          }};
}

template <class Part>
FieldAccess bool_at(std::string name, Part FlashKernel::*part, bool Part::*m, std::string doc) {
  return {{name, KernelFieldType::boolean, {}, std::move(doc)},
          [part, m](const FlashKernel& k) { return std::string(k.*part.*m ? "true" : "false"); },
          [part, m, name](FlashKernel& k, const std::string& v) { k.*part.*m = parse_bool(name, v); }};
}

template <class Part, class T>
FieldAccess int_at(std::string name, Part FlashKernel::*part, T Part::*m, long long lo, long long hi, std::string doc) {
  return {{name, KernelFieldType::integer, {}, std::move(doc)},
          [part, m](const FlashKernel& k) { return std::to_string(k.*part.*m); },
          [part, m, name, lo, hi](FlashKernel& k, const std::string& v) {
            k.*part.*m = static_cast<T>(parse_integer(name, v, lo, hi));
          }};
}

template <class Part>
FieldAccess real_at(std::string name, Part FlashKernel::*part, double Part::*m, std::string doc) {
  return {{name, KernelFieldType::real, {}, std::move(doc)},
          [part, m](const FlashKernel& k) { return real_text(k.*part.*m); },
          [part, m, name](FlashKernel& k, const std::string& v) { k.*part.*m = parse_real(name, v); }};
}

FieldAccess group_size(const std::string& key, int SageGroupSizes::*m, const std::string& doc) {
  const std::string name = "qk.groups." + key;
  return {{name, KernelFieldType::integer, {}, doc},
          [m](const FlashKernel& k) { return std::to_string(k.qk.groups.*m); },
          [m, name](FlashKernel& k, const std::string& v) {
            k.qk.groups.*m = static_cast<int>(parse_integer(name, v, 1, 1 << 20));
          }};
}

const std::vector<FieldAccess>& fields() {
  using K = FlashKernel;
  static const std::vector<FieldAccess> f = {
      {{"name", KernelFieldType::text, {}, "how messages and `qattn kernel check` name the kernel"},
       [](const K& k) { return k.name; },
       [](K& k, const std::string& v) {
         if (v.empty()) bad_value("name", v, "a non-empty name");
         k.name = v;
       }},
      choice_at("qk.format", kFormats, &K::qk, &K::Qk::format,
                "Q and K codes: int8 (SageAttention), int4 (SageAttention2's INT4 kernels), e4m3 (FlashAttention-3), nvfp4 "
                "(E2M1 per 16 channels with an E4M3 scale fl32(amax / 6), SageAttention3), mxfp4 (E2M1 per 32 channels "
                "with the OCP MX scale 2^(floor(log2 amax) - 2))"),
      choice_at("qk.granularity", kGranularity, &K::qk, &K::Qk::granularity,
                "tokens sharing a scale: tensor, block (block_q / block_k tokens), warp, thread (the per-thread "
                "groups of the mma layouts: warp_q / warp_k), token"),
      group_size("block_q", &SageGroupSizes::block_q, "queries per block (BLKQ; Q smoothing's block too)"),
      group_size("block_k", &SageGroupSizes::block_k, "keys per block (BLKK)"),
      group_size("warp_q", &SageGroupSizes::warp_q, "queries per warp (WARPQ)"),
      group_size("warp_k", &SageGroupSizes::warp_k, "keys per warp (WARPK)"),
      choice_at("qk.scale", kScaleRules, &K::qk, &K::Qk::scale,
                "a group's scale: amax / qmax (SageAttention's Triton per-block), amax / qmax + 1e-7 (SageAttention2), "
                "one (e4m3: cast as is)"),
      choice_at("qk.arith", kArith, &K::qk, &K::Qk::arith,
                "the quantiser's arithmetic: f32 (float32 scale and division, as the Triton kernels) or f64"),
      choice_at("qk.rounding", kRoundings, &K::qk, &K::Qk::rounding,
                "integer codes: half-away (trunc(x/s + 0.5 sign), Triton) or half-even (cvt.rni); e4m3 rounds to "
                "nearest even whatever this says"),
      choice_at("qk.transform", kTransforms, &K::qk, &K::Qk::transform,
                "a change of basis of Q and K before smoothing: none, hadamard (random signs, then the normalised "
                "Walsh-Hadamard transform), smoothquant, qserve"),
      real_at("qk.alpha", &K::qk, &K::Qk::alpha, "smoothquant and qserve: the migration strength"),
      int_at("qk.hadamard_seed", &K::qk, &K::Qk::hadamard_seed, 0, 1LL << 30,
             "hadamard: the seed of std::mt19937_64 drawing the signs"),
      bool_at("qk.smooth_k", &K::qk, &K::Qk::smooth_k, "subtract the token mean of K (softmax-invariant)"),
      bool_at("qk.smooth_q", &K::qk, &K::Qk::smooth_q,
              "subtract each block_q block's mean of Q, add Delta S = mean K^T back in float32"),
      choice_at("qk.unit", kSUnits, &K::qk, &K::Qk::unit,
                "S's matrix unit (docs/mma.md): exact (integer Q/K: exact products), h100-wgmma-e4m3 (measured on an "
                "H100), b200-tcgen05-e4m3 and b200-nvf4 (MMA-Sim's models, not measured here); e4m3 Q/K take an FP8 unit, "
                "nvfp4 Q/K b200-nvf4, mxfp4 Q/K b200-mxf4"),
      int_at("qk.max", &K::qk, &K::Qk::max, 0, 127,
             "0: codes up to the format's largest by qk.scale; R in 1..127: FlashQ (TurboAttention), s = amax / R in "
             "float64 per block_q queries and block_k keys, codes nearest even in [-R, R] (R = 119, or 126)"),
      choice_at("v.format", kFormats, &K::v, &K::V::format, "V as P V reads it: e4m3, e5m2, int8, fp16 or nvfp4"),
      choice_at("v.scale", kVScales, &K::v, &K::V::scale,
                "none (binary16 as is, SageAttention), channel (amax / format max per channel, float64, "
                "SageAttention2), tensor (e4m3, descale fl32(amax / 448), FlashAttention-3), block16 (nvfp4: an E4M3 scale "
                "per 16 keys of a channel, SageAttention3), block (int8, one scale amax / v.max per key block over every "
                "channel, float64: FlashQ)"),
      choice_at("v.rule", kScaleRules, &K::v, &K::V::rule, "v.scale tensor: amax or one (a plain cast)"),
      bool_at("v.smooth", &K::v, &K::V::smooth, "subtract the token mean of V, add it to O"),
      real_at("v.max", &K::v, &K::V::max,
              "v.scale channel: the value each channel's amax is scaled to; 0: the format's largest (448 for e4m3). "
              "SageAttention2's sm89 fp32+fp16 path: 2.25 (64 keys x 448 x 2.25 = 64512 <= 65504). v.scale block: "
              "FlashQ's integer range R (119)"),
      choice_at("v.arith", kArith, &K::v, &K::V::arith,
                "v.scale channel: f64 (amax / max and the division in float64) or f32 (amax / max in float32, V times "
                "fl32(max / amax): SageAttention's CUDA quantiser); v.scale tensor: f32"),
      choice_at("softmax.scale_at", kScaleAt, &K::softmax, &K::Softmax::scale_at,
                "where the softmax scale enters: q (Q times fl32(scale 1.44269504) before quantising, SageAttention), "
                "dequant (in S's dequantisation factor, SageAttention2), exp (s2 in every exponent's fma, "
                "FlashAttention-3)"),
      choice_at("softmax.base", kBases, &K::softmax, &K::Softmax::base,
                "the exponential's base: 2 (log2 e folded into the scale) or e"),
      choice_at("softmax.exp", kExps, &K::softmax, &K::Softmax::exp,
                "f64-rounded (computed in float64, rounded once to float32) or libm-f32 (the C library's expf / "
                "exp2f); the GPUs' ex2.approx is not modelled; sas (TurboAttention's SAS of the distance from the max, "
                "LUT times cubic, in float64 rounded to float32, for P~ and every rescale: SAS(0) = a0)"),
      choice_at("softmax.max_rule", kMaxRules, &K::softmax, &K::Softmax::max_rule,
                "scale_at exp: the running max of raw S, s2 applied after (raw, FlashAttention-3), or of "
                "fma(S, s2, -p.offset) (scaled, SageAttention2's CUDA kernels; needed with a descale per block)"),
      choice_at("softmax.scale_log2", kArith, &K::softmax, &K::Softmax::scale_log2,
                "scale_at exp: fl32(scale) log2 e in float64 rounded once (f64, FlashAttention-3's host) or "
                "fl32(fl32(scale) fl32(log2 e)) (f32, SageAttention's kernels)"),
      real_at("softmax.rescale_threshold", &K::softmax, &K::Softmax::rescale_threshold,
              "0: the max follows every growth; t > 0: the running max (and the rescale) is kept while the block's max "
              "exceeds it by at most t exponent units (FlashAttention-4's rescale_threshold)"),
      int_at("softmax.ex2_emu_freq", &K::softmax, &K::Softmax::ex2_emu_freq, 0, 32,
             "0: every exp2 by softmax.exp; F > 0: FlashAttention-4's software exp2 (ex2_emulation) on the pairs "
             "(k, k + 1) with k mod F >= F - 4 of each 32-key fragment from ex2_emu_start to the last but one, in "
             "blocks without a masked key (FA4's FP8 tuning: 10 for d = 128 without a mask)"),
      int_at("softmax.ex2_emu_start", &K::softmax, &K::Softmax::ex2_emu_start, 0, 1 << 20,
             "the first 32-key fragment of a block that takes the software exp2 (FA4: 1)"),
      int_at("softmax.row_sum_threads", &K::softmax, &K::Softmax::row_sum_threads, 1, 4,
             "1, or 4: the quad of threads of a wgmma accumulator row keeps its own partial sums (column (j mod 8) / "
             "2), combined as (l0 + l2) + (l1 + l3)"),
      choice_at("softmax.row_sum_update", kUpdates, &K::softmax, &K::Softmax::row_sum_update,
                "block (l = l r + the block's own sum) or running (l = l r, then each P~ added)"),
      choice_at("softmax.row_sum_tile", kTiles, &K::softmax, &K::Softmax::row_sum_tile,
                "4 threads: each adds its columns in order (column, FlashAttention-3) or, per 16-column mma tile, "
                "((P_2t + P_2t+1) + P_8+2t) + P_9+2t at once (mma16, SageAttention's accumulate_d); one thread, "
                "running: eight lanes j mod 8, l r in lane 0, ((L0 + L2) + (L4 + L6)) + ((L1 + L3) + (L5 + L7)) "
                "(lanes8, FlashAttention-4's fadd_reduce); 4 threads, thread t holding keys 8t..8t+7 of every 32 in "
                "order (octets32, SageAttention3)"),
      choice_at("softmax.row_sum_combine", kCombines, &K::softmax, &K::Softmax::row_sum_combine,
                "4 threads: how the quad's sums combine: (0+2)+(1+3) (FlashAttention-3's Allreduce) or (0+1)+(2+3) "
                "(shfl_xor 1, then 2: SageAttention)"),
      choice_at("softmax.row_sum_of", kSumOf, &K::softmax, &K::Softmax::row_sum_of,
                "the row sum adds P~ before (unrounded, every official kernel here) or after its rounding to p.format"),
      choice_at("softmax.ref_rule", kRefRules, &K::softmax, &K::Softmax::ref_rule,
                "scale_at exp with a raw max: the exponent's reference fl32(fl32(m s2) - p.offset) (mul-sub, "
                "FlashAttention-3) or fma(m, s2, -p.offset) (fma: one rounding, SageAttention3)"),
      real_at("softmax.sas_nr", &K::softmax, &K::Softmax::sas_nr,
              "exp sas: the sparsity threshold n_r < 0, P~ = 0 below e^n_r of the max (TurboAttention: -6)"),
      choice_at("softmax.sas_poly", kCubics, &K::softmax, &K::Softmax::sas_poly,
                "exp sas: the cubic on [0, 1): paper (Eq. 15) or lsq (the least-squares refit, docs/methods/sas.md)"),
      bool_at("softmax.sas_half", &K::softmax, &K::Softmax::sas_half,
              "exp sas: the distance, LUT, cubic and product in emulated binary16 (the paper's FP16 path)"),
      real_at("p.offset", &K::p, &K::P::offset,
              "exponent units subtracted from the max: P~ <= base^offset (FlashAttention-3's max_offset 8; "
              "FlashInfer's 2^8 pre-scale is offset 8)"),
      real_at("p.scale", &K::p, &K::P::scale, "a factor on P~ after the exp (SageAttention2's 448)"),
      choice_at("p.format", kFormats, &K::p, &K::P::format,
                "P as P V reads it: e4m3 / e5m2 (nearest even, saturating), int8 (nearest), fp16, bf16, fp32, nvfp4 "
                "(per 16 keys: scale exp_b(fma(blockmax S, s2, -ref) + log2(1/6)), P~ / scale to E2M1, the scale to "
                "E4M3: SageAttention3's second level)"),
      int_at("p.max", &K::p, &K::P::max, 0, 127,
             "0, or with p.format int8 and pv.unit exact: each tile of qk.groups.block_q queries x one key block "
             "scaled by s_P = (largest P~ of the tile) / p.max in float64, codes nearest even in [0, p.max] "
             "(TurboAttention's FlashQ P: 119)"),
      choice_at("pv.unit", kUnits, &K::pv, &K::Pv::unit,
                "P V's matrix unit (docs/mma.md): fp32 adds, fp22 (the per-product FP22 bound), h100-hmma-f16-acc16, "
                "h100-wgmma-e4m3, h100-mma-e4m3; from MMA-Sim's model, not measured here: ada-mma-e4m3, "
                "ada-mma-e4m3-acc16 (its code, no vectors: an f16 accumulator, SageAttention2's sm89 fp32+fp16), "
                "b200-tcgen05-e4m3, b200-nvf4 (nvfp4 P and V); exact (integer P and V codes: each key block's "
                "sum exact, times s_P s_V in float64, rounded to float32, TurboAttention)"),
      int_at("pv.promote_keys", &K::pv, &K::Pv::promote_keys, 0, 1 << 24,
             "0: one accumulator over the key loop (FlashAttention-3); N: a fresh accumulator added to the float32 "
             "output every N keys, a multiple of keys.block (SageAttention2's two-level: 128 on sm90)"),
      bool_at("pv.promote_fma", &K::pv, &K::Pv::promote_fma,
              "promote_keys = keys.block: O = fma(O, r, acc) at each block (one rounding, SageAttention3's rescale_o) "
              "instead of O r, then + acc"),
      int_at("keys.block", &K::keys, &K::Keys::block, 0, 1 << 20,
             "keys per online-softmax block; 0: FlashAttention-3's FP8 tile for the head dimension"),
      choice_at("keys.order", kOrders, &K::keys, &K::Keys::order, "forward, or reverse (last block first, FlashAttention-3)"),
      choice_at("keys.pad", kPads, &K::keys, &K::Keys::pad,
                "keys past a multiple of keys.block: masked (absent) or zeros (logit 0 and V = 0, counted in the max and "
                "the sum: SageAttention's non-causal Triton kernel)"),
      choice_at("output.finalize", kFinalizes, &K::output, &K::Output::finalize,
                "divide (fl32(acc / l)), f64 (fl32(acc scale_c / l + mean_c) in float64), reciprocal "
                "(acc fl32(fl32(1 / l) descale)), reciprocal-channel (fl32(fl32(acc fl32(1 / l)) scale_c), "
                "SageAttention's CUDA kernels)"),
      choice_at("output.format", kFormats, &K::output, &K::Output::format, "O as stored: fp32, fp16 or bf16"),
      choice_at("output.p_from", kPFrom, &K::output, &K::Output::p_from,
                "P as probabilities (what analyze reports, not a kernel output): exponents (P8 base^(ref_b - ref_last) "
                "/ l in float64) or rescales (P8 s_P times the product of the rescales applied after its block, over "
                "l: the weights as the kernel applied them, where SAS(a) SAS(b) != SAS(a + b))"),
  };
  return f;
}

// The fields of the format's first version. A file must name each; a field added since may be left out (a file
// written before it existed) and keeps the description's default, the loop's behaviour before the field (qk.unit:
// h100-wgmma-e4m3 for e4m3 Q/K, the only unit they had; v.arith: f32 for tensor V, which was scaled in float32). The
// fields come in file order, so qk.format and v.scale are read first.
bool first_format_field(const std::string& name) {
  static const char* const kFirst[] = {
      "name", "qk.format", "qk.granularity", "qk.groups.block_q", "qk.groups.block_k", "qk.groups.warp_q",
      "qk.groups.warp_k", "qk.scale", "qk.arith", "qk.rounding", "qk.transform", "qk.alpha", "qk.hadamard_seed",
      "qk.smooth_k", "qk.smooth_q", "v.format", "v.scale", "v.rule", "v.smooth", "softmax.scale_at", "softmax.base",
      "softmax.exp", "softmax.rescale_threshold", "softmax.row_sum_threads", "softmax.row_sum_update",
      "softmax.row_sum_of", "p.offset", "p.scale", "p.format", "pv.unit", "pv.promote_keys", "keys.block", "keys.order",
      "keys.pad", "output.finalize", "output.format"};
  for (const char* f : kFirst)
    if (name == f) return true;
  return false;
}

const FieldAccess& field_named(const std::string& name) {
  for (const FieldAccess& f : fields())
    if (f.info.name == name) return f;
  std::vector<std::string> names;
  for (const FieldAccess& f : fields()) names.push_back(f.info.name);
  throw SpecError("kernel field '" + name + "' does not exist (fields: " + join(names) + ")");
}

}  // namespace

const std::vector<KernelField>& kernel_fields() {
  static const std::vector<KernelField> f = [] {
    std::vector<KernelField> r;
    for (const FieldAccess& a : fields()) r.push_back(a.info);
    return r;
  }();
  return f;
}

std::string get_kernel_field(const FlashKernel& k, const std::string& field) { return field_named(field).get(k); }

void set_kernel_field(FlashKernel& k, const std::string& field, const std::string& value) {
  field_named(field).set(k, value);
}

std::string kernel_to_json(const FlashKernel& k) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const FieldAccess& f : fields()) {
    nlohmann::ordered_json* node = &j;
    std::string rest = f.info.name;
    for (std::size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      const std::string part = rest.substr(0, dot);
      if (!node->contains(part)) (*node)[part] = nlohmann::ordered_json::object();
      node = &(*node)[part];
    }
    const std::string v = f.get(k);
    switch (f.info.type) {
      case KernelFieldType::text:
      case KernelFieldType::choice: (*node)[rest] = v; break;
      case KernelFieldType::integer: (*node)[rest] = std::stoll(v); break;
      case KernelFieldType::real: (*node)[rest] = std::stod(v); break;
      case KernelFieldType::boolean: (*node)[rest] = v == "true"; break;
    }
  }
  return j.dump(2) + "\n";
}

namespace {

// The file's JSON, refusing a key given twice in one object (the parser would keep the last one silently): the path
// of each open object, and the keys it has had.
nlohmann::json parse_description(const std::string& text, const std::string& file) {
  std::vector<std::pair<std::string, std::set<std::string>>> open;
  std::string last_key;
  const auto path_of = [&](const std::string& key) {  // the key's dotted path in the innermost open object
    return open.back().first.empty() ? key : open.back().first + "." + key;
  };
  const auto on_event = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open.emplace_back(open.empty() ? std::string() : path_of(last_key), std::set<std::string>{});
    } else if (event == E::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == E::key && !open.empty()) {
      last_key = parsed.get<std::string>();
      if (!open.back().second.insert(last_key).second)
        throw InputError(file, path_of(last_key), "given twice (a description names each field once)");
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(file, "JSON", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw InputError(file, "JSON", "a kernel description is a JSON object");
  return j;
}

// The leaves of the file by dotted name, each a known field.
std::map<std::string, const nlohmann::json*> field_values(const nlohmann::json& j, const std::string& file) {
  std::map<std::string, const nlohmann::json*> leaves;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& node,
                                                                          const std::string& prefix) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
      if (it->is_object()) walk(*it, name);
      else leaves[name] = &*it;
    }
  };
  walk(j, "");
  std::vector<std::string> names;
  for (const FieldAccess& f : fields()) names.push_back(f.info.name);
  for (const auto& [name, value] : leaves) {
    bool known = false;
    for (const std::string& n : names) known = known || n == name;
    if (!known) throw InputError(file, name, "no such field (fields: " + join(names) + ")");
  }
  return leaves;
}

// A field's JSON value as the text set_kernel_field takes, refused naming the field where its type is wrong.
std::string field_text(const FieldAccess& f, const nlohmann::json& v, const std::string& file) {
  switch (f.info.type) {
    case KernelFieldType::text:
    case KernelFieldType::choice:
      if (!v.is_string()) {
        const std::string takes = f.info.choices.empty() ? "" : " (one of " + join(f.info.choices) + ")";
        throw InputError(file, f.info.name, "expected a string" + takes + ", got " + v.dump());
      }
      return v.get<std::string>();
    case KernelFieldType::integer:
      if (!v.is_number_integer()) throw InputError(file, f.info.name, "expected an integer, got " + v.dump());
      return std::to_string(v.get<long long>());
    case KernelFieldType::real:
      if (!v.is_number()) throw InputError(file, f.info.name, "expected a number, got " + v.dump());
      return real_text(v.get<double>());
    case KernelFieldType::boolean:
      if (!v.is_boolean()) throw InputError(file, f.info.name, "expected true or false, got " + v.dump());
      return v.get<bool>() ? "true" : "false";
  }
  return {};
}

}  // namespace

FlashKernel kernel_from_json(const std::string& text, const std::string& file) {
  const nlohmann::json j = parse_description(text, file);
  // Every leaf of the file is a known field; every field is in the file.
  const std::map<std::string, const nlohmann::json*> leaves = field_values(j, file);
  FlashKernel k;
  for (const FieldAccess& f : fields()) {
    const auto it = leaves.find(f.info.name);
    if (it == leaves.end() && first_format_field(f.info.name))
      throw InputError(file, f.info.name, "missing: a description names every field (`qattn kernel show` prints one)");
    if (it == leaves.end()) {  // added since the first format: the loop as it ran before the field existed
      if (f.info.name == "qk.unit" && k.qk.format == KernelFormat::e4m3) k.qk.unit = SUnit::h100_wgmma_e4m3;
      if (f.info.name == "v.arith" && k.v.scale == VScale::tensor) k.v.arith = ScaleArith::f32;
      continue;
    }
    const std::string value = field_text(f, *it->second, file);
    try {
      f.set(k, value);
    } catch (const SpecError& e) {
      throw InputError(file, f.info.name, e.what());
    }
  }
  if (const std::optional<KernelProblem> problem = check_kernel(k))
    throw InputError(file, problem->field, problem->why);
  return k;
}

namespace {

// A description as a registry method.
class FlashMethod final : public Method {
 public:
  explicit FlashMethod(FlashKernel k) : k_(std::move(k)) { validate(k_); }
  const FlashKernel& kernel() const { return k_; }

 private:
  RowMatrixXd softmax_rows_impl(const MatrixView&) const override {
    throw SpecError(k_.name + " is an attention pipeline; it has no softmax-only form");
  }
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                 const AttentionMask& mask) const override {
    return flash_attention(q, k, v, scale, mask, k_);
  }
  std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                             const AttentionMask& mask) const override {
    return prepare_flash(q, k, v, scale, mask, k_);
  }

  FlashKernel k_;
};

double bits_of(KernelFormat f) {
  switch (f) {
    case KernelFormat::int4: return 4;
    case KernelFormat::int8:
    case KernelFormat::e4m3:
    case KernelFormat::e5m2: return 8;
    case KernelFormat::nvfp4: return 4.5;  // 4 bits and an 8-bit scale per 16
    case KernelFormat::mxfp4: return 4.25;  // 4 bits and an 8-bit scale per 32
    case KernelFormat::fp16:
    case KernelFormat::bf16: return 16;
    case KernelFormat::fp32: return 32;
  }
  return 32;
}

}  // namespace

std::unique_ptr<Method> make_flash_method(FlashKernel k) { return std::make_unique<FlashMethod>(std::move(k)); }

std::optional<FlashKernel> kernel_of(const Method& m) {
  if (const auto* f = dynamic_cast<const FlashMethod*>(&m)) return f->kernel();
  return std::nullopt;
}

MethodTraits flash_kernel_traits(const FlashKernel& k) {
  // Scales per block of keys (and per tensor, masked keys included): key order and masked keys change the bits.
  MethodTraits t{false, false, std::nullopt, false, (bits_of(k.qk.format) + bits_of(k.v.format)) / 2};
  // everything tensor-wide is in prepare()'s first pass; P~ tiles (p.max) stream in whole tiles (a tile beyond 2^19
  // rows is left to whole heads)
  const int bq = k.qk.groups.block_q;
  t.query_block_rows = k.p.max == 0 ? 64 : bq <= (1 << 19) ? bq * std::max(1, 64 / bq) : 0;
  return t;
}

FlashKernel read_kernel_file(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxKernelFileBytes)
    throw InputError(path, "file", std::to_string(size) + " bytes: a description is at most " +
                                       std::to_string(kMaxKernelFileBytes) + " bytes (`qattn kernel show` prints one under 2 KB)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "file", "cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw InputError(path, "file", "read error");
  return kernel_from_json(s.str(), path);
}

}  // namespace qattn::ref
