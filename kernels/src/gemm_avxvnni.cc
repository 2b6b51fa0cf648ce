// AVX-VNNI variants of the GEMM families: the VEX-encoded 256-bit vpdpbusd (u8 x s8, four products summed into each
// s32 lane) of CPUs that have it without AVX-512 (Intel Alder Lake and later client cores, Sierra Forest) and of those
// that have both (Zen 5, Sapphire Rapids). Tiles of 6 rows x 16 columns: 12 ymm accumulators, 2 for the B vectors of
// one group of 4 k, 1 for the broadcast A group, 15 of the 16 ymm registers AVX2 has; 4-, 2- and 1-row tiles take the
// rows left over. The packed B (pack.cc) holds each group of 4 k for 16 columns in 64 bytes, two ymm loads.
// qk: A = Q is s8; a ^ 0x80 = a + 128 as u8 (biased once per call into a per-thread copy), and the lanes start from
// -128 B_sum[n] and add sum (a + 128) b: wrapping adds of the same terms as S, which fits int32 (docs/kernels.md,
// overflow bounds). pv: A = P is u8, native. Partial sums wait in C between k blocks, as in gemm_avx512vnni.cc.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "qattn/kernels.h"
#include "qattn/mac_loop_frame.h"
#include "qattn/thread_buffer.h"
#include "qattn/ymm_tile_asm.h"

namespace qattn::kernels {
namespace {

// k blocks of 256: a B panel of 16 columns is then 4 KiB and stays in L1 while every row passes over it.
constexpr Index kKc = 256;

// The k loop of an R x 16 tile (R = 6, 4, 2 or 1) in inline assembly (registers and rows: qattn/ymm_tile_asm.h): the
// two B vectors of a group of 4 k in ymm0 and ymm1, the A group broadcast from memory into ymm2. The accumulators
// start from `init` (rows ldi bytes apart: 0 repeats one row, Q.K^T's bias row or zeros) and end in `out` (rows ldo
// bytes apart: C), so neither the bias nor C's partial sums need a pass of their own. Written by hand
// because GCC 12 compiles the intrinsics loop of the 6-row tile with a register copy and a stack store of most
// accumulators on every step; tests/kernels/peak_loop_codegen.py checks it.
#define QATTN_STEP(r)                                                                                   \
  "vpbroadcastd " QATTN_A_ROW(r) ", %%ymm2\n\t"                                                          \
  "%{vex%} vpdpbusd %%ymm0, %%ymm2, " QATTN_ACC(r, 0) "\n\t"                                            \
  "%{vex%} vpdpbusd %%ymm1, %%ymm2, " QATTN_ACC(r, 1) "\n\t"
#define QATTN_FIRST(r) "vmovdqu (%[init]), " QATTN_ACC(r, 0) "\n\t" \
                       "vmovdqu 32(%[init]), " QATTN_ACC(r, 1) "\n\t" \
                       "add %[ldi], %[init]\n\t"
#define QATTN_STORE(r) "vmovdqu " QATTN_ACC(r, 0) ", (%[out])\n\t" \
                       "vmovdqu " QATTN_ACC(r, 1) ", 32(%[out])\n\t" \
                       "add %[ldo], %[out]\n\t"
#define QATTN_LOOP(FIRSTS, STEPS, STORES) QATTN_YMM_TILE_LOOP("vmovdqu", "%[bs]", FIRSTS, STEPS, STORES)
#define QATTN_OPERANDS                                                                                  \
  : [a0] "+r"(a0), [a3] "+r"(a3), [b] "+r"(b), [n] "+r"(steps), [init] "+r"(init), [out] "+r"(out)     \
  : [lda] "r"(lda), [bs] "r"(bs), [ldi] "r"(ldi), [ldo] "r"(ldo)                                         \
  : "xmm0", "xmm1", "xmm2", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
    "xmm14", "xmm15", "cc", "memory"

template <int R>
inline void k_loop(const std::uint8_t* a0, Index lda, const std::int8_t* b, Index bs, Index steps,
                   const std::int32_t* init, Index ldi, std::int32_t* out, Index ldo) {
  const std::uint8_t* a3 = a0 + 3 * lda;  // only dereferenced by the 4- and 6-row loops
  QATTN_TILE_ASM_FOR_R
}
#undef QATTN_OPERANDS
#undef QATTN_LOOP
#undef QATTN_STORE
#undef QATTN_FIRST
#undef QATTN_STEP

// One R x 16 tile of C over k in [k0, k0 + kc), from `init_row` (Q.K^T's bias row; null: zeros) on the first k block
// and from C's partial sums on the others (integer adds wrap, so the order does not change C).
template <int R>
inline void tile(const GemmArgs& g, const std::int32_t* init_row, Index i0, Index n0, Index k0, Index kc, bool first) {
  alignas(32) static constexpr std::int32_t kZeros[16] = {};
  std::int32_t* c = g.c + i0 * g.n + n0;
  const Index ldc = g.n * static_cast<Index>(sizeof(std::int32_t));
  const std::int32_t* init = first ? (init_row ? init_row + n0 : kZeros) : c;
  if (kc < 4) {  // k = 0: C is its first values (the loop runs at least once)
    for (int r = 0; r < R; ++r) std::memcpy(c + r * g.n, init, sizeof kZeros);
    return;
  }
  k_loop<R>(static_cast<const std::uint8_t*>(g.a) + i0 * g.k + k0, g.k, g.b_packed + (k0 / 4) * g.n * 4 + n0 * 4,
            g.n * 4, kc / 4, init, first ? 0 : ldc, c, ldc);
}

// k blocks, then 16-column panels, then rows.
void gemm_blocks(const GemmArgs& g, const std::int32_t* init_row) {
  for (Index k0 = 0; k0 < g.k || k0 == 0; k0 += kKc) {
    const Index kc = std::min(kKc, g.k - k0);
    const bool first = k0 == 0;
    for (Index n0 = 0; n0 < g.n; n0 += 16) {  // n is a multiple of 16
      Index i0 = 0;
      for (; i0 + 6 <= g.rows; i0 += 6) tile<6>(g, init_row, i0, n0, k0, kc, first);
      for (; i0 + 4 <= g.rows; i0 += 4) tile<4>(g, init_row, i0, n0, k0, kc, first);
      for (; i0 + 2 <= g.rows; i0 += 2) tile<2>(g, init_row, i0, n0, k0, kc, first);
      for (; i0 < g.rows; ++i0) tile<1>(g, init_row, i0, n0, k0, kc, first);
    }
    if (g.k == 0) break;
  }
}

void qk_gemm(const GemmArgs& g) {
  static thread_local ThreadBuffer copy, bias;  // grow to the largest Q block and n this thread has seen
  const Index n = g.rows * g.k;
  std::uint8_t* biased = copy.reserve(n);
  const std::uint8_t* a = static_cast<const std::uint8_t*>(g.a);
  Index i = 0;
  for (; i + 32 <= n; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(biased + i),
                        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)),
                                         _mm256_set1_epi8(static_cast<char>(0x80))));
  for (; i < n; ++i) biased[i] = a[i] ^ 0x80;
  // C's first values, -128 B_sum[n]: the bias of sum (a + 128) b.
  std::int32_t* init_row = reinterpret_cast<std::int32_t*>(bias.reserve(g.n * Index{sizeof(std::int32_t)}));
  for (Index j = 0; j < g.n; j += 8)  // n is a multiple of 16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(init_row + j),
                        _mm256_sub_epi32(_mm256_setzero_si256(),
                                         _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.b_sum + j)), 7)));
  GemmArgs h = g;
  h.a = biased;
  gemm_blocks(h, init_row);
}

}  // namespace

