#include "qattn/reference/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

#include <Eigen/SVD>

#include "qattn/error.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/quant.h"
#include "qattn/reference/random.h"

namespace qattn::ref {

// ---- building blocks ------------------------------------------------------------------------------------------

namespace {
bool is_power_of_two(Eigen::Index n) { return n > 0 && (n & (n - 1)) == 0; }
}  // namespace

RowMatrixXd hadamard(Eigen::Index n) {
  if (!is_power_of_two(n)) throw std::invalid_argument("hadamard: order " + std::to_string(n) + " is not a power of two");
  RowMatrixXd h = RowMatrixXd::Ones(1, 1);
  while (h.rows() < n) {
    const Eigen::Index m = h.rows();
    RowMatrixXd next(2 * m, 2 * m);
    next << h, h, h, -h;
    h = std::move(next);
  }
  return h;
}

RowMatrixXd block_hadamard(Eigen::Index d, Eigen::Index block) {
  if (!is_power_of_two(block) || d % block != 0)
    throw SpecError("SAW: block " + std::to_string(block) + " must be a power of two dividing head_dim " + std::to_string(d));
  const RowMatrixXd h = hadamard(block) / std::sqrt(static_cast<double>(block));
  RowMatrixXd out = RowMatrixXd::Zero(d, d);
  for (Eigen::Index b = 0; b < d; b += block) out.block(b, b, block, block) = h;
  return out;
}

RowMatrixXd randomized_hadamard(Eigen::Index d, std::uint64_t seed) {
  RowMatrixXd r = hadamard(d) / std::sqrt(static_cast<double>(d));
  Normals g(seed);
  for (Eigen::Index j = 0; j < d; ++j) r.col(j) *= g.sign();
  return r;
}

RowMatrixXd gaussian_matrix(Eigen::Index d, std::uint64_t seed) {
  Normals g(seed);
  RowMatrixXd s(d, d);
  for (Eigen::Index i = 0; i < d; ++i)
    for (Eigen::Index j = 0; j < d; ++j) s(i, j) = g();
  return s;
}

const std::vector<double>& lloyd_max_codebook(int d, int bits) {
  if (d < 3 || bits < 1 || bits > 8)
    throw std::invalid_argument("lloyd_max_codebook: need d >= 3 and bits 1..8, got d = " + std::to_string(d) +
                                ", bits = " + std::to_string(bits));
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::vector<double>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find({d, bits}); it != cache.end()) return it->second;
  // Cumulative integrals F0(x) = int_{-w}^x f and F1(x) = int_{-w}^x t f on a grid of 2^16 steps over [-w, w],
  // w = min(1, 12 / sqrt(d)) (the mass outside is below 1e-30), trapezoid rule, linear between the nodes: the cell
  // masses and centroids are then continuous in the cell edges, and the grid is symmetric about 0.
  const int n = 1 << 16;
  const double w = std::min(1.0, 12.0 / std::sqrt(static_cast<double>(d))), h = 2 * w / n;
  auto f = [&](double t) { return std::pow(std::max(0.0, 1 - t * t), 0.5 * (d - 3)); };
  std::vector<double> f0(n + 1, 0), f1(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    const double t0 = -w + i * h, t1 = -w + (i + 1) * h;
    f0[i + 1] = f0[i] + 0.5 * h * (f(t0) + f(t1));
    f1[i + 1] = f1[i] + 0.5 * h * (t0 * f(t0) + t1 * f(t1));
  }
  auto at = [&](const std::vector<double>& F, double x) {
    const double u = std::clamp((x + w) / h, 0.0, static_cast<double>(n));
    const int i = std::min(static_cast<int>(u), n - 1);
    return F[i] + (u - i) * (F[i + 1] - F[i]);
  };
  const int k = 1 << bits;
  std::vector<double> c(k);
  // Start at the centres of k equal-mass cells (found by bisection on F0).
  for (int j = 0; j < k; ++j) {
    const double target = (j + 0.5) / k * f0[n];
    double lo = -w, hi = w;
    for (int it = 0; it < 200; ++it) (at(f0, 0.5 * (lo + hi)) < target ? lo : hi) = 0.5 * (lo + hi);
    c[j] = 0.5 * (lo + hi);
  }
  for (int iter = 0; iter < 100000; ++iter) {
    double moved = 0, left = -w;
    std::vector<double> next(k);
    for (int j = 0; j < k; ++j) {
      const double right = j + 1 < k ? 0.5 * (c[j] + c[j + 1]) : w;
      const double mass = at(f0, right) - at(f0, left);
      next[j] = mass > 0 ? (at(f1, right) - at(f1, left)) / mass : c[j];
      moved = std::max(moved, std::fabs(next[j] - c[j]));
      left = right;
    }
    c = next;
    if (moved < 1e-13) break;
  }
  return cache[{d, bits}] = c;
}

