// Fused multi-term matrix multiply-accumulate (MMA) as matrix units compute it: a parametric model, and named
// presets for the instructions an NVIDIA H100 was measured on (experiments/data/h100-mma) and for those MMA-Sim's
// published model describes (Blackwell, Ada, CDNA3: not measured here; docs/mma.md).
//
// One output is D = sum_k a_k b_k + C. The instruction splits k into steps of `step_products` products; a step
// sums its products and the running accumulator acc in one operation, rounded once (align = fused):
//
//   E     = max over the step's terms of their exponent: e(a_k) + e(b_k) for a product, e(acc) for the accumulator
//           (exponent_rule says how e() reads an operand, a zero operand and a zero accumulator)
//   term' = the term truncated toward zero to a multiple of 2^(E - fraction_bits)
//   acc   = (sum of the terms', exact) rounded toward zero to `sum_bits` significant bits (an f32 accumulator),
//           or rounded once, to nearest even, onto binary16 (an f16 accumulator; sum_bits unused).
//
// Block scales (scale != none): operand k of row i carries the scale code S[i, k / scale_block]. Without groups
// (MXFP8) the two scales' exponents add to each product's exponent, exactly. With groups (group_products > 0:
// MXFP4, NVFP4) each run of group_products products is summed exactly and multiplied by its two scales, and the
// groups enter E by their scales' exponents alone (floor(log2) of each scale, added), not by the sums' magnitude.
//
// align = group_then_c (AMD CDNA3 MFMA) splits the step in two roundings of its own kind: the step's products are
// aligned to their largest exponent E_g and truncated toward zero at fraction_bits (with even_odd, the even-k and the
// odd-k products form two such sums, each at its own maximum, then both are truncated downward at fraction_bits
// below the larger and added); then that sum and acc are aligned to max(E_g, e(acc)) and truncated downward, the sum
// at sum_fraction_bits and acc at fraction_bits (acc dropped when e(acc) < E_g - c_drop_below, c_drop_below > 0),
// added and rounded to nearest even onto float32.
//
// C enters as the first step's accumulator (c_add = fused) or is added afterwards in float32, round to nearest
// even, to a sum whose steps start from zero (c_add = after, the FP8 mma.sync of sm_90). promote_steps > 0 adds acc
// to a float32 total (round to nearest even) and restarts it from zero every promote_steps steps (cuBLASLt's
// default FP8 mode, SageAttention2's two-level accumulation). The per-product bound (per_product = true) rounds
// toward zero onto FP22 (1-8-13) after every single product instead: it matches no measured instruction.
//
// Values in and out are exact: operands are codes of the input format, C and D float32 (binary16 values carried in
// float32 for an f16 accumulator). Non-finite operands or C give the IEEE sum of the products and C (NaN, +-inf);
// a NaN scale code gives NaN.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qattn/reference/lowp_float.h"

namespace qattn::ref {

// e2m1 codes are one per byte, in the low nibble (not packed); e4m3fnuz is CDNA3's FP8 (bias 8, 0x80 NaN).
enum class MmaInput { e4m3, e5m2, f16, bf16, e2m1, e4m3fnuz };

// How an operand's exponent enters E. Every rule reads a normal operand as floor(log2 |x|).
enum class MmaExponentRule {
  field,        // the stored exponent field: subnormals and zero at emin; a zero accumulator does not count
                // (the H100's FP8 wgmma reads E4M3 fields)
  leading_bit,  // floor(log2 |x|) for subnormals too; a zero operand's product and a zero accumulator do not count
  field_zero_low,   // subnormals at emin (a significand below 1); a product with a zero operand, and a zero
                    // accumulator, count at -126 (the H100's HMMA, Blackwell, Ada: MMA-Sim's rule)
  field_zero_none,  // subnormals at emin; a product with a zero operand, and a zero accumulator, do not count (CDNA3)
};

// Block scale codes: UE8M0 (2^(code - 127), 0xFF NaN) or UE4M3 (E4M3 without its sign: the sign bit is ignored,
// 0x7F NaN).
enum class MmaScale { none, ue8m0, ue4m3 };

enum class MmaAlign {
  fused,         // products and acc aligned together to the step's E, truncated toward zero, rounded once
  group_then_c,  // CDNA3: the products first, then their sum with acc, truncated downward (see above)
};

// Which k form a step.
enum class MmaPartition {
  contiguous,   // k in [s·n, (s+1)·n)
  k_mod4_pairs, // sm_90's FP8 mma.sync.m16n8k32: first k mod 4 < 2, then k mod 4 >= 2 (two HMMA.16816 halves)
};

enum class MmaCAdd {
  fused,  // C is the accumulator of the first step
  after,  // the steps start from zero; C is added at the end in float32, round to nearest even
};

enum class MmaAccumulator { f32, f16 };

struct MmaModel {
  std::string name;
  std::string provenance;
  MmaInput input = MmaInput::e4m3;
  int step_products = 32;
  int fraction_bits = 13;  // bits kept below 2^E in every term (at most 40)
  int sum_bits = 14;       // significant bits of a step's result, rounded toward zero (at most 24)
  MmaExponentRule exponent_rule = MmaExponentRule::field;
  MmaPartition partition = MmaPartition::contiguous;
  MmaCAdd c_add = MmaCAdd::fused;
  MmaAccumulator accumulator = MmaAccumulator::f32;
  int promote_steps = 0;
  bool per_product = false;
  MmaScale scale = MmaScale::none;
  int scale_block = 0;       // K per scale code (32: MX, 16: NVFP4)
  int group_products = 0;    // > 0: products summed exactly in groups, scaled, aligned by the scales' exponents
  MmaAlign align = MmaAlign::fused;
  int sum_fraction_bits = 0; // group_then_c: bits kept below E of the products' sum where it meets acc
  bool even_odd = false;     // group_then_c: even-k and odd-k products summed apart (CDNA3 FP8)
  int c_drop_below = 0;      // group_then_c: acc dropped when its exponent is more than this below E_g (0: never)
  bool validated = true;     // reproduces vectors measured on the GPU it names
  bool measured = true;      // validated by vectors measured here on a GPU (false: by a published model's vectors)

