// The accumulation steps of the matrix units over many outputs at once (qattn/reference/mma.h): wgmma's and
// tcgen05's E4M3 steps, Ada's, the block-scaled groups and HMMA's f16 accumulator, with the E4M3 decoder they read.
// The flash kernels' P V products run through these; mma.cc holds the per-output model (mma_dot) they equal.
#include "qattn/reference/mma.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "qattn/float_format.h"

// Every step below uses integer and exact float operations only, so every instruction set gives the same bits; on
// x86-64 GCC builds AVX-512, AVX2 and baseline copies of each and the loader picks one (the loops over c vectorise).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QATTN_STEP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QATTN_STEP_CLONES
#endif

namespace qattn::ref {

namespace {

// The exponent field of a float, unbiased (a zero reads -127).
inline std::int32_t float_exponent(float x) {
  return static_cast<std::int32_t>((std::bit_cast<std::uint32_t>(x) >> 23) & 0xffu) - 127;
}
inline float pow2(std::int32_t e) { return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23); }

// A double rounded toward zero to float32: a subnormal result truncated, one beyond the largest float to it (IEEE
// RZ, as to_float_rz). Branch-free, so that the chunks' loops vectorise.
inline float f32_rz(double d) {
  const float f = static_cast<float>(d);  // to nearest: at most one step away from zero too far
  const bool over = std::fabs(static_cast<double>(f)) > std::fabs(d);
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) - (over ? 1u : 0u));
}

}  // namespace

std::int8_t wgmma_e4m3_exponent(float x) {
  return static_cast<std::int8_t>(std::max(float_exponent(x), std::int32_t{-6}));  // E4M3 values are normal floats
}

void e4m3_decode(const std::uint8_t* codes, std::size_t count, float* value, std::int8_t* exponent) {
  struct Table {
    std::array<float, 256> value;
    std::array<std::int8_t, 256> exponent;
  };
  static const Table table = [] {
    Table t;
    for (std::uint32_t c = 0; c < 256; ++c) {
      t.value[c] = static_cast<float>(lowp_decode(c, fp8_e4m3fn()));
      t.exponent[c] = std::isnan(t.value[c]) ? std::int8_t{-6} : wgmma_e4m3_exponent(t.value[c]);
    }
    return t;
  }();
  for (std::size_t i = 0; i < count; ++i) value[i] = table.value[codes[i]], exponent[i] = table.exponent[codes[i]];
}

