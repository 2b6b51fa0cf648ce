#include "qattn/reference/quant.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace qattn::ref {

QuantGrid QuantGrid::symmetric_bits(int bits) {
  if (bits < 1 || bits > 16) throw std::invalid_argument("quantization bits must be 1..16, got " + std::to_string(bits));
  const int m = bits == 1 ? 1 : (1 << (bits - 1)) - 1;
  return QuantGrid{-m, m, QuantMode::symmetric};
}

QuantGrid QuantGrid::unsigned_bits(int bits, QuantMode mode) {
  if (bits < 1 || bits > 16) throw std::invalid_argument("quantization bits must be 1..16, got " + std::to_string(bits));
  return QuantGrid{0, (1 << bits) - 1, mode};
}

Tiling tiling_for(Granularity granularity, Eigen::Index group) {
  auto grouped = [&](Tiling t, const char* name) {
    if (group < 1) throw std::invalid_argument(std::string("granularity '") + name + "' needs a group size >= 1");
    return t;
  };
  switch (granularity) {
    case Granularity::tensor: return {0, 0};
    case Granularity::channel: return {0, 1};
    case Granularity::token: return {1, 0};
    case Granularity::group: return grouped(Tiling{1, group}, "group");
    case Granularity::block: return grouped(Tiling{group, 0}, "block");
  }
  throw std::invalid_argument("tiling_for: not a granularity");
}

double quant_round(double x, QuantRounding r) {
  return r == QuantRounding::half_even ? std::nearbyint(x) : std::round(x);  // std::round: half away from zero
}

namespace {

Eigen::Index tile_extent(Eigen::Index tile, Eigen::Index n) { return tile <= 0 ? std::max<Eigen::Index>(n, 1) : tile; }
Eigen::Index tile_count(Eigen::Index tile, Eigen::Index n) {
  const Eigen::Index e = tile_extent(tile, n);
  return std::max<Eigen::Index>((n + e - 1) / e, 1);
}

}  // namespace

QuantizedMatrix quantize(const MatrixView& x, const QuantGrid& g, Tiling tiling) {
  if (g.q_min >= g.q_max) throw std::invalid_argument("quantize: q_min must be < q_max");
  for (double v : x.reshaped())
    if (!std::isfinite(v)) throw std::invalid_argument("quantize: non-finite input");
  const Eigen::Index tr = tile_extent(tiling.tile_rows, x.rows()), tc = tile_extent(tiling.tile_cols, x.cols());
  QuantizedMatrix q;
  q.tiling = tiling;
  q.grid = g;
  q.codes.resize(x.rows(), x.cols());
  q.scale.resize(tile_count(tiling.tile_rows, x.rows()), tile_count(tiling.tile_cols, x.cols()));
  q.zero.setZero(q.scale.rows(), q.scale.cols());
  for (Eigen::Index bi = 0; bi < q.scale.rows(); ++bi)
    for (Eigen::Index bj = 0; bj < q.scale.cols(); ++bj) {
      const Eigen::Index r0 = bi * tr, c0 = bj * tc;
      const Eigen::Index nr = std::min(tr, x.rows() - r0), nc = std::min(tc, x.cols() - c0);
      const auto tile = x.block(r0, c0, nr, nc);
      double s = 1, z = 0;
      const double span = static_cast<double>(g.q_max) - g.q_min;
      if (tile.size() > 0) {
        const double mn = tile.minCoeff(), mx = tile.maxCoeff();
        switch (g.mode) {
          case QuantMode::symmetric: {
            const double m = std::max(std::fabs(mn), std::fabs(mx));
            if (m > 0) s = m / g.q_max;
            break;
          }
          case QuantMode::asymmetric: {
            const double lo = std::min(mn, 0.0), hi = std::max(mx, 0.0);
            if (hi > lo) s = (hi - lo) / span;
            z = std::clamp(quant_round(g.q_min - lo / s, g.rounding), double(g.q_min), double(g.q_max));
            break;
          }
          case QuantMode::min_offset:
            s = std::max(mx - mn, g.eps) / span;
            z = mn;
            break;
        }
      }
      q.scale(bi, bj) = s;
      q.zero(bi, bj) = z;
      for (Eigen::Index i = 0; i < nr; ++i)
        for (Eigen::Index j = 0; j < nc; ++j) {
          const double v = tile(i, j);
          double c = 0;
          switch (g.mode) {
            case QuantMode::symmetric: c = quant_round(v / s, g.rounding); break;
            case QuantMode::asymmetric: c = quant_round(v / s, g.rounding) + z; break;
            case QuantMode::min_offset: c = quant_round((v - z) / s, g.rounding) + g.q_min; break;
          }
          q.codes(r0 + i, c0 + j) = static_cast<std::int32_t>(std::clamp(c, double(g.q_min), double(g.q_max)));
        }
    }
  return q;
}

