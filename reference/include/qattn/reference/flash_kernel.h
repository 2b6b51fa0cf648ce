// An online-softmax ("flash") attention kernel as a description: the formats, scales, matrix units, softmax and P~
// rules and accumulation of a quantised attention kernel, as values (docs/kernels-as-data.md). One loop,
// prepare_flash, runs any description; sage1, sage2, sage3, fa3-fp8, fa4-fp8 and turbo are descriptions of it
// (sage1_kernel, ..., turbo_kernel). One call, Q [L_q, d], K [L_k, d], V [L_k, d_v], every step in the order below:
//
//   (1) Q and K: change of basis (qk.transform), K smoothing (qk.smooth_k: K - mean over tokens, float64), Q block
//       smoothing with Delta S (qk.smooth_q); with softmax.scale_at = q, Q becomes fl32(fl32(Q) fl32(scale log2 e))
//   (2) Q and K quantised (qk.format, granularity, scale, arith, rounding; qk.max > 0: FlashQ per block), or K's
//       codes from a key side (FlashKeyCodes)
//   (3) S on qk.unit (int: exact integer products; e4m3: an FP8 wgmma / tcgen05.mma over d in steps of 32), float32:
//         scale_at = q        S = fl32(fl32(A s_Q) s_K)                      (log2 e and the scale are in Q)
//         scale_at = dequant  S = fl32(A) fl32(s_Q s_K scale [log2 e])  + Delta S
//         scale_at = exp      S raw; s2 = fl32(fl32(fl32(scale) log2 e) fl32(d_Q d_K)) enters each exponent (per
//                             pair of Q and K blocks with e4m3 granularity block); the max is of raw S (max_rule
//                             raw) or of fma(S, s2, -offset) (scaled)
//   (4) key blocks of keys.block (first to last, or last first); per row: m_new = max(m, rowmax S_blk), unless
//       softmax.rescale_threshold > 0 and the growth (in exponent units) does not exceed it (the max is kept);
//       ref = m_new (s2 m_new with scale_at = exp) - p.offset; P~ = p.scale exp_b(S - ref) (exp: fma(S, s2, -ref)),
//       r = exp_b(m - m_new) (times s2 with scale_at = exp); the row sum l takes P~ before or after its rounding
//   (5) P = P~ rounded to p.format (p.max > 0: per tile of block_q rows x one key block, s_P = max P~ / p.max);
//       P V on pv.unit, in steps of the unit's k (exact: the block's integer sum, times s_P s_V in float64); the
//       accumulator is promoted (added to the float32 output after its rescale) every pv.promote_keys keys, or
//       never (one accumulator, rescaled)
//   (6) O from the accumulator, l, V's scale and mean (output.finalize), rounded to output.format
// Every rounding is named in docs/kernels-as-data.md; the parts no measured vector validates are listed there.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "qattn/method.h"
#include "qattn/reference/quant.h"
#include "qattn/reference/sage_quant.h"