  // A one-line statement of the parameters, e.g. "e4m3, 32 products/step, 13 fraction bits, RZ to 14 bits, ...".
  std::string describe() const;
};

// The presets, by name: measured on an H100: h100-wgmma-e4m3, h100-wgmma-e4m3-promote, h100-mma-e4m3,
// h100-hmma-f16, h100-hmma-bf16, h100-hmma-f16-acc16; from MMA-Sim's model (not measured here): b200-tcgen05-f16,
// b200-tcgen05-bf16, b200-tcgen05-f16-acc16, b200-tcgen05-e4m3, b200-tcgen05-e5m2, b200-mxf8-e4m3, b200-mxf4,
// b200-nvf4, ada-mma-e4m3, mi300-mfma-f16, mi300-mfma-bf16, mi300-mfma-e4m3fnuz; from MMA-Sim's code, with no
// vectors: ada-mma-e4m3-acc16; a bound: per-product-fp22.
const std::vector<MmaModel>& mma_presets();
// Throws std::invalid_argument naming the presets for an unknown name.
const MmaModel& mma_preset(std::string_view name);

const LowpFormat& mma_input_format(MmaInput input);
int mma_input_bits(MmaInput input);  // the width of the codes as held: 8 (FP8, and E2M1 one code per byte) or 16
// The value of a scale code (the sign bit of a UE4M3 code ignored; NaN for the NaN codes), and its name.
double mma_scale_value(MmaScale scale, std::uint8_t code);
const char* mma_scale_name(MmaScale scale);

// One dot product: codes of a[0..k) and b[0..k) (the low 8 or 16 bits of each entry, the low 4 for E2M1),
// accumulator c; for a block-scaled model sa and sb hold the k / scale_block scale codes of a and b.
float mma_dot(const MmaModel& m, std::span<const std::uint16_t> a, std::span<const std::uint16_t> b, float c,
              std::span<const std::uint8_t> sa = {}, std::span<const std::uint8_t> sb = {});

// D[i, j] = mma_dot(A row i, Bt row j, C[i, j]) for row-major A (m x k), Bt (n x k), C and D (m x n). C may be
// empty (zero). A block-scaled model takes SA (m x k/scale_block) and SBt (n x k/scale_block).
void mma_matmul(const MmaModel& m, std::span<const std::uint16_t> a, std::span<const std::uint16_t> bt,
                std::span<const float> c, std::span<float> d, std::size_t rows, std::size_t cols, std::size_t depth,
                std::span<const std::uint8_t> sa = {}, std::span<const std::uint8_t> sbt = {});

// --- A batched product from a user's arrays (qattn mma, qattn.mma): one set of checks for both -----------------

// The bound on D: its outputs as float32, 4 bytes each (an f16 accumulator computes them in float32 too), at most
// 1 GiB (2^28 outputs). A product beyond it is refused before anything is allocated (docs/mma.md "Bounds").
inline constexpr std::size_t kMmaMaxOutputBytes = std::size_t{1} << 30;
// The bound on A and Bt: at most 2^30 elements each (2 GiB as the 16-bit codes the models read), so that an array
// that holds few bytes but many elements (a NumPy view with a zero stride) is refused before its codes are made.
inline constexpr std::size_t kMmaMaxOperandElements = std::size_t{1} << 30;

// The sizes of D[..., M, N] = A[..., M, K] · Bt[..., N, K]^T + C[..., M, N].
struct MmaShape {
  std::size_t batch = 0;        // the product of the leading dimensions (0 when D is empty and that product overflows)
  std::size_t rows = 0, cols = 0, depth = 0;  // M, N, K
  std::size_t outputs = 0;      // batch·M·N, at most kMmaMaxOutputBytes / 4
  std::vector<std::int64_t> d;  // D's (and C's) shape [..., M, N]
};

// A's and Bt's shapes checked, nothing allocated: both of rank 2 or more, the same rank, leading dimensions and K,
// no negative dimension; the element counts of A, Bt and D computed without overflow (a zero dimension makes a count
// 0), D within kMmaMaxOutputBytes and A and Bt within kMmaMaxOperandElements. K = 0 is valid: every output is an
// empty sum, D = C (docs/mma.md "K = 0").
// Throws InputError(a_source or bt_source, "shape", reason); the reason gives the shape it got, and for a product
// that is refused both shapes, D's and D's size in bytes.
MmaShape mma_shape(std::span<const std::int64_t> a, std::span<const std::int64_t> bt, const std::string& a_source,
                   const std::string& bt_source);

// K fits model `m`: a model that pairs k by k mod 4 (MmaPartition::k_mod4_pairs) needs K a multiple of 4, a
// block-scaled model K a multiple of its scale block. Throws InputError(a_source, "shape", reason) naming K, the
// model and the rule.
void mma_check_depth(const MmaModel& m, const MmaShape& shape, const std::string& a_source);

// The scale codes of a block-scaled model: SA [..., M, K/block] (is_bt false) or SBt [..., N, K/block] as uint8.
// Refused with InputError(source, field, reason) for a model without block scales ("--scale-a/--scale-bt": the
// model takes none), a missing one (source is then the operand's), a dtype other than uint8 ("dtype"), or a shape
// other than the one expected ("shape", naming the block size). A model without scales and no scales given: empty.
std::vector<std::uint8_t> mma_scales(const MmaModel& m, const MmaShape& s, bool is_bt, bool given,
                                     std::string_view dtype, std::span<const std::int64_t> shape, const void* data,
                                     const std::string& source);

// C as the model adds it, in float32. Refused with InputError(source, field, reason) unless its dtype (`dtype`, as
// numpy and dtype_name() spell it) is float32 or float16 (field "dtype"), its shape is D's ("shape"), and, for a
// model with an f16 accumulator, every finite value is a binary16 value ("element i", i the flat C-order index).
// `data` holds shape's elements in C order, native byte order (float16 as its bit patterns).
std::vector<float> mma_accumulator(const MmaModel& m, const MmaShape& s, std::string_view dtype,
                                   std::span<const std::int64_t> shape, const void* data, const std::string& source);

// D = A·B + C for every batch entry of a checked shape: a and bt hold batch·M·K and batch·N·K codes, c is empty
// (zero) or holds s.outputs values, d holds s.outputs values. An empty D computes nothing.
// sa and sbt: batch·M·K/block and batch·N·K/block scale codes for a block-scaled model, empty otherwise.
void mma_batched(const MmaModel& m, const MmaShape& s, std::span<const std::uint16_t> a,
                 std::span<const std::uint16_t> bt, std::span<const float> c, std::span<float> d,
                 std::span<const std::uint8_t> sa = {}, std::span<const std::uint8_t> sbt = {});

// One fused step of the H100's FP8 wgmma (h100-wgmma-e4m3, docs/mma.md) for `cols` outputs at once:
//   acc[c] <- RZ_14( trunc(acc[c]) + sum_j trunc(p[j] v[j][c]) ), every term truncated at 2^(E_c - 13),
//   E_c = max(e(acc[c]), max_j e(p[j]) + e(v[j][c])) with E4M3 field exponents (subnormals and zero at -6).
// p holds n <= 32 E4M3 values, v n rows of `cols` E4M3 values (row stride `stride`), v_exponent their field exponents
// (max(floor(log2|v|), -6), zero at -6) in the same layout. Bit-identical to mma_dot of the preset on the same
// operands (tests/unit/sage2_test.cc), vectorised over c.
// An E4M3 value's exponent as wgmma_e4m3_step reads it: max(floor(log2|x|), -6), zero at -6.
std::int8_t wgmma_e4m3_exponent(float x);
void wgmma_e4m3_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                     std::size_t stride, std::size_t cols);
// One fused step of B200's unscaled FP8 tcgen05.mma (b200-tcgen05-e4m3, MMA-Sim's model, not measured here) for `cols`
// outputs at once, in the layout of wgmma_e4m3_step: terms truncated at 2^(E_c - 25), the exact sum rounded toward zero
// to 24 significant bits; E_c = max(e(acc[c]), e(p[j]) + e(v[j][c]) over the nonzero products), a zero or subnormal
// accumulator at -126, E4M3 field exponents. Finite operands only. Bit-identical to mma_dot of the preset on the same
// operands (tests/unit/sage2_test.cc), vectorised over c.
void tcgen05_e4m3_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                       std::size_t stride, std::size_t cols);
// One fused step of Ada's FP8 mma.sync (MMA-Sim's models, not measured here: ada-mma-e4m3, or with f16_accumulator
// ada-mma-e4m3-acc16, which no vectors validate) for `cols` outputs at once, in the layout of wgmma_e4m3_step, n <= 16
// products (one instruction of 32 keys is two steps; a step of n = 0 still rounds the accumulator):
//   acc[c] <- RZ_14( trunc(acc[c]) + sum_j trunc(p[j] v[j][c]) )  or  RNE_binary16( ... ),
//   every term truncated at 2^(E_c - 13), E_c = max(e(acc[c]), e(p[j]) + e(v[j][c]) over the nonzero products), the
//   accumulator's exponent its field's (at least -126, or -14 for binary16), E4M3 field exponents.
// Bit-identical to mma_dot of the preset on the step's codes (tests/unit/sage2_test.cc), vectorised over c; the rare
// columns outside the vectorised range (no nonzero product, an accumulator near float32's top or not finite) take
// mma_dot itself.
void ada_e4m3_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                   std::size_t stride, std::size_t cols, bool f16_accumulator);
// One step of a block-scaled FP4 model with groups (b200-mxf4, b200-nvf4: MMA-Sim's model, not measured here) for
// `cols` outputs at once, its terms formed by the caller: term[g * stride + c] is group g's exact sum of products
// times its two block scales, term_exponent[g * stride + c] the sum of the two scales' exponents (floor(log2)), or
// -126 where a scale is zero (the field_zero_low rule). acc[c] <- RZ_24(trunc(acc) + sum_g trunc(term)), every
// value truncated at 2^(E_c - 35), E_c = max(e(acc[c]), the group exponents), a zero or subnormal accumulator at
// -126. Finite values only. Bit-identical to mma_dot of the preset on the operands the terms come from
// (tests/unit/sage3_test.cc), vectorised over c.
void scaled_group_step(float* acc, const double* term, const std::int32_t* term_exponent, std::size_t groups,
                       std::size_t stride, std::size_t cols);
