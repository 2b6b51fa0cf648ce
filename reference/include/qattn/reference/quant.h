// Uniform quantization primitives shared by the KV-cache and weight quantizers (docs/quantizers.md).
//
// A matrix x [rows, cols] (rows = tokens or input features, cols = channels or outputs) is cut into tiles; every
// tile has one scale s and one zero point z, and each entry becomes an integer code:
//
//   symmetric    s = max|x| / q_max                     code = clamp(R(x / s), q_min, q_max)        x^ = s code
//   asymmetric   lo = min(min x, 0), hi = max(max x, 0)  (the range always holds 0, so z is an integer code)
//                s = (hi - lo) / (q_max - q_min)         z = clamp(R(q_min - lo / s), q_min, q_max)
//                                                        code = clamp(R(x / s) + z, q_min, q_max)   x^ = s (code - z)
//   min-offset   lo = min x, hi = max x                  (KIVI's and SAW's form: a float offset, no integer z)
//                s = max(hi - lo, eps) / (q_max - q_min) code = clamp(R((x - lo) / s), 0, q_max - q_min) + q_min
//                                                        x^ = lo + s (code - q_min)
//
// R is round-half-to-even (default) or round-half-away-from-zero. An all-zero tile takes s = 1 (every code 0,
// or z). All arithmetic is in double.
//
// Tiles: `tile_rows` x `tile_cols` entries, 0 meaning the whole axis. Per tensor (0, 0); per channel = per column
// (0, 1); per token = per row (1, 0); per group of g channels within a token (1, g); per block of g tokens (g, 0);
// KIVI's keys, per channel within a group of g tokens (g, 1). A last partial tile is allowed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qattn/method.h"
#include "qattn/tensor.h"

namespace qattn::ref {

enum class QuantMode { symmetric, asymmetric, min_offset };
enum class QuantRounding { half_even, half_away };

struct QuantGrid {
  int q_min = -128, q_max = 127;
  QuantMode mode = QuantMode::asymmetric;
  QuantRounding rounding = QuantRounding::half_even;
  double eps = 1e-8;  // min-offset only: the smallest range (SAW: max(max - min, 1e-8))

  // The usual grids: signed b-bit symmetric [-(2^(b-1) - 1), 2^(b-1) - 1]; unsigned b-bit asymmetric / min-offset
  // [0, 2^b - 1]. Throw std::invalid_argument for bits outside 1..16.
  static QuantGrid symmetric_bits(int bits);
  static QuantGrid unsigned_bits(int bits, QuantMode mode);
};

struct Tiling {
  Eigen::Index tile_rows = 0, tile_cols = 0;  // 0 = the whole axis
};

// Named granularities (the `k=` / `v=` parameters of the rtn quantizer): tensor, channel, token, group (g channels
// of one token), block (g tokens). kGranularities is their name table (qattn/method.h's Choice).
enum class Granularity { tensor, channel, token, group, block };
inline constexpr Choice<Granularity> kGranularities[] = {{"tensor", Granularity::tensor},
                                                        {"channel", Granularity::channel},
                                                        {"token", Granularity::token},
                                                        {"group", Granularity::group},
                                                        {"block", Granularity::block}};
// The tiling of a granularity; throws std::invalid_argument for g < 1 where g is used (group, block).
Tiling tiling_for(Granularity granularity, Eigen::Index group);

double quant_round(double x, QuantRounding r);

struct QuantizedMatrix {
  RowMatrixXi32 codes;       // [rows, cols]
  RowMatrixXd scale, zero;   // [tile rows, tile cols]; zero is the integer z (asymmetric), lo (min-offset) or 0
  Tiling tiling;
  QuantGrid grid;

  RowMatrixXd dequantize() const;
  Eigen::Index tiles() const { return scale.size(); }
};

// Throws std::invalid_argument on a non-finite entry or q_min >= q_max.
QuantizedMatrix quantize(const MatrixView& x, const QuantGrid& grid, Tiling tiling);

// Storage of a quantized matrix in bits per element: the codes' bits plus each tile's scale and zero point
// (32-bit float scale; an integer zero point in the codes' width; a 32-bit float offset for min-offset).
double bits_per_element(const QuantizedMatrix& q, int code_bits);

// Packs codes of `bits` (1, 2, 4 or 8) bits into bytes, element 0 in the lowest bits of byte 0: INT4 two per
// byte, INT2 four per byte. Signed codes are stored in two's complement within their field. Throws
// std::invalid_argument for another width or a code that does not fit ([0, 2^b - 1], or [-2^(b-1), 2^(b-1) - 1]).
std::vector<std::uint8_t> pack_codes(std::span<const std::int32_t> codes, int bits, bool is_signed);
std::vector<std::int32_t> unpack_codes(std::span<const std::uint8_t> bytes, std::size_t count, int bits, bool is_signed);

}  // namespace qattn::ref
