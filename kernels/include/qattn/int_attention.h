// The fast IntAttention pipeline (docs/kernels.md): a fused row-block dataflow, INT8 in, float32 out, with no
// dequantise -> softmax -> requantise detour. Per block of B_r query rows:
//   (1) S = Q_blk K^T                  s8 x s8 -> s32, exact (|S| <= 127^2 d)
//   (2) P = IndexSoftmax(S) per row    u8 (x255) or s8-format (x127) P, every IndexSoftmaxParams choice
//   (3) O_blk = P V                    u8 x s8 -> s32, exact (|O| <= 127 sum_j P_j, far inside int32)
//   (4) O = fl32(O_int * s_V / s_P)    the product and quotient in double, one rounding to float32
// Memory is O(min(B_r, L_q) L_k) per thread. Rows are independent, so every thread count gives the same bits. Every
// ISA variant is bit-exact to the scalar spec, and the scalar spec to the reference model (reference/int_pipelines.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qattn/index_softmax_params.h"
#include "qattn/key_groups.h"
#include "qattn/tensor.h"

namespace qattn {

// Instruction-set variants of the kernels. Only those the build and the CPU have can run.
// New values go last, so that the numbers of the others do not change.
enum class Isa { scalar, avx2, avxvnni, avx512vnni, neon_dotprod, neon_i8mm, amx };

std::string_view isa_name(Isa isa);
// Parses "scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "amx", "neon-dotprod", "neon-i8mm"; throws
// std::invalid_argument.
Isa parse_isa(std::string_view name);
// Compiled into this build and supported by this CPU (cpuid on x86, getauxval(AT_HWCAP) on Arm). amx also needs the
// AVX-512 VNNI variant's features (its rows use them), the OS's tile state (XCR0 bits 17-18) and the kernel's
// permission, requested once per process (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) by the first call
// that asks about amx (this one, available_isas(), default_isa()): from then on the process may use the tiles, and
// Linux saves their 8 KiB of state in every thread's signal frame (a sigaltstack must be at least that much larger).
bool isa_available(Isa isa);
// Every available variant, scalar first.
std::vector<Isa> available_isas();
// Their names, comma-separated ("scalar, avx2, avx512vnni"), for messages.
std::string available_isa_names();
// The variant calls use by default: QATTN_ISA if set (std::runtime_error naming the variable if the CPU or build
// lacks it, or the name is unknown), else the best available.
Isa default_isa();

// An INT8 matrix [rows, cols] row-major with its scale: x ~= scale * values.
struct Int8View {
  const std::int8_t* values = nullptr;
  Eigen::Index rows = 0, cols = 0;
  double scale = 1;
};

// Which softmax sits between the two integer GEMMs: IndexSoftmax (IntAttention, P x255 or x127), or Quant-Only's
// dequantise -> float softmax (qattn/exp_f32.h) -> requantise to P8 = rne(127 p), O = fl32(O_int s_V / 127).
enum class IntPipeline { intattention, quant_only };

// The largest head dimension of a call with key blocks: the anchor minus the integer logit, up to d 127^2 + c_int
// with c_int <= 2^30, stays below 2^31 (33000 127^2 + 2^30 = 1.61e9).
inline constexpr Eigen::Index kMaxKeyBlockHeadDim = 33000;

struct IntAttentionConfig {
  IntPipeline pipeline = IntPipeline::intattention;
  IndexSoftmaxParams softmax;  // intattention only
  std::int64_t c_int = 0;     // 0: c_int = cint_from_alpha(c, sQ sK scale, cint_rounding), in double
  // Group-wise clipping over blocks of key_block keys (qattn/key_groups.h, IntAttention Eq. 16-18), intattention only:
  // K's codes quantised per block, block j with its clip key_c_int[j] (Eq. 16 for this call's s_Q) and its scale
  // ratio key_ratio[j]; group_offset_scale is kappa of the offset reading. key_block = 0: one clip per call.
  // Requires d <= kMaxKeyBlockHeadDim.
  Eigen::Index key_block = 0;
  std::vector<std::int64_t> key_c_int, key_ratio;
  GroupMax group_max = GroupMax::global;
  double group_offset_scale = 0;
  // Query rows per block, each thread's unit of work; 0 chooses: the ISA variant's own number where it has one (64 for
  // amx), else from L_k: 64, or fewer (a multiple of 8, at least 16) where 64 rows of S would pass 2 MiB (L_k above
  // 8192; 32 at 16384). docs/kernels.md says why.
  Eigen::Index block_rows = 0;
  // Rows of S per Q.K^T call within a block: the block's rows pass through Q.K^T and the softmax in slices of this
  // many, and P.V runs once on the whole block's P (S stays small while each tile of V serves every row of the
  // block). 0 chooses: the variant's own (16 for amx), else the whole block. Any value gives the same bits.
  Eigen::Index s_rows = 0;
  int threads = 1;
  Isa isa = Isa::scalar;      // use default_isa() to pick the best
  bool causal = false;        // bottom-right aligned: query i sees keys j <= i + L_k - L_q
  const bool* valid = nullptr;  // optional padding mask [L_q, L_k] row-major (true = visible), combined with causal
  // Optional: P [L_q, L_k] row-major as IndexSoftmax wrote it (u8 codes 0..255 for x255, 0..127 for x127 and for
  // Quant-Only), copied out of each block. O(L_q L_k) bytes: leave null unless P itself is wanted.
  std::uint8_t* p_out = nullptr;
  // For benchmarks, the stages that run: all; gemms (both GEMMs, no softmax: P stays 0); qk or pv (that GEMM alone;
  // O is not written when P V does not run).
  enum class Stages { all, gemms, qk, pv };
  Stages stages = Stages::all;
  // true: the materialised (ACL-style) dataflow: the full S [L_q, L_k], then every softmax row, then P V, as three
  // separate passes (each spread over threads). Same integers as the fused one; memory O(L_q L_k).
  bool materialise = false;
};

// Names of the kernels a call with this ISA runs, for reports ("qk_s8s8_s32__avx512vnni_8x48", ...).
struct IntAttentionKernels {
  std::string qk, softmax, pv;
  std::string softmax_row;  // the whole row kernel, maximum pass included: what int_attention_softmax_rows times
};
// With key_groups (IntAttentionConfig::key_block > 0) the softmax is the per-key-block kernel and the shared
// normalisation ("index_exp_s32_u8__avx512 per key block + index_normalise_u8"). Where the ISA moves the row maximum
// into Q.K^T's epilogue, the softmax names the row kernel that takes it, and the one rows with a padding mask run.
IntAttentionKernels int_attention_kernels(Isa isa, IntPipeline pipeline = IntPipeline::intattention,
                                          bool key_groups = false);

// The query rows per block int_attention_fused uses for L_k keys under cfg: cfg.block_rows, or where that is 0 the
// variant's own (amx: 64) or the choice from L_k (64, fewer where 64 rows of S would pass 2 MiB). Throws
// std::invalid_argument for an ISA this build lacks.
Eigen::Index int_attention_block_rows(const IntAttentionConfig& cfg, Eigen::Index lk);

// The softmax row kernel the fused pipeline runs between its GEMMs, alone, over `rows` rows of S [rows, keys]
// (int32, row-major, every key visible), writing P [rows, keys] (u8): IndexSoftmax with `softmax` and c_int for
// intattention, the float softmax of S alpha for quant_only. For benchmarks of the row kernels; S is not modified.
void int_attention_softmax_rows(Isa isa, IntPipeline pipeline, const IndexSoftmaxParams& softmax, std::int64_t c_int,
                                float alpha, const std::int32_t* s, Eigen::Index rows, Eigen::Index keys,
                                std::uint8_t* p);

// The int8 multiply-accumulate peak of one core with the instruction the ISA's GEMMs use (vpdpbusd, vpmaddwd, sdot,
// usdot): `iterations` rounds over 12 independent accumulators. Returns the MACs done (the caller times it) and
// writes a checksum so the loop cannot be removed. Throws std::invalid_argument for an ISA without a loop here.
std::int64_t int8_mac_peak_loop(Isa isa, std::int64_t iterations, std::int32_t* checksum);

// O [L_q, d_v] row-major float32. Throws std::invalid_argument on shapes that do not fit, an ISA that is not
// available, or parameters outside their documented ranges.
void int_attention_fused(const Int8View& q, const Int8View& k, const Int8View& v, double scale,
                         const IntAttentionConfig& config, float* o);

// The float entry point: per-tensor symmetric INT8 of Q, K and V (s = max|x| / 127, 1 for an all-zero tensor,
// round half to even, clamp +-127), then int_attention_fused. Returns O [L_q, d_v].
RowMatrixXd int_attention_fused(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const IntAttentionConfig& config);

}  // namespace qattn
