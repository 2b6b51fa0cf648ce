// Kernel families of the fused IntAttention pipeline (qattn::kernels: the building blocks under int_attention.h).
// docs/kernels.md describes the packed layouts and the overflow bounds; every variant of a family computes the same
// integers as its scalar spec. Private to the kernels target (and its tests): not installed. The variants are listed
// once, in qattn/kernel_variants.h.
//
// Both GEMMs have one shape, C[i][n] = sum_k A[i][k] B[k][n], with B packed in groups of 4 along k:
//   B_packed[(k / 4) * N * 4 + n * 4 + k % 4],   N a multiple of 16, K a multiple of 4, zero padding
// and A row-major [rows, K]. B_sum[n] = sum_k B[k][n] serves the +-128 offset tricks:
//   qk_s8s8_s32: A = Q (s8), B = K^T (s8). VNNI's vpdpbusd is u8 x s8: it computes sum (a + 128) b and subtracts
//                128 B_sum[n]. NEON sdot is s8 x s8: native.
//   pv_u8s8_s32: A = P (u8), B = V (s8). vpdpbusd and usdot/sudot are native. NEON sdot computes sum (a - 128) b and
//                adds 128 B_sum[n].
// AVX2 widens both operands to s16 and uses vpmaddwd (exact pairs), never vpmaddubsw (its s16 pair sum saturates:
// 255 * 127 * 2 > 32767).
#pragma once

#include <cstddef>
#include <cstdint>

#include "qattn/index_softmax_params.h"