namespace qattn::ref {

// nvfp4: E2M1 codes in blocks of 16 (along d for Q and K, along the keys for P and V), each block with an E4M3
// scale: SageAttention3's format (docs/pipelines/sage3.md). mxfp4 (Q and K only): E2M1 in blocks of 32 channels with
// an OCP MX scale 2^(floor(log2 amax) - 2) (UE8M0).
enum class KernelFormat { int4, int8, e4m3, e5m2, fp16, bf16, fp32, nvfp4, mxfp4 };

enum class QkTransform { none, hadamard, smoothquant, qserve };
enum class ScaleRule { amax, amax_eps, one };  // amax / qmax; amax / qmax + 1e-7 (SageAttention2); 1 (a plain cast)
enum class ScaleArith { f32, f64 };
enum class ScaleAt { q, dequant, exp };
enum class SoftmaxBase { two, e };
// exp in float64 rounded once to float32; the C library's expf/exp2f; TurboAttention's SAS (sas.h) of the distance
// -x >= 0 in float64 (base e), rounded to float32, for P~ and for every rescale (SAS(0) is a0, not 1)
enum class ExpImpl { f64_rounded, libm_f32, sas };
enum class SasCubic { paper, lsq };  // SAS's POLY: Eq. 15's coefficients, or the least-squares refit (sas.h)
enum class MaxRule { raw, scaled };  // scale_at exp: the max of raw S (s2 applied after), or of fma(S, s2, -offset)
enum class RowSumUpdate { block, running };
// 4 threads: each column in order, or per 16-column mma tile; lanes8 (1 thread, running): FlashAttention-4's
// fadd_reduce, eight lanes j mod 8 with l r in lane 0, combined ((L0 + L2) + (L4 + L6)) + ((L1 + L3) + (L5 + L7))
// octets32: 4 threads, thread t holding keys 8t..8t+7 of every 32 (SageAttention3's permuted K), each in order
enum class RowSumTile { column, mma16, lanes8, octets32 };
// How the exponent's reference is formed from the max (scale_at exp, raw max): fl32(fl32(m s2) - offset), FA3; or
// fma(m, s2, -offset), one rounding (nvcc's contraction of m * s2 + c, SageAttention3)
enum class RefRule { mul_sub, fma };
enum class RowSumCombine { pairs_02_13, pairs_01_23 };  // (l0 + l2) + (l1 + l3) (FA3), (l0 + l1) + (l2 + l3) (Sage)    // l = l r + (this block's sum); or l = l r, then each P~ added
enum class RowSumOf { unrounded, rounded };
// The FP8 units read E4M3 P and V; ada_mma_e4m3 and b200_tcgen05_e4m3 are MMA-Sim's models (not measured here);
// ada_mma_e4m3_acc16 (an f16 accumulator, SageAttention2's sm89 "fp32+fp16") is MMA-Sim's code with no vectors.
// exact: integer P and V codes, each key block's sum exact in int64, times s_P s_V in float64, rounded to float32.
enum class PvUnit {
  fp32, fp22, h100_hmma_f16_acc16, h100_wgmma_e4m3, h100_mma_e4m3, ada_mma_e4m3, ada_mma_e4m3_acc16, b200_tcgen05_e4m3,
  b200_nvf4, exact
};
// The MMA preset a P V unit runs one output column at a time (mma_dot, 32 keys per call: h100-mma-e4m3), or nullptr
// for the units with their own loops (fp32, fp22, and the vectorised steps of h100-hmma-f16-acc16, h100-wgmma-e4m3,
// ada-mma-e4m3, ada-mma-e4m3-acc16, b200-tcgen05-e4m3 and b200-nvf4).
struct MmaModel;
const MmaModel* pv_column_model(PvUnit unit);
// S's matrix unit: exact integer products (int8 / int4 Q and K), the H100's FP8 wgmma, or B200's unscaled FP8
// tcgen05.mma (MMA-Sim's model, not measured here): d in fused steps of 32 from a zero accumulator.
// b200_nvf4: NVFP4 Q and K on the block-scaled FP4 step (b200-nvf4), d in steps of 64 with Delta S as C.
enum class SUnit { exact, h100_wgmma_e4m3, b200_tcgen05_e4m3, b200_nvf4, b200_mxf4 };
// block16: NVFP4, an E4M3 scale per 16 keys of a channel; block: int8 with one scale per key block over every
// channel, FlashQ's amax / v.max in float64 (flashq.h)
enum class VScale { none, channel, tensor, block16, block };
// P as probabilities: P8 base^(ref_b - ref_last) / l (exponents), or P8 s_P times the product of the rescales the
// kernel applied after the block, over l (rescales: the weights as applied, where exp(a) exp(b) != exp(a + b), SAS)
enum class PFrom { exponents, rescales };
enum class KeyOrder { forward, reverse };
enum class KeyPad { masked, zeros };
enum class Finalize { divide, f64, reciprocal, reciprocal_channel };

struct FlashKernel {
  std::string name = "kernel";  // how error messages name it