namespace {

// Nearest centroid of a sorted codebook (ties to the lower one).
double nearest(const std::vector<double>& c, double y) {
  const auto it = std::lower_bound(c.begin(), c.end(), y);
  if (it == c.begin()) return c.front();
  if (it == c.end()) return c.back();
  const double hi = *it, lo = *(it - 1);
  return (y - lo) <= (hi - y) ? lo : hi;
}

}  // namespace

Eigen::VectorXd turboquant_mse(const Eigen::VectorXd& x, const MatrixView& rotation, int bits) {
  const Eigen::Index d = x.size();
  if (bits == 0) return Eigen::VectorXd::Zero(d);
  const double n = x.norm();
  if (n == 0) return Eigen::VectorXd::Zero(d);
  const std::vector<double>& c = lloyd_max_codebook(static_cast<int>(d), bits);
  Eigen::VectorXd y = rotation * (x / n);
  for (Eigen::Index i = 0; i < d; ++i) y(i) = nearest(c, y(i));
  return n * (rotation.transpose() * y);
}

Eigen::VectorXd turboquant_prod(const Eigen::VectorXd& x, const MatrixView& rotation, const MatrixView& s, int bits) {
  const Eigen::Index d = x.size();
  const Eigen::VectorXd xm = turboquant_mse(x, rotation, bits - 1);
  const Eigen::VectorXd r = x - xm;
  const double gamma = r.norm();
  Eigen::VectorXd z = s * r;
  for (Eigen::Index i = 0; i < d; ++i) z(i) = z(i) >= 0 ? 1.0 : -1.0;
  return xm + (std::sqrt(M_PI / 2) / static_cast<double>(d) * gamma) * (s.transpose() * z);
}

// ---- the quantizers -------------------------------------------------------------------------------------------

namespace {

RowMatrixXd round_fp16(const MatrixView& x) {
  RowMatrixXd out(x.rows(), x.cols());
  RowMatrixXd storage;
  const double* xd = packed_rows(x, storage);
  for (Eigen::Index i = 0; i < x.size(); ++i)
    out.data()[i] = lowp_round(xd[i], fp16_binary16(), LowpRounding::rne, LowpOverflow::saturate);
  return out;
}

// The name tables of the quantizers' modes (qattn/method.h's Choice): rtn's grid, FlashQ's integer scale, the
// TurboQuant key variant (true: prod, the QJL residual sketch).
constexpr Choice<bool> kRtnModes[] = {{"asym", false}, {"sym", true}};
constexpr Choice<IntScaleRounding> kZscales[] = {{"round", IntScaleRounding::round}, {"ceil", IntScaleRounding::ceil}};
constexpr Choice<bool> kTurboKeys[] = {{"mse", false}, {"prod", true}};
constexpr Choice<int> kInt8Max[] = {{"119", kFlashQRange}, {"126", kFlashQRangeEq}};
constexpr Choice<bool> kSawV[] = {{"int4", true}, {"fp16", false}};  // true: V stored in INT4
constexpr Choice<bool> kGearBackbones[] = {{"kcvt", false}, {"kivi", true}};  // true: KIVI's groups of g
constexpr Choice<HeadPriority> kPriorities[] = {{"channel-gaps", HeadPriority::channel_gaps},
                                                {"entries", HeadPriority::entries}};

void check_heads(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) {
  if (k.size() != v.size() || k.empty()) throw std::invalid_argument("KV quantizer: k and v need the same, nonzero, head count");
  for (std::size_t h = 0; h < k.size(); ++h)
    if (k[h].rows() != v[h].rows()) throw std::invalid_argument("KV quantizer: k and v of a head differ in tokens");
}

class RtnKv final : public KvQuantizer {
 public:
  explicit RtnKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), group_(p.integer("g")),
        k_gran_(choice_value(p, "k", kGranularities)), v_gran_(choice_value(p, "v", kGranularities)),
        sym_(choice_value(p, "mode", kRtnModes)) {}
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    const QuantGrid grid = sym_ ? QuantGrid::symmetric_bits(bits_) : QuantGrid::unsigned_bits(bits_, QuantMode::asymmetric);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      const QuantizedMatrix qk = quantize(k[h], grid, tiling_for(k_gran_, group_));
      const QuantizedMatrix qv = quantize(v[h], grid, tiling_for(v_gran_, group_));
      out.k.push_back(qk.dequantize());
      out.v.push_back(qv.dequantize());
      out.k_bits += bits_per_element(qk, bits_) / k.size();
      out.v_bits += bits_per_element(qv, bits_) / k.size();
    }
    return out;
  }

 private:
  int bits_;
  Eigen::Index group_;
  Granularity k_gran_, v_gran_;
  bool sym_;
};