namespace {

// One chunk of W outputs (W a constant, so that the arrays live in vector registers; W = 0: w outputs, w <= 32).
template <std::size_t W>
[[gnu::always_inline]] inline void wgmma_e4m3_chunk(float* a, const float* p, const std::int8_t* ep, std::size_t n,
                                                    const float* v, const std::int8_t* v_exponent, std::size_t stride,
                                                    std::size_t w_runtime) {
  constexpr std::size_t kMax = 32;
  constexpr std::int32_t kFractionBits = 13;
  constexpr std::uint32_t kDroppedBits = 0x3ffu;  // RZ to 14 significant bits: the low 10 of float's 23 stored bits
  const std::size_t w = W > 0 ? W : w_runtime;
  // The maximum in 8-bit lanes: product exponents lie in [-12, 16], a finite accumulator's in [-127, 127]. A zero
  // accumulator reads -127, below every product's -12: it never sets E, as the model says.
  std::int8_t e8[kMax];
  for (std::size_t c = 0; c < w; ++c) e8[c] = static_cast<std::int8_t>(float_exponent(a[c]));
  for (std::size_t j = 0; j < n; ++j) {
    const std::int8_t ej = ep[j];
    const std::int8_t* er = v_exponent + j * stride;
    for (std::size_t c = 0; c < w; ++c) e8[c] = std::max(e8[c], static_cast<std::int8_t>(ej + er[c]));
  }
  // Terms in units of 2^(E - 13): E >= -12, so both powers of two are normal floats and every scaling is exact;
  // each term is below 2^15 and the sum of 33 below 2^21, exact in int32 and in float.
  float scale[kMax];
  std::int32_t s[kMax];
  for (std::size_t c = 0; c < w; ++c) {
    scale[c] = pow2(kFractionBits - e8[c]);
    s[c] = static_cast<std::int32_t>(a[c] * scale[c]);  // truncation toward zero
  }
  for (std::size_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vr = v + j * stride;
    for (std::size_t c = 0; c < w; ++c) s[c] += static_cast<std::int32_t>(pj * vr[c] * scale[c]);
  }
  for (std::size_t c = 0; c < w; ++c) {
    const float rz = std::bit_cast<float>(std::bit_cast<std::uint32_t>(static_cast<float>(s[c])) & ~kDroppedBits);
    a[c] = rz * pow2(e8[c] - kFractionBits);
  }
}

// E of a fused step per output c < w: max(the accumulator's exponent field, at least acc_emin, and e(p[j]) +
// e(v[j][c]) over the nonzero products); a zero product does not count (the field_zero_low rule's -126 lies below
// every accumulator's bound).
[[gnu::always_inline]] inline void step_exponents(std::int32_t* e, const float* a, std::int32_t acc_emin, const float* p,
                                                  const std::int8_t* ep, std::size_t n, const float* v,
                                                  const std::int8_t* v_exponent, std::size_t stride, std::size_t w) {
  for (std::size_t c = 0; c < w; ++c) e[c] = std::max(float_exponent(a[c]), acc_emin);
  for (std::size_t j = 0; j < n; ++j) {
    if (p[j] == 0) continue;
    const std::int32_t ej = ep[j];
    const float* vr = v + j * stride;
    const std::int8_t* er = v_exponent + j * stride;
    for (std::size_t c = 0; c < w; ++c)  // a zero v has no exponent (tested on the bits, so that it vectorises)
      e[c] = std::max(e[c], ej + er[c] - ((std::bit_cast<std::uint32_t>(vr[c]) & 0x7fffffffu) == 0 ? 1000 : 0));
  }
}

// One chunk of W outputs of tcgen05_e4m3_step (W constant; W = 0: w outputs, w <= 32).
template <std::size_t W>
[[gnu::always_inline]] inline void tcgen05_e4m3_chunk(float* a, const float* p, const std::int8_t* ep, std::size_t n,
                                                      const float* v, const std::int8_t* v_exponent, std::size_t stride,
                                                      std::size_t w_runtime) {
  constexpr std::size_t kMax = 32;
  constexpr std::int32_t kFractionBits = 25;
  constexpr std::int32_t kLowestProduct = -12;  // E4M3 field exponents are >= -6
  constexpr std::uint64_t kDroppedBits = (std::uint64_t{1} << 29) - 1;  // RZ to 24 significant bits of a double
  const std::size_t w = W > 0 ? W : w_runtime;
  // E: the accumulator counts at max(its exponent field, -126) (zero and subnormals at -126), a product of two
  // nonzero operands at the sum of their field exponents (>= -12); a product with a zero operand at -126, which the
  // accumulator's bound already covers.
  std::int32_t e[kMax];
  step_exponents(e, a, -126, p, ep, n, v, v_exponent, stride, w);
  // Terms in units of 2^(E - 25), truncated by the conversion to int32: a product (8 significant bits) is below
  // 2^27 there, the accumulator below 2^26, and with E >= -12 the factor 2^(25 - E) and every scaled value are exact
  // floats; their sum (33 terms, below 2^33) is exact in double. E < -12 means no nonzero product: D = C (+0 for
  // a zero C), which the factor for E = -12 would cut, so that case takes C as it is.
  float scale[kMax];
  double s[kMax];
  for (std::size_t c = 0; c < w; ++c) {
    scale[c] = pow2(kFractionBits - std::max(e[c], kLowestProduct));
    s[c] = static_cast<double>(static_cast<std::int32_t>(a[c] * scale[c]));
  }
  for (std::size_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vr = v + j * stride;
    for (std::size_t c = 0; c < w; ++c) s[c] += static_cast<double>(static_cast<std::int32_t>(pj * vr[c] * scale[c]));
  }
  for (std::size_t c = 0; c < w; ++c) {
    const double rz = std::bit_cast<double>(std::bit_cast<std::uint64_t>(s[c]) & ~kDroppedBits);
    const float d = f32_rz(rz * std::bit_cast<double>(static_cast<std::uint64_t>(e[c] - kFractionBits + 1023) << 52));
    a[c] = e[c] < kLowestProduct ? a[c] + 0.0f : d;
  }
}

// One chunk of W outputs of ada_e4m3_step (W constant; W = 0: w outputs, w <= 32). A column whose E lies outside
// [-12, 100] (no nonzero product and a small accumulator, or an accumulator near float32's top or not finite) is left
// as it is and flagged in `slow` for the caller's scalar step.
template <std::size_t W, bool kF16>
[[gnu::always_inline]] inline void ada_e4m3_chunk(float* a, const float* p, const std::int8_t* ep, std::size_t n,
                                                  const float* v, const std::int8_t* v_exponent, std::size_t stride,
                                                  std::size_t w_runtime, bool* slow) {
  constexpr std::size_t kMax = 32;
  constexpr std::int32_t kFractionBits = 13;
  constexpr std::int32_t kLowest = -12, kHighest = 100;  // E4M3 products are at -12 or above
  constexpr std::uint32_t kDroppedBits = 0x3ffu;  // RZ to 14 significant bits: the low 10 of float's 23 stored bits
  const std::size_t w = W > 0 ? W : w_runtime;
  std::int32_t e[kMax];
  step_exponents(e, a, kF16 ? -14 : -126, p, ep, n, v, v_exponent, stride, w);
  // Terms in units of 2^(E - 13), truncated by the conversion to int32: a product is below 2^15 there, the
  // accumulator below 2^14, and their sum (17 terms) below 2^19, exact in int32 and in float; with E in
  // [-12, 100] the factor and every scaled value are exact floats.
  float scale[kMax];
  std::int32_t s[kMax];
  for (std::size_t c = 0; c < w; ++c) {
    const bool out = e[c] < kLowest || e[c] > kHighest;
    slow[c] = out;
    scale[c] = out ? 0.0f : pow2(kFractionBits - e[c]);
    s[c] = static_cast<std::int32_t>((out ? 0.0f : a[c]) * scale[c]);
  }
  for (std::size_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vr = v + j * stride;
    for (std::size_t c = 0; c < w; ++c) s[c] += static_cast<std::int32_t>(pj * vr[c] * scale[c]);
  }
  for (std::size_t c = 0; c < w; ++c) {
    if (slow[c]) continue;
    const float unit = pow2(e[c] - kFractionBits);
    if constexpr (kF16)  // the exact sum rounded once to nearest even onto binary16 (+-inf beyond its range)
      a[c] = static_cast<float>(round_to_binary16(static_cast<double>(static_cast<float>(s[c]) * unit)));
    else
      a[c] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(static_cast<float>(s[c])) & ~kDroppedBits) * unit;
  }
}

