#include "qattn/reference/fa3_fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/float_format.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"

namespace qattn::ref {
namespace {

// A value as an error message shows it: 9 significant digits, exponent where large or small.
std::string shown(double x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::size_t kStep = 32;        // keys (or channels) per fused wgmma step
constexpr float kMaxOffset = 8.0f;       // the FP8 kernel's Max_offset: P~ in (0, 2^8]
constexpr int kThreadsPerRow = 4;        // the quad of threads that holds one row of the wgmma accumulator

// 2^x in float64, rounded once to float32 (the kernel's ex2.approx.ftz.f32 is not modelled).
inline float exp2_f32(float x) { return static_cast<float>(std::exp2(static_cast<double>(x))); }

// E4M3 values of one tensor [rows, cols] row-major, and its descale factor (step 1).
struct Fp8Tensor {
  std::vector<float> values;
  float descale = 1.0f;
};

Fp8Tensor quantize(const MatrixView& x, Fa3Scaling scaling, const char* name) {
  Fp8Tensor t;
  t.values.resize(static_cast<std::size_t>(x.rows() * x.cols()));
  float amax = 0;
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      const float xf = static_cast<float>(x(i, j));
      if (!std::isfinite(xf))
        throw InputError(name, "[" + std::to_string(i) + ", " + std::to_string(j) + "]",
                         shown(x(i, j)) + " is beyond float32, in which fa3-fp8 reads " + name);
      amax = std::max(amax, std::fabs(xf));
    }
  if (scaling == Fa3Scaling::amax && amax > 0) t.descale = amax / 448.0f;
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      const float xf = static_cast<float>(x(i, j));
      const float y = scaling == Fa3Scaling::amax ? xf / t.descale : xf;
      if (scaling == Fa3Scaling::none && !(std::fabs(y) < 464.0f))
        throw InputError(name, "[" + std::to_string(i) + ", " + std::to_string(j) + "]",
                         shown(xf) + " is beyond E4M3's range: torch's .to(float8_e4m3fn) makes it NaN "
                         "(fa3-fp8 scale=none casts without a scale; scale=amax scales each tensor to 448)");
      t.values[static_cast<std::size_t>(i * x.cols() + j)] = e4m3_round_saturate(y);
    }
  return t;
}

class Fa3Call final : public PreparedCall {
 public:
  Fa3Call(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale, const AttentionMask& mask,
          const Fa3Fp8Params& p)
      : PreparedCall(q.rows()), p(p), mask(mask), lq(q.rows()), lk(k.rows()), d(q.cols()), dv(v.cols()) {
    if (d > 256 || dv > 256)
      throw InputError("Q", "head_dim", "d = " + std::to_string(d) + ", d_v = " + std::to_string(dv) +
                                            ": FlashAttention-3's FP8 kernel takes head dimensions up to 256");
    key_block = p.key_block > 0 ? p.key_block : fa3_fp8_key_block(d);
    query_tile = p.query_tile > 0 ? p.query_tile : fa3_fp8_query_tile(d);
    // Q8, K8 and V8 are held as E4M3 codes, one byte each, and decoded where the steps read them: Q8 a row at a
    // time, K8 (transposed [d, L_k]: S = Q8 K8^T runs over d with the keys as the step's columns) a tile of keys at
    // a time, V8 a key block at a time.
    const auto codes_of = [](const Fp8Tensor& t) {
      std::vector<std::uint8_t> c(t.values.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<std::uint8_t>(lowp_encode(t.values[i], fp8_e4m3fn()));
      return c;
    };
    float k_descale = 1.0f;
    {
      const Fp8Tensor q8 = quantize(q, p.scaling, "Q");
      q_descale = q8.descale;
      q8_codes = codes_of(q8);
    }
    {
      const Fp8Tensor k8 = quantize(k, p.scaling, "K");
      k_descale = k8.descale;
      const std::vector<std::uint8_t> k8_codes = codes_of(k8);
      k8t_codes.resize(k8_codes.size());
      for (Eigen::Index j = 0; j < lk; ++j)
        for (Eigen::Index c = 0; c < d; ++c)
          k8t_codes[static_cast<std::size_t>(c * lk + j)] = k8_codes[static_cast<std::size_t>(j * d + c)];
    }
    const Fp8Tensor v8 = quantize(v, p.scaling, "V");
    v_descale = v8.descale;
    v8_codes = codes_of(v8);
    // The host's softmax_scale_log2 (float = float * double), then the kernel's *= q_descale * k_descale.
    const float softmax_scale_log2 = static_cast<float>(static_cast<double>(static_cast<float>(scale)) *
                                                        std::numbers::log2e);
    s2 = softmax_scale_log2 * (q_descale * k_descale);
  }

 private:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index rows) const override;