class KiviKv final : public KvQuantizer {
 public:
  explicit KiviKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), group_(p.integer("g")), residual_(p.integer("nb")) {}
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    const QuantGrid grid = QuantGrid::unsigned_bits(bits_, QuantMode::min_offset);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      const Eigen::Index L = k[h].rows();
      // Whole groups of g tokens older than the n_b most recent are quantized; the rest stays in fp16.
      const Eigen::Index nq = L > residual_ ? (L - residual_) / group_ * group_ : 0;
      RowMatrixXd kh = round_fp16(k[h]), vh = round_fp16(v[h]);
      double kb = 16 * static_cast<double>(L - nq) * k[h].cols(), vb = 16 * static_cast<double>(L - nq) * v[h].cols();
      if (nq > 0) {
        const QuantizedMatrix qk = quantize(k[h].topRows(nq), grid, Tiling{group_, 1});  // per channel, g tokens
        const QuantizedMatrix qv = quantize(v[h].topRows(nq), grid, Tiling{1, group_});  // per token, g channels
        kh.topRows(nq) = qk.dequantize();
        vh.topRows(nq) = qv.dequantize();
        kb += bits_per_element(qk, bits_) * static_cast<double>(qk.codes.size());
        vb += bits_per_element(qv, bits_) * static_cast<double>(qv.codes.size());
      }
      out.k_bits += kb / static_cast<double>(k[h].size()) / k.size();
      out.v_bits += vb / static_cast<double>(v[h].size()) / k.size();
      out.k.push_back(std::move(kh));
      out.v.push_back(std::move(vh));
    }
    return out;
  }

 private:
  int bits_;
  Eigen::Index group_, residual_;
};

