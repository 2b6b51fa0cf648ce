#include "qattn/reference/fa3_fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
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
    q8 = quantize(q, p.scaling, "Q");
    const Fp8Tensor k8 = quantize(k, p.scaling, "K");
    v8 = quantize(v, p.scaling, "V");
    // S = Q8 K8^T runs over d with the keys as the step's columns: K8 transposed [d, L_k], with its exponents.
    k8t.resize(static_cast<std::size_t>(d * lk));
    k8te.resize(k8t.size());
    for (Eigen::Index j = 0; j < lk; ++j)
      for (Eigen::Index c = 0; c < d; ++c) {
        const float x = k8.values[static_cast<std::size_t>(j * d + c)];
        k8t[static_cast<std::size_t>(c * lk + j)] = x;
        k8te[static_cast<std::size_t>(c * lk + j)] = wgmma_e4m3_exponent(x);
      }
    v8e.resize(v8.values.size());
    for (std::size_t i = 0; i < v8e.size(); ++i) v8e[i] = wgmma_e4m3_exponent(v8.values[i]);
    // The host's softmax_scale_log2 (float = float * double), then the kernel's *= q_descale * k_descale.
    const float softmax_scale_log2 = static_cast<float>(static_cast<double>(static_cast<float>(scale)) *
                                                        std::numbers::log2e);
    s2 = softmax_scale_log2 * (q8.descale * k8.descale);
  }

 private:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index rows) const override;

  const Fa3Fp8Params p;
  const AttentionMask& mask;
  const Eigen::Index lq, lk, d, dv;
  int key_block = 128, query_tile = 128;
  Fp8Tensor q8, v8;
  std::vector<float> k8t;
  std::vector<std::int8_t> k8te, v8e;
  float s2 = 0;
};

AttentionResult Fa3Call::rows_impl(Eigen::Index r0, Eigen::Index rows) const {
  AttentionResult r;
  r.o = RowMatrixXd::Zero(rows, dv);
  r.p = RowMatrixXd::Zero(rows, lk);
  const Eigen::Index blocks = (lk + key_block - 1) / key_block;
  std::vector<float> s(static_cast<std::size_t>(lk)), p8(static_cast<std::size_t>(lk)), m_at(static_cast<std::size_t>(lk));
  std::vector<float> o(static_cast<std::size_t>(dv));
  RowMatrixXb tile_visible;
  Eigen::Index tile = -1, block_lo = 0, block_hi = 0;  // the query tile of the rows, and its key blocks [lo, hi)
  for (Eigen::Index i = r0; i < r0 + rows; ++i) {
    const Eigen::Index at = i - r0;
    if (i / query_tile != tile) {  // the kernel visits, for a tile of query rows, the key blocks it can see
      tile = i / query_tile;
      const Eigen::Index t0 = tile * query_tile, tn = std::min<Eigen::Index>(query_tile, lq - t0);
      tile_visible = mask.empty() ? RowMatrixXb::Constant(tn, lk, true) : mask.rows(t0, tn, lq).visible(tn, lk);
      block_lo = blocks, block_hi = 0;
      for (Eigen::Index b = 0; b < blocks; ++b) {
        const Eigen::Index k0 = b * key_block, kn = std::min<Eigen::Index>(key_block, lk - k0);
        if (tile_visible.middleCols(k0, kn).any()) block_lo = std::min(block_lo, b), block_hi = b + 1;
      }
    }
    const auto visible = tile_visible.row(i - tile * query_tile);
    // (2) S of row i on the wgmma: d in steps of 32 from zero
    std::fill(s.begin(), s.end(), 0.0f);
    const float* qi = q8.values.data() + i * d;
    for (Eigen::Index c0 = 0; c0 < d; c0 += static_cast<Eigen::Index>(kStep))
      wgmma_e4m3_step(s.data(), qi + c0, static_cast<std::size_t>(std::min<Eigen::Index>(kStep, d - c0)),
                      k8t.data() + c0 * lk, k8te.data() + c0 * lk, static_cast<std::size_t>(lk),
                      static_cast<std::size_t>(lk));
    for (Eigen::Index j = 0; j < lk; ++j) {
      if (!visible(j)) s[j] = kNegInf;
      else if (!std::isfinite(s[j] * s2)) throw_logit_overflow("fa3-fp8", "float32", i, j);  // S s2 in the exp2
    }
    // (3) the key blocks, last first
    float m = kNegInf;
    std::array<float, kThreadsPerRow> l{};
    std::fill(o.begin(), o.end(), 0.0f);
    bool first = true;
    for (Eigen::Index b = block_hi - 1; b >= block_lo; --b) {
      const Eigen::Index k0 = b * key_block, k1 = std::min<Eigen::Index>(lk, k0 + key_block);
      const float m_prev = m;
      for (Eigen::Index j = k0; j < k1; ++j) m = std::max(m, s[j]);
      if (!first) {
        const float m_cur = m == kNegInf ? 0.0f : m;  // Check_inf
        const float r = exp2_f32((m_prev - m_cur) * s2);
        for (float& x : l) x *= r;
        for (float& x : o) x *= r;
      }
      const float max_scaled = m == kNegInf ? 0.0f : m * s2 - kMaxOffset;
      std::array<float, kThreadsPerRow> part{};
      std::array<bool, kThreadsPerRow> started{};
      for (Eigen::Index j = k0; j < k1; ++j) {
        const float pt = exp2_f32(std::fma(s[j], s2, -max_scaled));  // exp2(-inf) = 0 on masked pairs
        const auto t = static_cast<std::size_t>((j - k0) % 8 / 2);
        part[t] = started[t] ? part[t] + pt : pt;
        started[t] = true;
        p8[j] = e4m3_round_saturate(pt);
        m_at[j] = max_scaled;
      }
      for (int t = 0; t < kThreadsPerRow; ++t) l[t] = first ? part[t] : l[t] + part[t];
      for (Eigen::Index s0 = k0; s0 < k1; s0 += static_cast<Eigen::Index>(kStep))
        wgmma_e4m3_step(o.data(), p8.data() + s0, static_cast<std::size_t>(std::min<Eigen::Index>(kStep, k1 - s0)),
                        v8.values.data() + s0 * dv, v8e.data() + s0 * dv, static_cast<std::size_t>(dv),
                        static_cast<std::size_t>(dv));
      first = false;
    }
    // (4) finalize
    const float sum = (l[0] + l[2]) + (l[1] + l[3]);
    if (first || sum == 0) continue;  // no visible key: O = 0, P = 0
    const float inv = 1.0f / sum;
    const float o_scale = inv * v8.descale;
    for (Eigen::Index c = 0; c < dv; ++c) {
      const float x = o[c] * o_scale;
      r.o(at, c) = p.output_bf16 ? round_to_format(x, kBfloat16) : x;
    }
    // P as probabilities: P8 2^(max_scaled_at - max_scaled_final) / sum (the kernel never forms it)
    const float max_final = m * s2 - kMaxOffset;
    for (Eigen::Index j = 0; j < lk; ++j)
      if (s[j] != kNegInf && p8[j] != 0)
        r.p(at, j) = p8[j] * std::exp2(static_cast<double>(m_at[j]) - max_final) / sum;
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
