// AMX variants of the GEMM families (AMX-TILE and AMX-INT8): eight tile registers of up to 16 rows x 64 bytes;
// tdpbssd (s8 x s8) and tdpbusd (u8 x s8) add to each int32 lane of C[16][16] the 64 products of a row of A[16][64]
// and a column of B[16 groups][16 columns x 4], exactly. The packed B of kernels.h (groups of 4 along k, N * 4 bytes
// per group) is a B tile's own layout: 16 columns x 64 k are 16 rows of 64 bytes, N * 4 bytes apart, read straight
// from the packed operand. qk is s8 x s8 natively (tdpbssd: no bias, B_sum is not read); pv is u8 x s8 (tdpbusd).
//
// Blocks of up to 32 rows x 32 columns: C in tiles 0-3 (row tile r, column tile c in 2 r + c), A in 4-5, B in 6-7;
// k in chunks of 64 bytes. A last chunk of kt < 64 bytes reads A and B from zero-padded copies (A: rows x 64 bytes
// once per call; B: 16 x 64 bytes per column tile, per column panel of each tile configuration), so no tile reads
// past an operand and the padding adds products of zeros. Rows past the last multiple of 16 run under a second tile
// configuration with that many rows. Every C lane is a sum of the same integer products as the scalar spec's, in another order; the sum is
// exact in int32 (kernels.h's bounds) and the additions wrap, so the order does not change C's bits.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "qattn/kernels.h"
#include "qattn/mac_loop_frame.h"
#include "qattn/thread_buffer.h"