class FlashQKv final : public KvQuantizer {
 public:
  explicit FlashQKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), block_(p.integer("bc")), nh_(static_cast<int>(p.integer("nh"))),
        buffer_(p.integer("nb")), rounding_(choice_value(p, "zscale", kZscales)),
        priority_(choice_value(p, "priority", kPriorities)), int8_max_(choice_value(p, "int8-max", kInt8Max)) {
    if (bits_ != 8 && (bits_ < 2 || bits_ > 4))
      throw SpecError("flashq: bits must be 8, 4, 3 or 2 (3: not in the paper; the same progressive step with 8 levels)");
  }
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    std::vector<double> priority;
    for (std::size_t h = 0; h < k.size(); ++h) priority.push_back(flashq_head_priority(k[h], v[h], priority_));
    const std::vector<int> head_bits = flashq_head_bits(priority, nh_, 2, bits_);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      double kb = 0, vb = 0;
      out.k.push_back(compress(k[h], head_bits[h], &kb));
      out.v.push_back(compress(v[h], head_bits[h], &vb));
      out.k_bits += kb / k.size();
      out.v_bits += vb / k.size();
    }
    return out;
  }

 private:
  // One head's K or V: INT8 blocks of b_c tokens, each compressed to `bits` per channel; *bits_out gets the mean
  // bits per element (codes, the block's fp32 scale, an INT8 scale and zero point per channel of the block).
  // With a decode buffer of n_b tokens, the last n_b tokens are the buffer as a decode step sees it when full: INT8
  // under the universal scale s_u = the largest scale of the compressed blocks, new outliers clamped to +-119.
  RowMatrixXd compress(const MatrixView& x, int bits, double* bits_out) const {
    RowMatrixXd out(x.rows(), x.cols());
    double total = 0, s_u = 0;
    const Eigen::Index buffered = std::min(buffer_, x.rows() - 1 > 0 ? x.rows() - 1 : 0);  // >= 1 compressed token
    const Eigen::Index compressed = x.rows() - buffered;
    for (Eigen::Index r0 = 0; r0 < compressed; r0 += block_) {
      const Eigen::Index n = std::min(block_, compressed - r0);
      const FlashQBlock b = flashq_quantize_block(x.middleRows(r0, n), int8_max_);
      RowMatrixXi32 q = b.values;
      total += 32 + static_cast<double>(bits) * n * x.cols();
      if (bits < 8) {
        q = flashq_decompress(flashq_compress(b.values, bits, rounding_));
        total += 16.0 * x.cols();
      }
      out.middleRows(r0, n) = q.cast<double>() * b.scale;
      s_u = std::max(s_u, b.scale);
    }
    if (buffered > 0) {
      out.bottomRows(buffered) = flashq_quantize_with_scale(x.bottomRows(buffered), s_u, nullptr, int8_max_).cast<double>() * s_u;
      total += 32 + 8.0 * buffered * x.cols();
    }
    *bits_out = total / static_cast<double>(x.size());
    return out;
  }
  int bits_;
  Eigen::Index block_;
  int nh_;
  Eigen::Index buffer_;
  IntScaleRounding rounding_;
  HeadPriority priority_;
  int int8_max_;
};

class TurboQuantKv final : public KvQuantizer {
 public:
  explicit TurboQuantKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), prod_(choice_value(p, "k", kTurboKeys)),
        seed_(static_cast<std::uint64_t>(p.integer("seed"))), first_chunk_(p.integer("first-chunk")) {
    if (prod_ && bits_ < 1) throw SpecError("turboquant: the prod variant needs bits >= 1");
  }
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      out.k.push_back(rows(k[h], prod_));
      out.v.push_back(rows(v[h], false));
      out.k_bits += bits_per_element(k[h].cols(), prod_) / k.size();
      out.v_bits += bits_per_element(v[h].cols(), false) / k.size();
    }
    out.raw_query_rows = first_chunk_;
    return out;
  }

  // A d that is not a power of two (or is below 4) is zero-padded to D, the next power of two >= 4: the rotation,
  // codebook and sketch are D-dimensional, and D codes are stored for d values.
  static Eigen::Index padded(Eigen::Index d) {
    Eigen::Index n = 4;
    while (n < d) n *= 2;
    return n;
  }
  double bits_per_element(Eigen::Index d, bool prod) const {
    return (static_cast<double>(bits_) * padded(d) + (prod ? 64.0 : 32.0)) / static_cast<double>(d);
  }

 private:
  RowMatrixXd rows(const MatrixView& x, bool prod) const {
    const Eigen::Index d = x.cols(), n = padded(d);
    // One rotation (and sketch) per dimension, shared by all heads and tokens; the seed fixes them.
    const RowMatrixXd rot = randomized_hadamard(n, seed_);
    const RowMatrixXd s = prod ? gaussian_matrix(n, seed_ + 1) : RowMatrixXd();
    RowMatrixXd out(x.rows(), d);
    Eigen::VectorXd row = Eigen::VectorXd::Zero(n);
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      row.head(d) = x.row(t).transpose();
      const Eigen::VectorXd q = prod ? turboquant_prod(row, rot, s, bits_) : turboquant_mse(row, rot, bits_);
      out.row(t) = q.head(d).transpose();
    }
    return out;
  }
  int bits_;
  bool prod_;
  std::uint64_t seed_;
  Eigen::Index first_chunk_;
};

