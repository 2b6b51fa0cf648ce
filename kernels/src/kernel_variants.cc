#include "qattn/kernel_variants.h"

#include <stdexcept>
#include <string>

namespace qattn::kernels {
namespace {

// A kernel and the name reports print: .qk = qk_s8s8_s32__scalar, .qk_name = "qk_s8s8_s32__scalar". A row names
// every part it fills; one it leaves out (the row-maximum pair where an ISA has none) is empty and null.
#define QATTN_KERNEL(part, f) .part##_name = #f, .part = f

constexpr KernelVariant kVariants[] = {
    {.isa = Isa::scalar,
     QATTN_KERNEL(qk, qk_s8s8_s32__scalar),
     QATTN_KERNEL(pv, pv_u8s8_s32__scalar),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__scalar),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__scalar),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__scalar),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__scalar),
     QATTN_KERNEL(mac_loop, mac_loop__scalar)},
#if defined(QATTN_HAVE_X86_KERNELS)
    {.isa = Isa::avx2,
     QATTN_KERNEL(qk, qk_s8s8_s32__avx2_6x16),
     QATTN_KERNEL(pv, pv_u8s8_s32__avx2_6x16),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__avx2),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__avx2),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__avx2),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__scalar),
     QATTN_KERNEL(mac_loop, mac_loop__avx2)},
    {.isa = Isa::avxvnni,
     QATTN_KERNEL(qk, qk_s8s8_s32__avxvnni_6x16),
     QATTN_KERNEL(pv, pv_u8s8_s32__avxvnni_6x16),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__avx2),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__avx2),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__avx2),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__scalar),
     QATTN_KERNEL(mac_loop, mac_loop__avxvnni)},
    {.isa = Isa::avx512vnni,
     QATTN_KERNEL(qk, qk_s8s8_s32__avx512vnni_8x48),
     QATTN_KERNEL(pv, pv_u8s8_s32__avx512vnni_8x48),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__avx512),
     .qk_row_max = true,
     QATTN_KERNEL(softmax_given_max, index_softmax_max_s32_u8__avx512),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__avx512),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__avx512),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__avx512),
     QATTN_KERNEL(mac_loop, mac_loop__avx512vnni)},
    // AMX tiles for the two GEMMs; the rows between them and the dequantisation are the AVX-512 ones.
    {.isa = Isa::amx,
     QATTN_KERNEL(qk, qk_s8s8_s32__amx_32x32),
     QATTN_KERNEL(pv, pv_u8s8_s32__amx_32x32),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__avx512),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__avx512),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__avx512),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__avx512),
     QATTN_KERNEL(mac_loop, mac_loop__amx),
     .key_stride_multiple = 64,
     .block_rows = 64,
     .s_rows = 16},
#endif
#if defined(QATTN_HAVE_ARM_KERNELS)
    {.isa = Isa::neon_dotprod,
     QATTN_KERNEL(qk, qk_s8s8_s32__neon_dotprod_4x16),
     QATTN_KERNEL(pv, pv_u8s8_s32__neon_dotprod_4x16),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__neon),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__neon),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__scalar),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__scalar),
     QATTN_KERNEL(mac_loop, mac_loop__neon_dotprod)},
    {.isa = Isa::neon_i8mm,
     QATTN_KERNEL(qk, qk_s8s8_s32__neon_dotprod_4x16),
     QATTN_KERNEL(pv, pv_u8s8_s32__neon_i8mm_4x16),
     QATTN_KERNEL(softmax, index_softmax_s32_u8__neon),
     QATTN_KERNEL(index_exp, index_exp_s32_u8__neon),
     QATTN_KERNEL(softmax_f32, softmax_s32_f32_u8__scalar),
     QATTN_KERNEL(dequantise, dequantise_s32_f32__scalar),
     QATTN_KERNEL(mac_loop, mac_loop__neon_i8mm)},
#endif
};

#undef QATTN_KERNEL

}  // namespace

std::span<const KernelVariant> kernel_variants() { return kVariants; }

const KernelVariant& kernel_variant(Isa isa) {
  for (const KernelVariant& v : kVariants)
    if (v.isa == isa) return v;
  throw std::invalid_argument("int_attention: ISA " + std::string(isa_name(isa)) + " is not in this build");
}

}  // namespace qattn::kernels