  struct Qk {
    KernelFormat format = KernelFormat::int8;  // int8, int4 or e4m3
    SageGranularity granularity = SageGranularity::thread;
    SageGroupSizes groups;
    ScaleRule scale = ScaleRule::amax_eps;
    ScaleArith arith = ScaleArith::f64;
    QuantRounding rounding = QuantRounding::half_away;  // e4m3: round to nearest even, whatever this says
    QkTransform transform = QkTransform::none;
    double alpha = 0.5;               // smoothquant, qserve
    std::uint64_t hadamard_seed = 0;  // hadamard: signs from std::mt19937_64(seed)
    bool smooth_k = true, smooth_q = false;
    SUnit unit = SUnit::exact;  // exact for int8 / int4; an FP8 unit for e4m3
    int max = 0;  // 0: the format's largest code with qk.scale; R: FlashQ, s = amax / R in float64 per block (flashq.h)
  } qk;

  struct V {
    KernelFormat format = KernelFormat::e4m3;  // e4m3, e5m2, int8, fp16
    VScale scale = VScale::channel;
    ScaleRule rule = ScaleRule::amax;  // tensor: amax (descale fl32(amax / 448)) or one
    bool smooth = false;               // V - mean over tokens, the mean added to O
    ScaleArith arith = ScaleArith::f64;  // channel: float64 division, or float32 times fl32(max / amax) (e4m3, e5m2)
    double max = 0;  // channel: the value a channel's amax is scaled to; 0: the format's largest (SageAttention2's
                     // sm89 fp32+fp16 path: 2.25, so that 64 keys of P~ <= 448 stay within binary16)
  } v;

  struct Softmax {
    ScaleAt scale_at = ScaleAt::dequant;
    SoftmaxBase base = SoftmaxBase::e;
    ExpImpl exp = ExpImpl::libm_f32;
    MaxRule max_rule = MaxRule::raw;
    ScaleArith scale_log2 = ScaleArith::f64;  // fl32(scale) log2 e in float64 (FA3's host) or float32 (Sage)
    double rescale_threshold = 0;  // 0: the max follows every growth; > 0: kept while growth <= this (FA4)
    // FlashAttention-4's software exp2 (ex2_emulation, a degree-3 polynomial) for part of each key block's P~: in
    // fragments of 32 keys from ex2_emu_start up to the last but one, the pairs (k, k + 1) with k mod freq >= freq - 4
    // (k the even offset in the fragment); 0: every exp2 by softmax.exp. Blocks with a masked key use softmax.exp.
    int ex2_emu_freq = 0;
    int ex2_emu_start = 1;
    int row_sum_threads = 1;       // 1, or 4: the quad of threads of a wgmma accumulator row ((col mod 8) / 2)
    RowSumUpdate row_sum_update = RowSumUpdate::running;
    RowSumTile row_sum_tile = RowSumTile::column;
    RowSumCombine row_sum_combine = RowSumCombine::pairs_02_13;
    RowSumOf row_sum_of = RowSumOf::unrounded;
    RefRule ref_rule = RefRule::mul_sub;
    double sas_nr = -6;                     // exp sas: the sparsity threshold n_r < 0
    SasCubic sas_poly = SasCubic::paper;    // exp sas: the cubic
    bool sas_half = false;                  // exp sas: the LUT and cubic in emulated binary16
  } softmax;

  struct P {
    double offset = 0;  // subtracted from the max in the exponent: P~ <= base^offset (FA3's max_offset 8)
    double scale = 1;   // multiplies P~ after the exp (SageAttention2's 448)
    KernelFormat format = KernelFormat::e4m3;  // e4m3, e5m2 (RNE, saturating), int8 (nearest), fp16, fp32
    int max = 0;  // int8 on pv.unit exact: each tile of block_q queries x one key block scaled to [0, max] (FlashQ)
  } p;

  struct Pv {
    PvUnit unit = PvUnit::h100_wgmma_e4m3;
    int promote_keys = 0;  // 0: one accumulator over the key loop; N: promoted every N keys (a multiple of keys.block)
    bool promote_fma = false;  // O = fma(O, r, acc) at each block's promotion (promote_keys = keys.block), one rounding
  } pv;

  struct Keys {
    int block = 128;  // 0: FlashAttention-3's FP8 tile for the head dimension (fa3_fp8_key_block)
    KeyOrder order = KeyOrder::forward;
    KeyPad pad = KeyPad::masked;
  } keys;