class SawKv final : public KvQuantizer {
 public:
  explicit SawKv(const ParamMap& p)
      : block_(p.integer("block")), rotate_v_(p.boolean("rotate-v")), v_int4_(choice_value(p, "v", kSawV)),
        first_chunk_(p.integer("first-chunk")) {
    if (rotate_v_ && !v_int4_) throw SpecError("saw: rotate-v=true needs v=int4 (a rotated V is stored in INT4)");
  }
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    KvQuantized out;
    const Eigen::Index d = k.front().cols(), dv = v.front().cols();
    out.rotation = block_hadamard(d, block_);
    out.v_rotated = rotate_v_;
    out.raw_query_rows = first_chunk_;
    if (rotate_v_ && dv != d) throw SpecError("SAW: rotating V needs d_v = d");
    for (std::size_t h = 0; h < k.size(); ++h) {
      if (k[h].cols() != d) throw SpecError("SAW: heads of one layer need the same head_dim");
      out.k.push_back(int4_tokens(k[h] * out.rotation));  // rows: k' = H k (H symmetric)
      out.k_bits += (4 + 64.0 / d) / k.size();
      if (!v_int4_) {  // qattn's earlier reading (@fp16-v): V kept in fp16
        out.v.push_back(round_fp16(v[h]));
        out.v_bits += 16.0 / k.size();
        continue;
      }
      out.v.push_back(int4_tokens(rotate_v_ ? RowMatrixXd(v[h] * out.rotation) : RowMatrixXd(v[h])));  // store_kv: V always INT4
      out.v_bits += (4 + 64.0 / dv) / k.size();
    }
    return out;
  }

 private:
  // Per token: scale = max(max - min, 1e-8) / 15, zero = -min / scale, code = clamp(round(x / scale + zero), 0, 15)
  // (round half to even, as torch.round), packed two per byte; x^ = (code - zero) scale.
  static RowMatrixXd int4_tokens(const MatrixView& x) {
    RowMatrixXd out(x.rows(), x.cols());
    std::vector<std::int32_t> codes(static_cast<std::size_t>(x.cols()));
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      const double mn = x.row(t).minCoeff(), mx = x.row(t).maxCoeff();
      const double scale = std::max(mx - mn, 1e-8) / 15, zero = -mn / scale;
      for (Eigen::Index c = 0; c < x.cols(); ++c)
        codes[c] = static_cast<std::int32_t>(std::clamp(std::nearbyint(x(t, c) / scale + zero), 0.0, 15.0));
      const std::vector<std::int32_t> stored = unpack_codes(pack_codes(codes, 4, false), codes.size(), 4, false);
      for (Eigen::Index c = 0; c < x.cols(); ++c) out(t, c) = (stored[c] - zero) * scale;
    }
    return out;
  }
  Eigen::Index block_;
  bool rotate_v_, v_int4_;
  Eigen::Index first_chunk_;
};