// An FP8 step over `cols` outputs in chunks of 32: the H100's wgmma (F = 13) or B200's tcgen05.mma (F = 25).
template <bool kTcgen05>
[[gnu::always_inline]] inline void fp8_step(float* acc, const float* p, std::size_t n, const float* v,
                                            const std::int8_t* v_exponent, std::size_t stride, std::size_t cols) {
  constexpr std::size_t kChunk = 32;
  std::int8_t ep[kChunk];  // n <= 32
  for (std::size_t j = 0; j < n; ++j) ep[j] = static_cast<std::int8_t>(std::max(float_exponent(p[j]), std::int32_t{-6}));
  std::size_t c0 = 0;
  for (; c0 + kChunk <= cols; c0 += kChunk)
    if constexpr (kTcgen05) tcgen05_e4m3_chunk<kChunk>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, kChunk);
    else wgmma_e4m3_chunk<kChunk>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, kChunk);
  if (c0 == cols) return;
  if constexpr (kTcgen05) tcgen05_e4m3_chunk<0>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, cols - c0);
  else wgmma_e4m3_chunk<0>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, cols - c0);
}

}  // namespace

// Integer and exact float operations only, so every instruction set gives the same bits (QATTN_STEP_CLONES).
QATTN_STEP_CLONES
void wgmma_e4m3_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                     std::size_t stride, std::size_t cols) {
  fp8_step<false>(acc, p, n, v, v_exponent, stride, cols);
}

// The B200 tcgen05 FP8 step: exact terms in units of 2^(E - 25), summed exactly, the sum rounded toward zero to 24
// significant bits and onto float32 toward zero.
QATTN_STEP_CLONES
void tcgen05_e4m3_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                       std::size_t stride, std::size_t cols) {
  fp8_step<true>(acc, p, n, v, v_exponent, stride, cols);
}