namespace qattn::kernels {
namespace {

// The tile instructions in inline assembly with their memory effects declared: GCC 12's _tile_loadd/_tile_stored
// macros are asm statements without a memory operand or clobber, so the compiler could move ordinary stores to the
// operands (the zero-padded copies) past the load, or reads of C ahead of the store. Tile numbers are literals.
#define QATTN_TILE_LOAD(t, base, stride) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define QATTN_TILE_STORE(t, base, stride) \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define QATTN_TILE_ZERO(t) asm volatile("tilezero %%tmm" #t ::)
#define QATTN_TILE_DPBSSD(c, a, b) asm volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define QATTN_TILE_DPBUSD(c, a, b) asm volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

constexpr Index kTileRows = 16;   // rows of a C or A tile, k groups of a B tile
constexpr Index kTileBytes = 64;  // bytes per tile row: 64 k of A, 16 int32 of C, 16 columns x 4 k of B
constexpr Index kTileColumns = kTileBytes / 4;

// Palette 1's configuration (the 64-byte operand of ldtilecfg): tiles 0-3 (C) and 4-5 (A) of `rows` rows, 6-7 (B)
// of 16 groups, all 64 bytes wide. Loading it zeroes every tile.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

void configure_tiles(Index rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = static_cast<std::uint16_t>(kTileBytes);
    config.rows[t] = static_cast<std::uint8_t>(t < 6 ? rows : kTileRows);
  }
  asm volatile("ldtilecfg %0" ::"m"(config));
}

void release_tiles() { asm volatile("tilerelease" ::); }

// The tile operations of block (r, c): C(r, c) is tile 2 r + c, A(r) tile 4 + r, B(c) tile 6 + c.
template <int r, int c>
inline void zero_c() {
  if constexpr (r == 0 && c == 0) QATTN_TILE_ZERO(0);
  else if constexpr (r == 0 && c == 1) QATTN_TILE_ZERO(1);
  else if constexpr (r == 1 && c == 0) QATTN_TILE_ZERO(2);
  else QATTN_TILE_ZERO(3);
}
template <int r, int c>
inline void store_c(std::int32_t* base, Index stride) {
  if constexpr (r == 0 && c == 0) QATTN_TILE_STORE(0, base, stride);
  else if constexpr (r == 0 && c == 1) QATTN_TILE_STORE(1, base, stride);
  else if constexpr (r == 1 && c == 0) QATTN_TILE_STORE(2, base, stride);
  else QATTN_TILE_STORE(3, base, stride);
}
template <int r>
inline void load_a(const std::uint8_t* base, Index stride) {
  if constexpr (r == 0) QATTN_TILE_LOAD(4, base, stride);
  else QATTN_TILE_LOAD(5, base, stride);
}
template <int c>
inline void load_b(const std::int8_t* base, Index stride) {
  if constexpr (c == 0) QATTN_TILE_LOAD(6, base, stride);
  else QATTN_TILE_LOAD(7, base, stride);
}
template <bool kSigned, int r, int c>
inline void dot() {
  if constexpr (kSigned) {
    if constexpr (r == 0 && c == 0) QATTN_TILE_DPBSSD(0, 4, 6);
    else if constexpr (r == 0 && c == 1) QATTN_TILE_DPBSSD(1, 4, 7);
    else if constexpr (r == 1 && c == 0) QATTN_TILE_DPBSSD(2, 5, 6);
    else QATTN_TILE_DPBSSD(3, 5, 7);
  } else {
    if constexpr (r == 0 && c == 0) QATTN_TILE_DPBUSD(0, 4, 6);
    else if constexpr (r == 0 && c == 1) QATTN_TILE_DPBUSD(1, 4, 7);
    else if constexpr (r == 1 && c == 0) QATTN_TILE_DPBUSD(2, 5, 6);
    else QATTN_TILE_DPBUSD(3, 5, 7);
  }
}

// One call's operands: A [rows, k] (lda = k), the packed B (N * 4 bytes per group), the zero-padded copies of the
// last chunk (a_tail [rows, 64]; b_tail [2][16][64], refilled per column panel), C [rows, n].
struct Operands {
  const std::uint8_t* a;
  Index lda, k_main, k_tail;  // k_main: k rounded down to 64; k_tail = k - k_main
  const std::int8_t* b;
  Index ldb;                  // n * 4 bytes
  const std::uint8_t* a_tail;
  const std::int8_t* b_tail;
  std::int32_t* c;
  Index n;
};

// C's rows [i0, i0 + 16 R) (or the configured rows) x columns [n0, n0 + 16 C) over the whole k.
template <bool kSigned, int R, int C>
inline void block(const Operands& g, Index i0, Index n0) {
  auto each = [](auto&& f) {
    f(std::integral_constant<int, 0>{}, std::integral_constant<int, 0>{});
    if constexpr (C == 2) f(std::integral_constant<int, 0>{}, std::integral_constant<int, 1>{});
    if constexpr (R == 2) f(std::integral_constant<int, 1>{}, std::integral_constant<int, 0>{});
    if constexpr (R == 2 && C == 2) f(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{});
  };
  each([](auto r, auto c) { zero_c<decltype(r)::value, decltype(c)::value>(); });
  for (Index k0 = 0; k0 < g.k_main; k0 += kTileBytes) {
    load_a<0>(g.a + i0 * g.lda + k0, g.lda);
    if constexpr (R == 2) load_a<1>(g.a + (i0 + kTileRows) * g.lda + k0, g.lda);
    const std::int8_t* b = g.b + (k0 / 4) * g.ldb + n0 * 4;
    load_b<0>(b, g.ldb);
    if constexpr (C == 2) load_b<1>(b + kTileBytes, g.ldb);
    each([](auto r, auto c) { dot<kSigned, decltype(r)::value, decltype(c)::value>(); });
  }
  if (g.k_tail > 0) {
    load_a<0>(g.a_tail + i0 * kTileBytes, kTileBytes);
    if constexpr (R == 2) load_a<1>(g.a_tail + (i0 + kTileRows) * kTileBytes, kTileBytes);
    load_b<0>(g.b_tail, kTileBytes);
    if constexpr (C == 2) load_b<1>(g.b_tail + kTileRows * kTileBytes, kTileBytes);
    each([](auto r, auto c) { dot<kSigned, decltype(r)::value, decltype(c)::value>(); });
  }
  const Index ldc = g.n * Index{sizeof(std::int32_t)};
  each([&](auto r, auto c) {
    constexpr int kR = decltype(r)::value, kC = decltype(c)::value;
    store_c<kR, kC>(g.c + (i0 + kR * kTileRows) * g.n + n0 + kC * kTileColumns, ldc);
  });
}

// Rows [i0, i0 + rows) of C, all columns, under the tile configuration of `tile_rows` rows (16, or the rows left
// over): column panels of 32 (16 for the last where n is an odd multiple of 16), each panel's B tail copied once.
template <bool kSigned>
void row_range(const Operands& g, std::int8_t* b_tail, Index i0, Index rows, Index tile_rows) {
  configure_tiles(tile_rows);
  const Index step = 2 * tile_rows;
  for (Index n0 = 0; n0 < g.n; n0 += 2 * kTileColumns) {
    const bool pair = n0 + 2 * kTileColumns <= g.n;
    if (g.k_tail > 0) {  // groups k_main / 4 .. k / 4 - 1 of this panel (memcpy: no tile state is touched); the
                         // copy's later rows stay zero
      for (int c = 0; c < (pair ? 2 : 1); ++c)
        for (Index t = 0; t < g.k_tail / 4; ++t)
          std::memcpy(b_tail + (c * kTileRows + t) * kTileBytes, g.b + (g.k_main / 4 + t) * g.ldb + (n0 + c * kTileColumns) * 4,
                      kTileBytes);
    }
    Index i = i0;
    for (; i + step <= i0 + rows; i += step)
      pair ? block<kSigned, 2, 2>(g, i, n0) : block<kSigned, 2, 1>(g, i, n0);
    if (i < i0 + rows) pair ? block<kSigned, 1, 2>(g, i, n0) : block<kSigned, 1, 1>(g, i, n0);
  }
}

// GemmArgs::row_max is not filled (the variant table's qk_row_max is false for AMX: folding the maxima from the stored
// tiles cost more than the row kernel's own maximum pass, docs/kernels.md).
template <bool kSigned>
void gemm(const GemmArgs& args) {
  if (args.rows == 0 || args.n == 0) return;
  static thread_local ThreadBuffer a_copy, b_copy;
  Operands g{static_cast<const std::uint8_t*>(args.a), args.k, args.k / kTileBytes * kTileBytes, 0, args.b_packed,
             args.n * 4, nullptr, nullptr, args.c, args.n};
  g.k_tail = args.k - g.k_main;
  std::int8_t* b_tail = nullptr;
  if (g.k_tail > 0) {  // the last chunk's A rows, zero-padded to 64 bytes; B's copy zeroed once per call
    std::uint8_t* a_tail = a_copy.reserve(args.rows * kTileBytes);
    std::memset(a_tail, 0, static_cast<std::size_t>(args.rows * kTileBytes));
    for (Index r = 0; r < args.rows; ++r) std::memcpy(a_tail + r * kTileBytes, g.a + r * g.lda + g.k_main, g.k_tail);
    b_tail = reinterpret_cast<std::int8_t*>(b_copy.reserve(2 * kTileRows * kTileBytes));
    std::memset(b_tail, 0, 2 * kTileRows * kTileBytes);
    g.a_tail = a_tail, g.b_tail = b_tail;
  }
  if (args.k == 0) {  // no products: C = 0
    for (Index r = 0; r < args.rows; ++r) std::memset(args.c + r * args.n, 0, static_cast<std::size_t>(args.n) * 4);
    return;
  }
  const Index full = args.rows / kTileRows * kTileRows;
  if (full > 0) row_range<kSigned>(g, b_tail, 0, full, kTileRows);
  if (full < args.rows) row_range<kSigned>(g, b_tail, full, args.rows - full, args.rows - full);
  release_tiles();
}

}  // namespace