class GearKv final : public KvQuantizer {
 public:
  explicit GearKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), kivi_(choice_value(p, "backbone", kGearBackbones)),
        group_(p.integer("g")), rank_(p.integer("rank")), residual_(p.integer("nb")) {}
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      const Eigen::Index L = k[h].rows();
      // The tokens older than the n_b most recent are compressed (KIVI backbone: whole groups of g of them); the
      // rest stays in fp16.
      Eigen::Index nq = L > residual_ ? L - residual_ : 0;
      if (kivi_) nq = nq / group_ * group_;
      double kb = 0, vb = 0;
      out.k.push_back(compress(k[h], nq, true, kb));
      out.v.push_back(compress(v[h], nq, false, vb));
      out.k_bits += kb / static_cast<double>(k[h].size()) / k.size();
      out.v_bits += vb / static_cast<double>(v[h].size()) / k.size();
    }
    return out;
  }

 private:
  // Rows [0, nq) of x: the backbone's uniform min-offset grid (KCVT: K per channel over the nq tokens, V per token;
  // KIVI: K per channel in groups of g tokens, V per token in groups of g channels), then the rank-r truncated SVD of
  // the residual X - D, its factors U_r Sigma_r and V_r stored in fp16. Rows [nq, L) in fp16. `bits` gets the
  // stored bits: codes, scales and offsets, factors, fp16 rows.
  RowMatrixXd compress(const MatrixView& x, Eigen::Index nq, bool is_key, double& bits) const {
    const Eigen::Index d = x.cols();
    RowMatrixXd out = round_fp16(x);
    bits = 16.0 * static_cast<double>(x.rows() - nq) * static_cast<double>(d);
    if (nq == 0) return out;
    const QuantGrid grid = QuantGrid::unsigned_bits(bits_, QuantMode::min_offset);
    const Tiling tiling = is_key ? Tiling{kivi_ ? group_ : nq, 1} : Tiling{1, kivi_ ? group_ : d};
    const QuantizedMatrix q = quantize(x.topRows(nq), grid, tiling);
    const RowMatrixXd backbone = q.dequantize();
    bits += bits_per_element(q, bits_) * static_cast<double>(q.codes.size());
    const Eigen::Index r = std::min({rank_, nq, d});
    if (r == 0) {
      out.topRows(nq) = backbone;
      return out;
    }
    const RowMatrixXd residual = RowMatrixXd(x.topRows(nq)) - backbone;
    const Eigen::BDCSVD<Eigen::MatrixXd> svd(residual, Eigen::ComputeThinU | Eigen::ComputeThinV);
    const RowMatrixXd a = round_fp16(RowMatrixXd(svd.matrixU().leftCols(r) * svd.singularValues().head(r).asDiagonal()));
    const RowMatrixXd b = round_fp16(RowMatrixXd(svd.matrixV().leftCols(r)));
    out.topRows(nq) = backbone + a * b.transpose();
    bits += 16.0 * static_cast<double>(r) * static_cast<double>(nq + d);
    return out;
  }
  int bits_;
  bool kivi_;
  Eigen::Index group_, rank_, residual_;
};

}  // namespace

// kv_nvfp4.cc
std::unique_ptr<KvQuantizer> make_nvfp4_kv(const ParamMap& p);
std::vector<std::string> nvfp4_kv_reads();
std::vector<std::string> nvfp4_kv_globals();