namespace {

template <bool kF16>
[[gnu::always_inline]] inline void ada_step(float* acc, const float* p, std::size_t n, const float* v,
                                            const std::int8_t* v_exponent, std::size_t stride, std::size_t cols) {
  constexpr std::size_t kChunk = 32;
  std::int8_t ep[16];  // n <= 16
  for (std::size_t j = 0; j < n; ++j) ep[j] = static_cast<std::int8_t>(std::max(float_exponent(p[j]), std::int32_t{-6}));
  bool slow[kChunk];
  for (std::size_t c0 = 0; c0 < cols; c0 += kChunk) {
    const std::size_t w = std::min(kChunk, cols - c0);
    if (w == kChunk) ada_e4m3_chunk<kChunk, kF16>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, kChunk, slow);
    else ada_e4m3_chunk<0, kF16>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, w, slow);
    for (std::size_t c = 0; c < w; ++c) {
      if (!slow[c]) continue;
      // the model itself, on the step's codes (16, zero-padded: one step of the instruction)
      std::array<std::uint16_t, 16> pc{}, vc{};
      for (std::size_t j = 0; j < n; ++j)
        pc[j] = static_cast<std::uint16_t>(lowp_encode(p[j], fp8_e4m3fn())),
        vc[j] = static_cast<std::uint16_t>(lowp_encode(v[j * stride + c0 + c], fp8_e4m3fn()));
      acc[c0 + c] = mma_dot(mma_preset(kF16 ? "ada-mma-e4m3-acc16" : "ada-mma-e4m3"), pc, vc, acc[c0 + c]);
    }
  }
}

}  // namespace

// Ada's FP8 step: integer and exact float operations, so every instruction set gives the same bits.
QATTN_STEP_CLONES
void ada_e4m3_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                   std::size_t stride, std::size_t cols, bool f16_accumulator) {
  if (f16_accumulator) ada_step<true>(acc, p, n, v, v_exponent, stride, cols);
  else ada_step<false>(acc, p, n, v, v_exponent, stride, cols);
}

namespace {

// One chunk of W outputs of scaled_group_step (W constant; W = 0: w outputs, w <= 32).
template <std::size_t W>
[[gnu::always_inline]] inline void scaled_group_chunk(float* a, const double* term, const std::int32_t* term_e,
                                                      std::size_t groups, std::size_t stride, std::size_t w_runtime) {
  constexpr std::size_t kMax = 32;
  constexpr std::int32_t kFractionBits = 35;
  constexpr std::uint64_t kDroppedBits = (std::uint64_t{1} << 29) - 1;  // RZ to 24 significant bits of a double
  const std::size_t w = W > 0 ? W : w_runtime;
  std::int32_t e[kMax];
  for (std::size_t c = 0; c < w; ++c) e[c] = std::max(float_exponent(a[c]), std::int32_t{-126});
  for (std::size_t g = 0; g < groups; ++g)
    for (std::size_t c = 0; c < w; ++c) e[c] = std::max(e[c], term_e[g * stride + c]);
  // Units of 2^(E - 35): E >= -126, so 2^(35 - E) <= 2^161 is a double; the accumulator is below 2^37 there and a
  // term (a group sum of at most 12 significant bits times two 4-bit scale significands) below 2^47, so every scaled
  // value is exact and their sum, below 2^50, too. Starting from +0 makes an exact zero sum +0.
  double scale[kMax], s[kMax];
  for (std::size_t c = 0; c < w; ++c) {
    scale[c] = std::bit_cast<double>(static_cast<std::uint64_t>(kFractionBits - e[c] + 1023) << 52);
    s[c] = 0.0 + std::trunc(static_cast<double>(a[c]) * scale[c]);
  }
  for (std::size_t g = 0; g < groups; ++g)
    for (std::size_t c = 0; c < w; ++c) s[c] += std::trunc(term[g * stride + c] * scale[c]);
  for (std::size_t c = 0; c < w; ++c) {
    const double rz = std::bit_cast<double>(std::bit_cast<std::uint64_t>(s[c]) & ~kDroppedBits);
    a[c] = f32_rz(rz * std::bit_cast<double>(static_cast<std::uint64_t>(e[c] - kFractionBits + 1023) << 52));
  }
}

}  // namespace

// The block-scaled FP4 step (b200-mxf4, b200-nvf4): exact terms in units of 2^(E - 35), summed exactly, the sum
// rounded toward zero to 24 significant bits.
QATTN_STEP_CLONES
void scaled_group_step(float* acc, const double* term, const std::int32_t* term_exponent, std::size_t groups,
                       std::size_t stride, std::size_t cols) {
  constexpr std::size_t kChunk = 32;
  std::size_t c0 = 0;
  for (; c0 + kChunk <= cols; c0 += kChunk)
    scaled_group_chunk<kChunk>(acc + c0, term + c0, term_exponent + c0, groups, stride, kChunk);
  if (c0 < cols) scaled_group_chunk<0>(acc + c0, term + c0, term_exponent + c0, groups, stride, cols - c0);
}

std::int8_t hmma_f16_exponent(float x) {
  return x == 0 ? std::int8_t{-128} : static_cast<std::int8_t>(std::ilogb(x));  // binary16 values are normal floats
}