// E4M3 operands held one byte per code (a prepared call's K8 or V8, O(L d) bytes) and decoded into the float values
// and field exponents wgmma_e4m3_step reads: `count` codes from `codes` to `value` and `exponent`. The code of a
// value is lowp_encode(value, fp8_e4m3fn()), signed zeros included; the NaN codes decode to NaN, exponent -6.
void e4m3_decode(const std::uint8_t* codes, std::size_t count, float* value, std::int8_t* exponent);

// One fused step of the H100's HMMA.16816.F16 (h100-hmma-f16-acc16) for `cols` outputs at once:
//   acc[c] <- RNE_binary16( trunc(acc[c]) + sum_j trunc(p[j] v[j][c]) ), every term truncated at 2^(E_c - 25),
//   E_c = max(e(acc[c]), max_j e(p[j]) + e(v[j][c])) with leading-bit exponents; a zero operand or accumulator has
//   no exponent (when no term has one, acc[c] stays as it is).
// p holds n <= 16 binary16 values, v n rows of `cols` binary16 values (row stride `stride`), v_exponent their
// exponents floor(log2|v|) (zero: -128) in the same layout; acc holds binary16 values. A sum beyond binary16's
// range gives +-inf, and a non-finite acc[c] stays non-finite (IEEE). Bit-identical to mma_dot of the preset on the
// same operands (tests/unit/tensor_core_pipelines_test.cc), vectorised over c.
// A binary16 value's exponent as hmma_f16_acc16_step reads it: floor(log2|x|), zero at -128 (no exponent).
std::int8_t hmma_f16_exponent(float x);
void hmma_f16_acc16_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                         std::size_t stride, std::size_t cols);

}  // namespace qattn::ref