namespace {

KvRegistry build_kv_registry() {
  KvRegistry r("KV quantizer");
  const std::vector<std::string> grans = choice_names(kGranularities);
  r.add({{"rtn", "round-to-nearest baseline: one uniform grid for K and V at a named granularity",
          {int_param("bits", "4", "code bits", 2, 8),
           choice_param("k", "channel", "K granularity", grans),
           choice_param("v", "token", "V granularity", grans),
           int_param("g", "32", "group size (channels of a token for group, tokens for block)", 1, 1 << 20),
           choice_param("mode", "asym", "asym: integer zero point, range holding 0; sym: +-(2^(b-1) - 1)", choice_names(kRtnModes))},
          {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<RtnKv>(p); }});
  r.add({{"kivi", "KIVI: K per channel in groups of g tokens, V per token in groups of g channels, min-offset grids; "
                  "the n_b most recent tokens (and a last partial group) stay in fp16",
          {int_param("bits", "2", "code bits", 1, 8), int_param("g", "32", "group size G", 1, 1 << 20),
           int_param("nb", "32", "residual: most recent tokens kept in fp16 (KIVI's R; 128 in the paper, which "
                                 "would keep all of a 128-token dump)", 0, 1 << 30)},
          {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<KiviKv>(p); }});
  r.add({{"flashq", "TurboAttention FlashQ cache: INT8 per block of b_c tokens (/119), progressive INT4/INT2 per "
                    "channel (integer scale, zero point); the n_h lowest-priority heads at 2 bits",
          {int_param("bits", "4", "cache bits: 8 (INT8 kept), 4, 3 or 2 (3: not in the paper, for comparisons at 3 bits)", 2, 8),
           int_param("bc", "64", "tokens per block b_c", 1, 1 << 20),
           int_param("nh", "0", "heads of the layer at 2 bits (lowest priority gap x std)", 0, 1 << 20),
           int_param("nb", "0", "decode buffer: the last n_b tokens in INT8 under the universal scale (max block "
                                "scale of the compressed tokens), clamped to +-119; 0 = none", 0, 1 << 30),
           choice_param("zscale", "round", "integer scale of the step: round (Eq. 9) or ceil", choice_names(kZscales)),
           choice_param("priority", "channel-gaps", "Eq. 11's std: of the channel-wise gaps (the text) or of all entries",
                        choice_names(kPriorities)),
           choice_param("int8-max", "119", "INT8 range R: 119 (Algorithm 1) or 126 (the scale equation after Eq. 3)",
                        choice_names(kInt8Max))},
          {{"mixed", {{"bits", "4"}, {"nh", "2"}}, "head-wise mixed 2/4 bits: 2 of the layer's heads at 2 bits"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<FlashQKv>(p); }});
  r.add({{"turboquant", "TurboQuant: randomized Hadamard rotation, per-vector norm, Lloyd-Max codebook of the "
                        "rotated coordinate; prod: b-1 bits + 1-bit QJL residual sketch (unbiased inner products)",
          {int_param("bits", "3", "bits per coordinate", 1, 8),
           choice_param("k", "mse", "K variant (V always uses mse)", choice_names(kTurboKeys)),
           int_param("seed", "1", "seed of the rotation signs (and of the QJL matrix: seed + 1)", 0, 1e15),
           int_param("first-chunk", "0", "serving path (FlashInfer): the queries of the first prompt chunk, this many "
                                         "tokens, attend to the raw K and V; the later ones read the cache. 0: every "
                                         "query reads the cache", 0, 1 << 30)},
          {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<TurboQuantKv>(p); }});
  r.add({{"saw", "SAW-INT4: block-diagonal normalized Hadamard on K (V optionally), K and V per-token asymmetric "
                 "INT4 packed two per byte; Q rotated alike, O rotated back when V is",
          {int_param("block", "16", "Hadamard block order (a power of two dividing head_dim)", 1, 1 << 20),
           choice_param("v", "int4", "V cache: int4 per token (the primer's store_kv) or fp16 (qattn's earlier reading)",
                        choice_names(kSawV)),
           ParamInfo{"rotate-v", ParamType::boolean, "false", "rotate V too before INT4 (rotate_v; O rotated back)", {}},
           int_param("first-chunk", "0", "serving path (FlashInfer): the queries of the first prompt chunk, this many "
                                         "tokens, attend to the raw K and V; the later ones read the cache. 0: every "
                                         "query reads the cache", 0, 1 << 30)},
          {{"fp16-v", {{"v", "fp16"}, {"rotate-v", "false"}}, "V kept in fp16, K alone in INT4 (qattn's earlier reading)"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<SawKv>(p); }});
  r.add({{"gear", "GEAR-L: a uniform min-offset backbone (KCVT: K per channel, V per token; or KIVI's groups) plus the "
                  "rank-r truncated SVD of its residual in fp16; the n_b most recent tokens in fp16",
          {int_param("bits", "4", "backbone code bits", 1, 8),
           choice_param("backbone", "kcvt", "kcvt: K per channel, V per token, over every compressed token; kivi: "
                                            "groups of g tokens (K) and g channels (V)", choice_names(kGearBackbones)),
           int_param("g", "64", "KIVI backbone group size g", 1, 1 << 20),
           int_param("rank", "4", "rank r of the residual's low-rank part (per head, for K and V each); 0: none", 0, 1 << 20),
           int_param("nb", "64", "residual: most recent tokens kept in fp16", 0, 1 << 30)},
          {{"kcvt", {{"bits", "4"}, {"backbone", "kcvt"}, {"rank", "4"}, {"nb", "64"}},
            "TurboAttention Table 2's GEAR-L_{r=4}^{(KCVT)} at 4 bits"},
           {"kivi", {{"bits", "3"}, {"backbone", "kivi"}, {"g", "64"}, {"rank", "4"}, {"nb", "64"}},
            "TurboAttention Table 2's GEAR-L_{r=4}^{(KIVI)} at 3 bits"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<GearKv>(p); }});
  r.add({{"nvfp4", "NVFP4: E2M1 codes per block of 16 channels, UE4M3 block scales under a float32 global scale "
                   "(Transformer Engine's recipe); read exactly, through bf16, or through bf16 then an FP8 attention's "
                   "E4M3",
          {choice_param("read", "exact", "what attention reads: exact (e2m1 x s_b x S_dec), bf16 (rounded to "
                                         "bfloat16), bf16-e4m3 (then E4M3 under a per-tensor scale amax/448)",
                        nvfp4_kv_reads()),
           choice_param("global", "layer", "the global scale's extent: the layer's K (or V) over all heads, or each "
                                           "head", nvfp4_kv_globals())},
          {{"fp8-attention", {{"read", "bf16-e4m3"}},
            "dequantised to bf16, then quantised to E4M3 by an FP8 attention: the double rounding of a "
            "dequantise-then-FP8 serving path"}},
          nullptr},
         make_nvfp4_kv});
  return r;
}

}  // namespace

const KvRegistry& kv_registry() {
  static const KvRegistry r = build_kv_registry();
  return r;
}

namespace {

// Rows [0, n) of a and rows [0, L - n) of b, one above the other; p_int where both have it at one scale.
AttentionResult stack_rows(AttentionResult a, const AttentionResult& b) {
  AttentionResult r;
  if (a.o_f32.size() && b.o_f32.size()) {  // the fused kernels' float32 O (EngineOptions::o_float32)
    r.o_f32.resize(a.o_f32.rows() + b.o_f32.rows(), b.o_f32.cols());
    r.o_f32 << a.o_f32, b.o_f32;
  } else {
    r.o.resize(a.o.rows() + b.o.rows(), b.o.cols());
    r.o << a.o, b.o;
  }
  r.p.resize(a.p.rows() + b.p.rows(), b.p.cols());
  r.p << a.p, b.p;
  if (a.p_int.size() && b.p_int.size() && a.p_scale == b.p_scale) {
    r.p_int.resize(a.p_int.rows() + b.p_int.rows(), b.p_int.cols());
    r.p_int << a.p_int, b.p_int;
    r.p_scale = b.p_scale, r.p_dtype = b.p_dtype;
  }
  return r;
}

}  // namespace

std::vector<AttentionResult> attention_with_kv(const Method& method, const KvQuantizer& kv,
                                               const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                               const std::vector<MatrixView>& v, double scale,
                                               const AttentionMask& mask, KvQuantized* used) {
  KvQuantized c = kv.apply(k, v);
  const Eigen::Index lq = q.empty() ? 0 : q.front().rows();
  const Eigen::Index raw = std::min(c.raw_query_rows, lq);
  // The queries after the first chunk (all of them without one): Q rotated as K was, on the cache.
  std::vector<MatrixView> q_rest;
  std::vector<RowMatrixXd> qr;
  for (const MatrixView& x : q) {
    if (c.rotation.size() > 0) qr.push_back(x.middleRows(raw, lq - raw) * c.rotation);
    else q_rest.push_back(x.middleRows(raw, lq - raw));
  }
  std::vector<AttentionResult> r;
  if (raw == 0 || raw < lq) {
    r = method.attention_heads(qr.empty() ? q_rest : views(qr), views(c.k), views(c.v), scale,
                               raw > 0 ? mask.rows(raw, lq - raw, lq) : mask);
    if (c.v_rotated)
      for (AttentionResult& a : r) a.o = a.o * c.rotation.transpose();
  }
  if (raw > 0) {  // the first prompt chunk on the raw K and V (FlashInfer's ragged prefill of raw_q, raw_k, raw_v)
    std::vector<MatrixView> q_first;
    for (const MatrixView& x : q) q_first.push_back(x.topRows(raw));
    std::vector<AttentionResult> first = method.attention_heads(q_first, k, v, scale, mask.rows(0, raw, lq));
    if (raw < lq)
      for (std::size_t h = 0; h < first.size(); ++h) first[h] = stack_rows(std::move(first[h]), r[h]);
    r = std::move(first);
  }
  if (used) *used = std::move(c);
  return r;
}

}  // namespace qattn::ref