void qk_s8s8_s32__avxvnni_6x16(const GemmArgs& args) { qk_gemm(args); }
void pv_u8s8_s32__avxvnni_6x16(const GemmArgs& args) { gemm_blocks(args, nullptr); }

// Register-only inline assembly, so that no compiler can spill an accumulator or hoist an instruction out of the
// loop: ymm0 / ymm1 hold the operands, ymm2..ymm15 fourteen independent vpdpbusd chains. {vex} (written %{vex%} in an
// asm template, where braces mark dialect alternatives) asks the assembler for the VEX encoding (AVX-VNNI) rather than
// the EVEX one (AVX512-VNNI with VL), which a CPU without AVX-512 cannot run.
// tests/kernels/peak_loop_codegen.py checks the loop body.
std::int64_t mac_loop__avxvnni(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) return no_mac_rounds(checksum);
  volatile int seed = 0x01010101;
  std::int64_t n = iterations;
  alignas(32) std::int32_t lanes[8];
#define QATTN_CHAIN(r) "%{vex%} vpdpbusd %%ymm1, %%ymm0, %%ymm" #r "\n\t"
#define QATTN_CLEAR(r) "vpxor %%ymm" #r ", %%ymm" #r ", %%ymm" #r "\n\t"
#define QATTN_FOLD(r) "vpaddd %%ymm" #r ", %%ymm2, %%ymm2\n\t"
#define QATTN_EACH(X) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
  asm volatile(
      "vmovd %k[seed], %%xmm0\n\t"
      "vpbroadcastd %%xmm0, %%ymm0\n\t"
      "vpaddb %%ymm0, %%ymm0, %%ymm1\n\t"
      QATTN_EACH(QATTN_CLEAR)
      "1:\n\t"
      QATTN_EACH(QATTN_CHAIN)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      QATTN_FOLD(3) QATTN_FOLD(4) QATTN_FOLD(5) QATTN_FOLD(6) QATTN_FOLD(7) QATTN_FOLD(8) QATTN_FOLD(9) QATTN_FOLD(10)
      QATTN_FOLD(11) QATTN_FOLD(12) QATTN_FOLD(13) QATTN_FOLD(14) QATTN_FOLD(15)
      "vmovdqu %%ymm2, %[lanes]\n\t"
      : [n] "+r"(n), [lanes] "=m"(lanes)
      : [seed] "r"(static_cast<int>(seed))
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "cc");
#undef QATTN_EACH
#undef QATTN_FOLD
#undef QATTN_CLEAR
#undef QATTN_CHAIN
  *checksum = lanes_checksum(lanes);
  return iterations * 14 * 32;  // 32 MACs per 256-bit vpdpbusd
}

}  // namespace qattn::kernels