  struct Output {
    Finalize finalize = Finalize::f64;
    KernelFormat format = KernelFormat::fp32;  // fp32, fp16, bf16
    PFrom p_from = PFrom::exponents;
  } output;
};

// The first field of a description the loop cannot run, and why (the values it allows there); nullopt if it runs.
struct KernelProblem {
  std::string field, why;
};
std::optional<KernelProblem> check_kernel(const FlashKernel& k);
// The same as SpecError("kernel 'NAME': FIELD: WHY").
void validate(const FlashKernel& k);

// One call prepared: steps (1)-(3)'s tensor-wide parts first, then any block of query rows (Method::prepare).
// q, k, v and mask must outlive the returned call.
std::unique_ptr<PreparedCall> prepare_flash(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const FlashKernel& kernel);

// The key side of a call given ready-made, as a KV cache holds it (TurboAttention's decode, turbo.h): INT8 codes of K
// and V in key blocks of any lengths, one scale per block each. Keys [0, settled_from) and the complete chunks of
// `chunk` keys after it that a query row has seen (up to its last visible key) are read from the settled matrices
// (a compressed cache), the rest from the buffer ones; without a buffer every key is settled. The description must
// have int8 Q/K with qk.max, v.scale block and pv.unit exact; its keys.block is replaced by these blocks.
struct FlashKeyCodes {
  std::vector<Eigen::Index> begin;  // block starts, then L_k
  std::vector<double> k_scale, v_scale;
  RowMatrixXi32 k_settled, v_settled, k_buffer, v_buffer;
  Eigen::Index settled_from = 0, chunk = 1;
};
std::unique_ptr<PreparedCall> prepare_flash(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                            const AttentionMask& mask, const FlashKernel& kernel,
                                            std::shared_ptr<const FlashKeyCodes> keys);
AttentionResult flash_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const AttentionMask& mask, const FlashKernel& kernel);

// Step (1)'s change of basis alone: q and k in place (Q K^T unchanged in exact arithmetic). InputError for hadamard
// with a head dimension that is not a power of 2, or a channel scale that overflows.
void transform_qk(RowMatrixXd& q, RowMatrixXd& k, QkTransform t, double alpha, std::uint64_t seed,
                  const std::string& name);

// FlashAttention-4's software exp2 (flash_attn/cute/utils.py, ex2_emulation), every step in float32: x below 2^-126
// in magnitude reads 0 (.ftz), x = max(x, -127), n = floor(x) (the sum with 1.5 2^23 rounded down), f = x - n,
// p = fma(fma(fma(c3, f, c2), f, c1), f, 1) with the fpminimax coefficients c1 = 0x3F31F519, c2 = 0x3E6906A4,
// c3 = 0x3D9DF09D, and 2^n p formed by adding n << 23 to p's bits; a result with a zero exponent field (n = -127)
// reads 0, as the .ftz instructions that consume it read it. FA4 assumes x <= 127; beyond it this gives +inf, as
// the hardware's exp2 does for large x (a NaN x reads -127, as max(x, -127) does, and gives 0).
float fa4_ex2_emulation(float x);

// FlashAttention-3's FP8 tile sizes for the head dimension (tile_size_fwd_sm90, element size 1).
int fa3_fp8_key_block(Eigen::Index head_dim);
int fa3_fp8_query_tile(Eigen::Index head_dim);

// Step (4)'s exponent as the CUDA kernels take it (sage1, sage2's official kernels, sage3, fa3-fp8, fa4-fp8): base 2
// with log2 e folded into the scale, which enters at `at`, and every exp2 in float64 rounded once to float32 (the
// kernels' ex2.approx is not modelled). Sets softmax.scale_at, base and exp; the other softmax fields are left.
void exp2_softmax(FlashKernel& k, ScaleAt at);
// FlashAttention-3's key order and step (6), which fa4-fp8 and sage3 (built on its code) keep: key blocks last first,
// O times fl32(1 / l), stored as bfloat16 (`output_bf16`) or float32.
void fa3_epilogue(FlashKernel& k, bool output_bf16);

}  // namespace qattn::ref
