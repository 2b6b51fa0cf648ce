// The scalar specs of the two GEMM families: plain loops over the packed layout, exact in int32.
#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {

template <typename A>
void gemm_scalar(const GemmArgs& g) {
  const A* a = static_cast<const A*>(g.a);
  for (Index i = 0; i < g.rows; ++i)
    for (Index n = 0; n < g.n; ++n) {
      std::int32_t acc = 0;
      for (Index k = 0; k < g.k; ++k)
        acc += std::int32_t{a[i * g.k + k]} * g.b_packed[(k / 4) * g.n * 4 + n * 4 + k % 4];
      g.c[i * g.n + n] = acc;
    }
}

}  // namespace

void qk_s8s8_s32__scalar(const GemmArgs& args) { gemm_scalar<std::int8_t>(args); }
void pv_u8s8_s32__scalar(const GemmArgs& args) { gemm_scalar<std::uint8_t>(args); }

}  // namespace qattn::kernels

namespace qattn::kernels {

// One scalar multiply-accumulate per MAC, eight independent chains. Inline assembly where the target is known
// (x86-64: mov + imul + add; aarch64: madd), because a C++ loop of constant products is folded by the compiler into
// a closed form (it once reported 6.7e6 "GMAC/s"). Elsewhere an empty asm keeps each product in the loop. The scalar
// GEMM itself may be auto-vectorised by the compiler, so its share of this peak can exceed 100 %.
std::int64_t mac_loop__scalar(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) {
    *checksum = 0;
    return 0;
  }
  volatile std::uint32_t seed = 3;
  const std::uint32_t a = seed, b = seed + 1;
  std::uint32_t c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0;
#if defined(__x86_64__) || defined(__aarch64__)
  std::int64_t n = iterations;
#if defined(__x86_64__)
  std::uint32_t t;
#define QATTN_MAC(r) "mov %[a], %[t]\n\timul %[b], %[t]\n\tadd %[t], %[" #r "]\n\t"
  asm volatile("1:\n\t" QATTN_MAC(c0) QATTN_MAC(c1) QATTN_MAC(c2) QATTN_MAC(c3) QATTN_MAC(c4) QATTN_MAC(c5)
                   QATTN_MAC(c6) QATTN_MAC(c7) "dec %[n]\n\tjnz 1b\n\t"
               : [c0] "+r"(c0), [c1] "+r"(c1), [c2] "+r"(c2), [c3] "+r"(c3), [c4] "+r"(c4), [c5] "+r"(c5),
                 [c6] "+r"(c6), [c7] "+r"(c7), [t] "=&r"(t), [n] "+r"(n)
               : [a] "r"(a), [b] "r"(b)
               : "cc");
#else
#define QATTN_MAC(r) "madd %w[" #r "], %w[a], %w[b], %w[" #r "]\n\t"
  asm volatile("1:\n\t" QATTN_MAC(c0) QATTN_MAC(c1) QATTN_MAC(c2) QATTN_MAC(c3) QATTN_MAC(c4) QATTN_MAC(c5)
                   QATTN_MAC(c6) QATTN_MAC(c7) "subs %[n], %[n], #1\n\tb.ne 1b\n\t"
               : [c0] "+r"(c0), [c1] "+r"(c1), [c2] "+r"(c2), [c3] "+r"(c3), [c4] "+r"(c4), [c5] "+r"(c5),
                 [c6] "+r"(c6), [c7] "+r"(c7), [n] "+r"(n)
               : [a] "r"(a), [b] "r"(b)
               : "cc");
#endif
#undef QATTN_MAC
#else
  for (std::int64_t i = 0; i < iterations; ++i)
    for (std::uint32_t* x : {&c0, &c1, &c2, &c3, &c4, &c5, &c6, &c7}) {  // unsigned: the sums wrap, defined
      *x += a * b;
      asm volatile("" : "+r"(*x));
    }
#endif
  const std::uint32_t acc[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
  std::uint32_t s = 0;
  for (std::uint32_t x : acc) s += x;
  *checksum = static_cast<std::int32_t>(s & 0x7fffffff);
  return iterations * 8;
}

}  // namespace qattn::kernels