void qk_s8s8_s32__amx_32x32(const GemmArgs& args) { gemm<true>(args); }
void pv_u8s8_s32__amx_32x32(const GemmArgs& args) { gemm<false>(args); }

// The MAC-rate loop of tdpbssd: four independent C tiles fed from two A and two B tiles loaded once, so the loop
// is the instruction alone.
std::int64_t mac_loop__amx(std::int64_t iterations, std::int32_t* checksum) {
  if (iterations <= 0) return no_mac_rounds(checksum);
  alignas(64) std::int8_t operand[kTileRows * kTileBytes];
  volatile int seed = 1;
  std::memset(operand, seed, sizeof operand);
  configure_tiles(kTileRows);
  QATTN_TILE_LOAD(4, operand, kTileBytes);
  QATTN_TILE_LOAD(5, operand, kTileBytes);
  QATTN_TILE_LOAD(6, operand, kTileBytes);
  QATTN_TILE_LOAD(7, operand, kTileBytes);
  for (std::int64_t i = 0; i < iterations; ++i) {
    QATTN_TILE_DPBSSD(0, 4, 6);
    QATTN_TILE_DPBSSD(1, 4, 7);
    QATTN_TILE_DPBSSD(2, 5, 6);
    QATTN_TILE_DPBSSD(3, 5, 7);
  }
  alignas(64) std::int32_t out[kTileRows * kTileColumns];
  QATTN_TILE_STORE(0, out, kTileBytes);
  release_tiles();
  *checksum = lanes_checksum(out);
  return iterations * 4 * kTileRows * kTileColumns * kTileBytes;  // 16 x 16 lanes x 64 products per instruction
}

#undef QATTN_TILE_DPBUSD
#undef QATTN_TILE_DPBSSD
#undef QATTN_TILE_ZERO
#undef QATTN_TILE_STORE
#undef QATTN_TILE_LOAD

}  // namespace qattn::kernels
