// The KV quantizers' building blocks (Hadamard rotations, the Lloyd-Max codebook, TurboQuant of one vector), what
// their files (reference/src/quantizers/*_kv.cc) share, the registry, and attention over a quantized cache.
#include "qattn/reference/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

#include "qattn/error.h"
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

// ---- what the quantizer files share (kv_files.h) ---------------------------------------------------------------

namespace kv_files {

RowMatrixXd round_fp16(const MatrixView& x) {
  RowMatrixXd out(x.rows(), x.cols());
  RowMatrixXd storage;
  const double* xd = packed_rows(x, storage);
  for (Eigen::Index i = 0; i < x.size(); ++i)
    out.data()[i] = lowp_round(xd[i], fp16_binary16(), LowpRounding::rne, LowpOverflow::saturate);
  return out;
}

void check_heads(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) {
  if (k.size() != v.size() || k.empty()) throw std::invalid_argument("KV quantizer: k and v need the same, nonzero, head count");
  for (std::size_t h = 0; h < k.size(); ++h)
    if (k[h].rows() != v[h].rows()) throw std::invalid_argument("KV quantizer: k and v of a head differ in tokens");
}

}  // namespace kv_files

// ---- the registry: one file per quantizer, reference/src/quantizers/<name>_kv.cc, registered here in this order (the
// order `qattn methods` lists them and reports that run every quantizer follow; the CTest `extending` checks that
// the files and the registry hold the same names) ----------------------------------------------------------------

void register_rtn_kv(KvRegistry& registry);
void register_kivi_kv(KvRegistry& registry);
void register_flashq_kv(KvRegistry& registry);
void register_turboquant_kv(KvRegistry& registry);
void register_saw_kv(KvRegistry& registry);
void register_gear_kv(KvRegistry& registry);
void register_nvfp4_kv(KvRegistry& registry);

const KvRegistry& kv_registry() {
  static const KvRegistry r = [] {
    KvRegistry registry("KV quantizer");
    register_rtn_kv(registry), register_kivi_kv(registry), register_flashq_kv(registry);
    register_turboquant_kv(registry), register_saw_kv(registry), register_gear_kv(registry);
    register_nvfp4_kv(registry);
    return registry;
  }();
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