// No Eigen here: the ISA files include this header under -mavx2 / -mavx512* / -march=armv8.2-a+..., and inline
// Eigen code compiled with those flags could be picked by the linker for the baseline build (an ODR hazard).
namespace qattn::kernels {

using Index = std::ptrdiff_t;  // same type as Index

struct GemmArgs {
  const void* a = nullptr;  // [rows, k] row-major, std::int8_t (qk) or std::uint8_t (pv)
  Index rows = 0, k = 0;
  const std::int8_t* b_packed = nullptr;
  const std::int32_t* b_sum = nullptr;
  Index n = 0;       // multiple of 16
  std::int32_t* c = nullptr;  // [rows, n] row-major
  // Q.K^T, optional, where the variant table says the variant fills it (qk_row_max): each row's maximum of C over
  // its visible columns j < limit(r) = clamp(visible + r * visible_step, 0, visible_cap), as 16 lanes per row
  // (row_max[16 r + lane]; the row's maximum is the lanes' maximum; INT32_MIN where nothing is visible).
  std::int32_t* row_max = nullptr;
  Index visible = 0, visible_step = 0, visible_cap = 0;
  Index limit(Index r) const {
    const Index x = visible + r * visible_step;
    return x < 0 ? 0 : x > visible_cap ? visible_cap : x;
  }
};
using GemmKernel = void (*)(const GemmArgs&);

void qk_s8s8_s32__scalar(const GemmArgs& args);
void pv_u8s8_s32__scalar(const GemmArgs& args);
#if defined(QATTN_HAVE_X86_KERNELS)
void qk_s8s8_s32__avx2_6x16(const GemmArgs& args);
void pv_u8s8_s32__avx2_6x16(const GemmArgs& args);
void qk_s8s8_s32__avxvnni_6x16(const GemmArgs& args);
void pv_u8s8_s32__avxvnni_6x16(const GemmArgs& args);
void qk_s8s8_s32__avx512vnni_8x48(const GemmArgs& args);
void pv_u8s8_s32__avx512vnni_8x48(const GemmArgs& args);
// AMX tiles (gemm_amx.cc): qk by tdpbssd (s8 x s8, B_sum not read), pv by tdpbusd; blocks of 32 x 32.
void qk_s8s8_s32__amx_32x32(const GemmArgs& args);
void pv_u8s8_s32__amx_32x32(const GemmArgs& args);
#endif
#if defined(QATTN_HAVE_ARM_KERNELS)
void qk_s8s8_s32__neon_dotprod_4x16(const GemmArgs& args);
void pv_u8s8_s32__neon_dotprod_4x16(const GemmArgs& args);
void pv_u8s8_s32__neon_i8mm_4x16(const GemmArgs& args);
#endif

// Quant-Only's float softmax of one row of S, requantised: x_j = fl32(S_j) * alpha for visible j < limit (the rest
// -inf), p = softmax_row_lanes16(x) (qattn/exp_f32.h), P8_j = rne(fl32(127 p_j)) in [0, 127]. `scratch` holds
// `keys` floats.
using SoftmaxF32Kernel = void (*)(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                                  float* scratch, std::uint8_t* p);
void softmax_s32_f32_u8__scalar(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                                float* scratch, std::uint8_t* p);
#if defined(QATTN_HAVE_X86_KERNELS)
void softmax_s32_f32_u8__avx2(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                              float* scratch, std::uint8_t* p);
void softmax_s32_f32_u8__avx512(const std::int32_t* s, const bool* valid, Index limit, Index keys, float alpha,
                                float* scratch, std::uint8_t* p);
#endif

// The MAC-rate loops behind int8_mac_peak_loop: register-only inline assembly of the GEMMs' instruction,
// `iterations` rounds; return the MACs.
using MacLoop = std::int64_t (*)(std::int64_t iterations, std::int32_t* checksum);
std::int64_t mac_loop__scalar(std::int64_t iterations, std::int32_t* checksum);
#if defined(QATTN_HAVE_X86_KERNELS)
std::int64_t mac_loop__avx2(std::int64_t iterations, std::int32_t* checksum);
std::int64_t mac_loop__avxvnni(std::int64_t iterations, std::int32_t* checksum);
std::int64_t mac_loop__avx512vnni(std::int64_t iterations, std::int32_t* checksum);
std::int64_t mac_loop__amx(std::int64_t iterations, std::int32_t* checksum);
#endif
#if defined(QATTN_HAVE_ARM_KERNELS)
std::int64_t mac_loop__neon_dotprod(std::int64_t iterations, std::int32_t* checksum);
std::int64_t mac_loop__neon_i8mm(std::int64_t iterations, std::int32_t* checksum);
#endif

// Packs B [k, n] given as rows of the source: for qk the source is K [n_src, k_src] (B = K^T), for pv it is
// V [k_src, n_src] (B = V). Pads k to a multiple of 4 and n to a multiple of 16 with zeros; fills b_sum.
void pack_k_transposed(const std::int8_t* k, Index keys, Index d, Index d4, Index keys16,
                       std::int8_t* packed, std::int32_t* sum);
void pack_v(const std::int8_t* v, Index keys, Index dv, Index keys4, Index dv16,
            std::int8_t* packed, std::int32_t* sum);
// The same in parts that may run on different threads, each writing only its own bytes and sums: the padding
// (keys past `keys`, groups past the last key) once, and any ranges [begin, end) of keys that together cover
// [0, keys). pack_k_keys sets sum[begin, end); pack_v_keys needs begin a multiple of 4 (and end too, unless it is
// `keys`) and adds its keys' column sums to sum[0, dv) (the caller zeroes sum[0, dv16)), so that ranges on
// different threads sum into buffers of their own.
void pack_k_padding(Index keys, Index d4, Index keys16, std::int8_t* packed, std::int32_t* sum);
void pack_k_keys(const std::int8_t* k, Index begin, Index end, Index d, Index keys16, std::int8_t* packed,
                 std::int32_t* sum);
void pack_v_padding(Index keys, Index keys4, Index dv16, std::int8_t* packed);
void pack_v_keys(const std::int8_t* v, Index begin, Index end, Index dv, Index dv16, std::int8_t* packed,
                 std::int32_t* sum);

// IndexSoftmax of one row of S (length `keys`, only entries j < limit with valid[j] (or all if valid is null) take
// part). Writes P into p[0, keys); the caller zero-pads beyond.
struct IndexSoftmaxTables {
  IndexSoftmaxParams params;
  std::int64_t c_int = 1;
  std::int64_t q26 = 0;          // floor((2^b - 1) 2^26 / c_int + 1/2) for the Q26 index rules
  std::uint8_t lut[256] = {};
  static IndexSoftmaxTables make(const IndexSoftmaxParams& params, std::int64_t c_int);
};
// The index rule of t.params on one clipped distance 0 <= delta <= c_int (steps 3 of the spec), before the clamp
// to [0, 2^b - 1]. Out of line on purpose: the ISA files call it for row tails.
std::int64_t index_softmax_index(std::int64_t delta, const IndexSoftmaxTables& t);
void index_softmax_s32_u8__scalar(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                  const IndexSoftmaxTables& t, std::uint8_t* p);
// The row kernels' type: every variant keeps its indices or E (<= 255) in p's bytes between the sum and the
// normalisation, so none needs a scratch row.
using SoftmaxKernel = void (*)(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                               const IndexSoftmaxTables& t, std::uint8_t* p);
// The row kernel given the row's maximum m over its entries j < limit (GemmArgs::row_max), with no padding mask: the
// same P as the row kernel, without its first pass.
using SoftmaxGivenMaxKernel = void (*)(const std::int32_t* s, Index limit, Index keys, const IndexSoftmaxTables& t,
                                       std::int32_t m, std::uint8_t* p);
#if defined(QATTN_HAVE_X86_KERNELS)
void index_softmax_max_s32_u8__avx512(const std::int32_t* s, Index limit, Index keys, const IndexSoftmaxTables& t,
                                      std::int32_t m, std::uint8_t* p);
void index_softmax_s32_u8__avx2(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                const IndexSoftmaxTables& t, std::uint8_t* p);
void index_softmax_s32_u8__avx512(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                  const IndexSoftmaxTables& t, std::uint8_t* p);
#endif
#if defined(QATTN_HAVE_ARM_KERNELS)
void index_softmax_s32_u8__neon(const std::int32_t* s, const bool* valid, Index limit, Index keys,
                                const IndexSoftmaxTables& t, std::uint8_t* p);
#endif

// O from the P.V accumulators, the reference model's rounding: o[i, c] = fl32(fl64(fl64(acc[i, c]) * out_scale) /
// p_scale) for rows [0, rows) and columns [0, cols) (acc rows acc_stride apart, o rows o_stride apart). Three roundings
// to nearest, in this order; a vector variant does the same three per lane (cvtdq2pd is exact).
using DequantiseKernel = void (*)(const std::int32_t* acc, Index rows, Index cols, Index acc_stride, double out_scale,
                                  int p_scale, float* o, Index o_stride);
void dequantise_s32_f32__scalar(const std::int32_t* acc, Index rows, Index cols, Index acc_stride, double out_scale,
                                int p_scale, float* o, Index o_stride);
#if defined(QATTN_HAVE_X86_KERNELS)
void dequantise_s32_f32__avx512(const std::int32_t* acc, Index rows, Index cols, Index acc_stride, double out_scale,
                                int p_scale, float* o, Index o_stride);
#endif

// Group-wise clipping (qattn/key_groups.h, IntAttention Eq. 16-18): a row's key blocks run steps (2)-(5) one block at
// a time against an anchor the caller derives from the row's maximum, then one normalisation over the row.
// index_exp: E_j = LUT[clamp(index_rule(min(anchor - s_j, c_int)), 0, 2^b - 1)] for the n entries of one block into
// e[0, n) as bytes (0 where `valid` is false), and returns sum E. Requires anchor >= every visible s_j and
// anchor - s_j < 2^31. The offset reading passes a table whose LUT is shifted by the block's offset.
using IndexExpKernel = std::int64_t (*)(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                        const IndexSoftmaxTables& t, std::uint8_t* e);
std::int64_t index_exp_s32_u8__scalar(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                      const IndexSoftmaxTables& t, std::uint8_t* e);
#if defined(QATTN_HAVE_X86_KERNELS)
std::int64_t index_exp_s32_u8__avx2(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                    const IndexSoftmaxTables& t, std::uint8_t* e);
std::int64_t index_exp_s32_u8__avx512(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                      const IndexSoftmaxTables& t, std::uint8_t* e);
#endif
#if defined(QATTN_HAVE_ARM_KERNELS)
std::int64_t index_exp_s32_u8__neon(const std::int32_t* s, const bool* valid, Index n, std::int32_t anchor,
                                    const IndexSoftmaxTables& t, std::uint8_t* e);
#endif
// Step (6) on a row whose E (bytes) fill p[0, n), in place, with S = sum E >= 1: the scalar spec's normalisation
// (FloorDivider16 for floor). Every ISA's group-wise rows use this one.
void index_normalise_u8(std::uint8_t* p, Index n, std::int64_t sum, const IndexSoftmaxParams& params);

}  // namespace qattn::kernels