namespace {

// x rounded once to binary16, to nearest even (x a double; |x| >= 2^-80 or 0): to a multiple of the binary16 quantum
// 2^q, q = max(floor(log2|x|) - 10, -24), by adding and taking away 2^(q + 52), whose ulp is 2^q. Beyond 65504 the
// result is inf.
inline double round_binary16(double x) {
  const double a = std::fabs(x);
  const std::int64_t ex = static_cast<std::int64_t>((std::bit_cast<std::uint64_t>(a) >> 52) & 0x7ff) - 1023;
  const std::int64_t q = std::max<std::int64_t>(ex - 10, -24);
  const double c = std::bit_cast<double>(static_cast<std::uint64_t>(q + 52 + 1023) << 52);
  double r = (a + c) - c;
  r = r >= 65520.0 ? std::numeric_limits<double>::infinity() : r;
  return std::copysign(r, x);
}

// One chunk of W outputs of hmma_f16_acc16_step (W constant; W = 0: w outputs, w <= 32).
template <std::size_t W>
inline void hmma_f16_acc16_chunk(float* a, const float* p, const std::int32_t* ep, std::size_t n, const float* v,
                                 const std::int8_t* v_exponent, std::size_t stride, std::size_t w_runtime) {
  constexpr std::size_t kMax = 32;
  constexpr std::int32_t kFractionBits = 25;
  constexpr std::int32_t kNone = -1000;      // no exponent: a zero operand or accumulator
  constexpr std::int32_t kNoneBelow = -60;   // E below this: no term has an exponent
  const std::size_t w = W > 0 ? W : w_runtime;
  std::int32_t e[kMax];
  for (std::size_t c = 0; c < w; ++c) {
    const std::int32_t fe = float_exponent(a[c]);
    e[c] = a[c] == 0 || fe == 128 ? kNone : fe;  // binary16 values are normal floats; inf or NaN: handled below
  }
  for (std::size_t j = 0; j < n; ++j) {
    const std::int8_t* er = v_exponent + j * stride;
    // a zero v reads -128, so its product's sum lies below -60 (real ones lie in [-48, 30]): no exponent
    for (std::size_t c = 0; c < w; ++c) e[c] = std::max(e[c], ep[j] + er[c]);
  }
  // Terms in units of 2^(E - 25): E >= -48, so 2^(25 - E) <= 2^73 and every scaling is exact in float; a product
  // (22 significant bits) scaled is below 2^27, the accumulator below 2^26; the sum of 17 is exact in double.
  float scale[kMax];
  double s[kMax];
  for (std::size_t c = 0; c < w; ++c) {
    scale[c] = e[c] < kNoneBelow ? 0.0f : pow2(kFractionBits - e[c]);
    s[c] = std::isfinite(a[c]) ? static_cast<double>(static_cast<std::int32_t>(a[c] * scale[c])) : 0.0;
  }
  for (std::size_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vr = v + j * stride;
    for (std::size_t c = 0; c < w; ++c) s[c] += static_cast<double>(static_cast<std::int32_t>(pj * vr[c] * scale[c]));
  }
  for (std::size_t c = 0; c < w; ++c) {
    if (!std::isfinite(a[c]) || e[c] < kNoneBelow) continue;  // inf + finite products stays inf, NaN stays NaN; no term:
                                                        // acc stays
    const double unit = std::bit_cast<double>(static_cast<std::uint64_t>(e[c] - kFractionBits + 1023) << 52);
    a[c] = s[c] == 0 ? 0.0f : static_cast<float>(round_binary16(s[c] * unit));
  }
}

}  // namespace

// The HMMA.16816.F16 step: exact terms in units of 2^(E - 25), summed exactly, the sum rounded once to binary16.
QATTN_STEP_CLONES
void hmma_f16_acc16_step(float* acc, const float* p, std::size_t n, const float* v, const std::int8_t* v_exponent,
                         std::size_t stride, std::size_t cols) {
  constexpr std::size_t kChunk = 32;
  std::int32_t ep[16];  // n <= 16
  for (std::size_t j = 0; j < n; ++j) ep[j] = p[j] == 0 ? -1000 : float_exponent(p[j]);
  std::size_t c0 = 0;
  for (; c0 + kChunk <= cols; c0 += kChunk)
    hmma_f16_acc16_chunk<kChunk>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, kChunk);
  if (c0 < cols) hmma_f16_acc16_chunk<0>(acc + c0, p, ep, n, v + c0, v_exponent + c0, stride, cols - c0);
}

}  // namespace qattn::ref

#undef QATTN_STEP_CLONES
