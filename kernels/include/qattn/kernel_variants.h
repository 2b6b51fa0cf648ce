// The one table of kernel variants (kernel_variants.cc). A row is everything an ISA runs: its two GEMMs, its
// IndexSoftmax and float softmax rows, and the MAC-rate loop of its GEMM instruction, each with the name reports
// print. The dispatcher (pipeline.cc), the peak loop (isa.cc), the testers (tests/kernels/) and `qattn bench` all
// read this table, so a variant added here is dispatched, tested and benchmarked; its source file gets its ISA flags
// from its name's suffix (CMakeLists.txt).
#pragma once

#include <span>
#include <string_view>

#include "qattn/int_attention.h"
#include "qattn/kernels.h"

namespace qattn::kernels {

// Each part's kernel beside the name reports print; a row (kernel_variants.cc) fills its parts by designated
// initialisers, and a part an ISA has no kernel for is left empty and null.
struct KernelVariant {
  Isa isa = Isa::scalar;
  std::string_view qk_name;
  GemmKernel qk = nullptr;
  std::string_view pv_name;
  GemmKernel pv = nullptr;
  std::string_view softmax_name;  // IndexSoftmax row
  SoftmaxKernel softmax = nullptr;
  // The pair that moves the row maximum into Q.K^T's epilogue: qk fills GemmArgs::row_max, and the row kernel takes
  // the maximum; both or neither (false and null where the ISA has no such pair).
  bool qk_row_max = false;
  std::string_view softmax_given_max_name;
  SoftmaxGivenMaxKernel softmax_given_max = nullptr;
  std::string_view index_exp_name;  // IndexSoftmax steps (2)-(5) of one key block (group-wise clipping)
  IndexExpKernel index_exp = nullptr;
  std::string_view softmax_f32_name;  // Quant-Only's float softmax row
  SoftmaxF32Kernel softmax_f32 = nullptr;
  std::string_view dequantise_name;  // O = acc * out_scale / p_scale, in double, to float
  DequantiseKernel dequantise = nullptr;
  std::string_view mac_loop_name;  // the GEMMs' multiply-accumulate instruction, register-only
  MacLoop mac_loop = nullptr;
  // The multiple the fused driver rounds L_k up to for the row stride of packed K^T, S and P (pipeline.cc): 16, or
  // 64 where the P.V kernel reads P in 64-byte rows (AMX tiles), so that every row of P starts on a cache line.
  int key_stride_multiple = 16;
  // Query rows per block where the call leaves IntAttentionConfig::block_rows at 0: 0 for the rule from L_k (64, or
  // fewer where a block of S would pass 2 MiB), or a number of rows this variant runs best at (docs/kernels.md).
  Index block_rows = 0;
  // Rows of S per Q.K^T call within a block where the call leaves IntAttentionConfig::s_rows at 0 (0: the whole
  // block): S stays small while each tile of V that P.V loads serves every row of the block.
  Index s_rows = 0;
};

// Every variant compiled into this build, one per ISA, scalar first and then in order of preference; isa_available
// says which of them this CPU runs.
std::span<const KernelVariant> kernel_variants();
// The row of `isa`; std::invalid_argument if this build has none.
const KernelVariant& kernel_variant(Isa isa);

}  // namespace qattn::kernels