  const Fa3Fp8Params p;
  const AttentionMask& mask;
  const Eigen::Index lq, lk, d, dv;
  int key_block = 128, query_tile = 128;
  std::vector<std::uint8_t> q8_codes, k8t_codes, v8_codes;  // Q8 [L_q, d], K8^T [d, L_k], V8 [L_k, d_v]: E4M3 codes
  float q_descale = 1.0f, v_descale = 1.0f;
  float s2 = 0;
};

AttentionResult Fa3Call::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  const Eigen::Index blocks = (lk + key_block - 1) / key_block;
  // Rows go in chunks: S is formed a tile of keys at a time for every row of the chunk, and each key block serves
  // every row before the next, so K8 and V8 stay in cache. Each row's operations, and their order, are those of
  // the row alone.
  constexpr Eigen::Index kChunkRows = 32, kKeyTile = 512;
  RowMatrixXf s(kChunkRows, lk), p8(kChunkRows, lk), o(kChunkRows, dv), ms_block(kChunkRows, blocks);
  // The decoded operands: one row of Q8, one tile of keys of K8^T [d, kKeyTile], one key block of V8.
  std::array<float, 256> q_row;  // d <= 256 (the constructor's check)
  std::array<std::int8_t, 256> q_row_e;
  std::vector<float> k_tile(static_cast<std::size_t>(d * kKeyTile)), v_block(static_cast<std::size_t>(key_block * dv));
  std::vector<std::int8_t> k_tile_e(k_tile.size()), v_block_e(v_block.size());
  std::vector<float> m(kChunkRows);
  std::vector<std::array<float, kThreadsPerRow>> l(kChunkRows);
  std::vector<Eigen::Index> lo(kChunkRows), hi(kChunkRows);
  std::vector<char> first(kChunkRows);
  RowMatrixXb tile_visible;
  Eigen::Index tile = -1, tile_lo = 0, tile_hi = 0;  // the query tile of a row, and its key blocks [lo, hi)
  for (Eigen::Index c0 = r0; c0 < r0 + rows; c0 += kChunkRows) {
    const Eigen::Index n = std::min(kChunkRows, r0 + rows - c0);
    // (2) S on the wgmma: d in steps of 32 from zero, for each output on its own
    s.topRows(n).setZero();
    for (Eigen::Index k0 = 0; k0 < lk; k0 += kKeyTile) {
      const auto cols = static_cast<std::size_t>(std::min(kKeyTile, lk - k0));
      for (Eigen::Index c = 0; c < d; ++c)
        e4m3_decode(k8t_codes.data() + c * lk + k0, cols, k_tile.data() + c * kKeyTile, k_tile_e.data() + c * kKeyTile);
      for (Eigen::Index t = 0; t < n; ++t) {
        e4m3_decode(q8_codes.data() + (c0 + t) * d, static_cast<std::size_t>(d), q_row.data(), q_row_e.data());
        for (Eigen::Index d0 = 0; d0 < d; d0 += static_cast<Eigen::Index>(kStep))
          wgmma_e4m3_step(&s(t, k0), q_row.data() + d0, static_cast<std::size_t>(std::min<Eigen::Index>(kStep, d - d0)),
                          k_tile.data() + d0 * kKeyTile, k_tile_e.data() + d0 * kKeyTile,
                          static_cast<std::size_t>(kKeyTile), cols);
      }
    }
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index i = c0 + t;
      if (i / query_tile != tile) {  // the kernel visits, for a tile of query rows, the key blocks it can see
        tile = i / query_tile;
        const Eigen::Index t0 = tile * query_tile, tn = std::min<Eigen::Index>(query_tile, lq - t0);
        tile_visible = mask.empty() ? RowMatrixXb::Constant(tn, lk, true) : mask.rows(t0, tn, lq).visible(tn, lk);
        tile_lo = blocks, tile_hi = 0;
        for (Eigen::Index b = 0; b < blocks; ++b) {
          const Eigen::Index k0 = b * key_block, kn = std::min<Eigen::Index>(key_block, lk - k0);
          if (tile_visible.middleCols(k0, kn).any()) tile_lo = std::min(tile_lo, b), tile_hi = b + 1;
        }
      }
      lo[t] = tile_lo, hi[t] = tile_hi;
      const auto visible = tile_visible.row(i - tile * query_tile);
      for (Eigen::Index j = 0; j < lk; ++j) {
        if (!visible(j)) s(t, j) = kNegInf;
        else if (!std::isfinite(s(t, j) * s2)) throw_logit_overflow("fa3-fp8", "float32", i, j);  // S s2 in the exp2
      }
      m[t] = kNegInf;
      l[t].fill(0.0f);
      first[t] = 1;
    }
    o.topRows(n).setZero();
    // (3) the key blocks, last first
    for (Eigen::Index b = blocks - 1; b >= 0; --b) {
      const Eigen::Index k0 = b * key_block, k1 = std::min<Eigen::Index>(lk, k0 + key_block);
      e4m3_decode(v8_codes.data() + k0 * dv, static_cast<std::size_t>((k1 - k0) * dv), v_block.data(), v_block_e.data());
      for (Eigen::Index t = 0; t < n; ++t) {
        if (b < lo[t] || b >= hi[t]) continue;
        const float* sr = &s(t, 0);
        float* pr = &p8(t, 0);
        float* orow = &o(t, 0);
        const float m_prev = m[t];
        for (Eigen::Index j = k0; j < k1; ++j) m[t] = std::max(m[t], sr[j]);
        if (!first[t]) {
          const float m_cur = m[t] == kNegInf ? 0.0f : m[t];  // Check_inf
          const float rs = exp2_f32((m_prev - m_cur) * s2);
          for (float& x : l[t]) x *= rs;
          for (Eigen::Index c = 0; c < dv; ++c) orow[c] *= rs;
        }
        const float max_scaled = m[t] == kNegInf ? 0.0f : m[t] * s2 - kMaxOffset;
        ms_block(t, b) = max_scaled;
        std::array<float, kThreadsPerRow> part{};
        std::array<bool, kThreadsPerRow> started{};
        for (Eigen::Index j = k0; j < k1; ++j) {
          const float pt = exp2_f32(std::fma(sr[j], s2, -max_scaled));  // exp2(-inf) = 0 on masked pairs
          const auto th = static_cast<std::size_t>((j - k0) % 8 / 2);
          part[th] = started[th] ? part[th] + pt : pt;
          started[th] = true;
          pr[j] = e4m3_round_saturate(pt);
        }
        for (int th = 0; th < kThreadsPerRow; ++th) l[t][th] = first[t] ? part[th] : l[t][th] + part[th];
        for (Eigen::Index s0 = k0; s0 < k1; s0 += static_cast<Eigen::Index>(kStep))
          wgmma_e4m3_step(orow, pr + s0, static_cast<std::size_t>(std::min<Eigen::Index>(kStep, k1 - s0)),
                          v_block.data() + (s0 - k0) * dv, v_block_e.data() + (s0 - k0) * dv, static_cast<std::size_t>(dv),
                          static_cast<std::size_t>(dv));
        first[t] = 0;
      }
    }
    // (4) finalize
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::Index at = c0 + t - r0;
      const float sum = (l[t][0] + l[t][2]) + (l[t][1] + l[t][3]);
      if (first[t] || sum == 0) continue;  // no visible key: O = 0, P = 0
      const float inv = 1.0f / sum;
      const float o_scale = inv * v_descale;
      for (Eigen::Index c = 0; c < dv; ++c) {
        const float x = o(t, c) * o_scale;
        r.o(at, c) = p.output_bf16 ? round_to_bfloat16(x) : x;
      }
      // P as probabilities: P8 2^(max_scaled_block - max_scaled_final) / sum, the factor once per key block
      const float max_final = m[t] * s2 - kMaxOffset;
      for (Eigen::Index b = lo[t]; b < hi[t]; ++b) {
        const double e = std::exp2(static_cast<double>(ms_block(t, b)) - max_final);
        for (Eigen::Index j = b * key_block; j < std::min<Eigen::Index>(lk, (b + 1) * key_block); ++j)
          if (s(t, j) != kNegInf && p8(t, j) != 0) r.p(at, j) = p8(t, j) * e / sum;
      }
    }
  }
  return r;
}

}  // namespace

int fa3_fp8_key_block(Eigen::Index head_dim) {
  return head_dim <= 64 ? 160 : head_dim <= 96 ? 128 : head_dim <= 128 ? 224 : head_dim <= 192 ? 160 : 128;
}

int fa3_fp8_query_tile(Eigen::Index head_dim) { return head_dim <= 96 ? 192 : 128; }

AttentionResult fa3_fp8_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                  const AttentionMask& mask, const Fa3Fp8Params& p) {
  if (q.rows() == 0) return AttentionResult{RowMatrixXd::Zero(0, v.cols()), RowMatrixXd::Zero(0, k.rows())};
  return prepare_fa3_fp8(q, k, v, scale, mask, p)->rows(0, q.rows());
}

std::unique_ptr<PreparedCall> prepare_fa3_fp8(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                              double scale, const AttentionMask& mask, const Fa3Fp8Params& p) {
  require_attention_shapes(q, k, v);
  return std::make_unique<Fa3Call>(q, k, v, scale, mask, p);
}

}  // namespace qattn::ref