RowMatrixXd QuantizedMatrix::dequantize() const {
  const Eigen::Index tr = tile_extent(tiling.tile_rows, codes.rows()), tc = tile_extent(tiling.tile_cols, codes.cols());
  RowMatrixXd out(codes.rows(), codes.cols());
  for (Eigen::Index i = 0; i < codes.rows(); ++i)
    for (Eigen::Index j = 0; j < codes.cols(); ++j) {
      const double s = scale(i / tr, j / tc), z = zero(i / tr, j / tc), c = codes(i, j);
      switch (grid.mode) {
        case QuantMode::symmetric: out(i, j) = s * c; break;
        case QuantMode::asymmetric: out(i, j) = s * (c - z); break;
        case QuantMode::min_offset: out(i, j) = z + s * (c - grid.q_min); break;
      }
    }
  return out;
}

double bits_per_element(const QuantizedMatrix& q, int code_bits) {
  const double n = static_cast<double>(q.codes.size());
  if (n == 0) return 0;
  const double per_tile = 32.0 + (q.grid.mode == QuantMode::asymmetric   ? code_bits
                                  : q.grid.mode == QuantMode::min_offset ? 32.0
                                                                         : 0.0);
  return code_bits + per_tile * static_cast<double>(q.tiles()) / n;
}

std::vector<std::uint8_t> pack_codes(std::span<const std::int32_t> codes, int bits, bool is_signed) {
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8)
    throw std::invalid_argument("pack_codes: bits must be 1, 2, 4 or 8, got " + std::to_string(bits));
  const std::int32_t lo = is_signed ? -(1 << (bits - 1)) : 0, hi = is_signed ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
  const int per_byte = 8 / bits;
  const unsigned mask = (1u << bits) - 1;
  std::vector<std::uint8_t> out((codes.size() + per_byte - 1) / per_byte, 0);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    if (codes[i] < lo || codes[i] > hi)
      throw std::invalid_argument("pack_codes: code " + std::to_string(codes[i]) + " at " + std::to_string(i) +
                                  " does not fit " + std::to_string(bits) + (is_signed ? " signed" : " unsigned") + " bits");
    out[i / per_byte] |= static_cast<std::uint8_t>((static_cast<unsigned>(codes[i]) & mask) << (bits * (i % per_byte)));
  }
  return out;
}

std::vector<std::int32_t> unpack_codes(std::span<const std::uint8_t> bytes, std::size_t count, int bits, bool is_signed) {
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8)
    throw std::invalid_argument("unpack_codes: bits must be 1, 2, 4 or 8, got " + std::to_string(bits));
  const int per_byte = 8 / bits;
  if (bytes.size() * per_byte < count) throw std::invalid_argument("unpack_codes: too few bytes for the count");
  const unsigned mask = (1u << bits) - 1;
  std::vector<std::int32_t> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::int32_t v = static_cast<std::int32_t>((bytes[i / per_byte] >> (bits * (i % per_byte))) & mask);
    if (is_signed && v >= (1 << (bits - 1))) v -= 1 << bits;
    out[i] = v;
  }
  return out;
}

}  // namespace qattn::ref
