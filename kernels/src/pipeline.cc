// The fused IntAttention driver: packs K^T and V once, then runs row blocks (each thread its own buffers, reused
// across blocks) through qk GEMM -> IndexSoftmax per row -> pv GEMM -> dequantisation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/kernel_variants.h"
#include "qattn/int_attention.h"
#include "qattn/parallel.h"
#include "qattn/quantize.h"
#include "qattn/tensor_io.h"

namespace qattn {
namespace {

Eigen::Index round_up(Eigen::Index x, Eigen::Index m) { return (x + m - 1) / m * m; }

// The row stride n of packed K^T, S and P (the GEMMs' n for Q.K^T and k for P.V): L_k rounded up to the variant's
// multiple m (kernel_variants.h: 16, or 64 where the P.V tiles read 64-byte rows of P), plus m when that is a multiple
// of 256. A Q.K^T column panel reads d / 4 groups of packed K^T rows n * 4 bytes apart; with n a multiple of 256 that
// stride is a multiple of 1 KiB, so the groups fall on at most 4 of the L1's 64 sets and evict each other before the
// panel's next tile reads them (at L_k = 2048 the tile ran at 64 % of the peak instead of 84 %). The extra columns of
// K^T are zeros: their S and P columns are computed, never read, and P stays 0 there.
Eigen::Index key_stride(Eigen::Index lk, Eigen::Index m) {
  const Eigen::Index n = round_up(lk, m);
  return n % 256 == 0 ? n + m : n;
}

// Uninitialised arrays on 64-byte boundaries for every operand and result the GEMMs read or write. A row that starts
// mid-line costs its loads and stores two cache lines each: with the default allocator's 16-byte alignment the AMX
// Q.K^T block ran at 0.47x the speed it has on aligned rows (docs/kernels.md).
struct FreeAligned {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using AlignedArray = std::unique_ptr<T[], FreeAligned>;
template <typename T>
AlignedArray<T> aligned_array(std::size_t n) {
  void* p = std::aligned_alloc(64, std::max<std::size_t>((n * sizeof(T) + 63) / 64 * 64, 64));
  if (!p) throw std::bad_alloc();
  return AlignedArray<T>(static_cast<T*>(p));
}

// The default rows per block for L_k keys: 64, or as many multiples of 8 (at least 16) as keep a block of S, rows x
// L_k int32 with L_k rounded up to 16 (the key stride's 16 extra columns past a multiple of 256 are left out, so
// that 8192 keys still take 64 rows), within 2 MiB. The row kernels read each row of S back after Q.K^T has written
// the whole block; past the L2 that read costs more than the arithmetic, and a block of 64 rows is 4 MiB at
// L_k = 16384. There 32 rows ran 2-7 % faster (docs/kernels.md); up to 8192 fewer rows gained nothing.
Eigen::Index auto_block_rows(Eigen::Index lk) {
  if (lk <= 0) return 64;  // no keys: no S at all
  const Eigen::Index fit = (Eigen::Index{2} << 20) / (round_up(lk, 16) * Eigen::Index{sizeof(std::int32_t)}) / 8 * 8;
  return std::clamp<Eigen::Index>(fit, 16, 64);
}

std::vector<std::int8_t> quantize_per_tensor(const MatrixView& x, double* scale) {
  std::vector<std::int8_t> q(static_cast<std::size_t>(x.size()));
  RowMatrixXd storage;
  *scale = quantize_int8_symmetric(std::span<const double>(packed_rows(x, storage), q.size()), std::span<std::int8_t>(q));
  return q;
}

// One row under group-wise clipping (qattn/key_groups.h): each block's maximum m_j over its visible keys below
// `limit`, the row's mu, then each block's E by the ISA's index_exp against its anchor (global: min(M_j, m_j + c_j),
// which clips the same entries as M_j and keeps anchor - a below 2^31; offset: m_j with the LUT shifted by k_j), and
// one normalisation over the row.
void grouped_softmax_row(const kernels::KernelVariant& f, const std::int32_t* s, const bool* valid, Eigen::Index limit,
                         Eigen::Index keys, const IntAttentionConfig& cfg,
                         const std::vector<kernels::IndexSoftmaxTables>& tables, std::uint8_t* p) {
  std::fill(p, p + keys, std::uint8_t{0});
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
  const Eigen::Index kb = cfg.key_block, blocks = (limit + kb - 1) / kb;
  std::int64_t maxima[64];
  std::vector<std::int64_t> heap;
  std::int64_t* m = maxima;
  if (blocks > 64) {
    heap.resize(static_cast<std::size_t>(blocks));
    m = heap.data();
  }
  std::int64_t mu = kNone;
  for (Eigen::Index g = 0; g < blocks; ++g) {
    std::int64_t mg = kNone;
    for (Eigen::Index j = g * kb; j < std::min(limit, (g + 1) * kb); ++j)
      if (!valid || valid[j]) mg = std::max<std::int64_t>(mg, s[j]);
    m[g] = mg;
    if (mg != kNone) mu = std::max(mu, cfg.key_ratio[g] * mg);
  }
  if (mu == kNone) return;  // nothing visible: zeros, no division
  std::int64_t sum = 0;
  for (Eigen::Index g = 0; g < blocks; ++g) {
    if (m[g] == kNone) continue;
    const Eigen::Index j0 = g * kb, n = std::min(limit, j0 + kb) - j0;
    const bool* vg = valid ? valid + j0 : nullptr;
    const kernels::IndexSoftmaxTables& t = tables[static_cast<std::size_t>(g)];
    if (cfg.group_max == GroupMax::global) {
      const std::int64_t anchor = std::min(key_group_anchor(mu, cfg.key_ratio[g]), m[g] + t.c_int);
      sum += f.index_exp(s + j0, vg, n, static_cast<std::int32_t>(anchor), t, p + j0);
      continue;
    }
    const int shift = key_group_offset(mu - cfg.key_ratio[g] * m[g], cfg.group_offset_scale, cfg.softmax.bits);
    if (shift == 0) {
      sum += f.index_exp(s + j0, vg, n, static_cast<std::int32_t>(m[g]), t, p + j0);
      continue;
    }
    kernels::IndexSoftmaxTables shifted = t;  // LUT[min(i + k_j, last)]: the offset reading's index, in the table
    const int last = (1 << cfg.softmax.bits) - 1;
    for (int i = 0; i <= last; ++i) shifted.lut[i] = t.lut[std::min(i + shift, last)];
    sum += f.index_exp(s + j0, vg, n, static_cast<std::int32_t>(m[g]), shifted, p + j0);
  }
  kernels::index_normalise_u8(p, limit, sum, cfg.softmax);
}

}  // namespace

IntAttentionKernels int_attention_kernels(Isa isa, IntPipeline pipeline, bool key_groups) {
  const kernels::KernelVariant& v = kernels::kernel_variant(isa);
  std::string softmax(pipeline == IntPipeline::quant_only ? v.softmax_f32_name : v.softmax_name);
  if (pipeline == IntPipeline::intattention && key_groups)
    softmax = std::string(v.index_exp_name) + " per key block + index_normalise_u8";
  else if (pipeline == IntPipeline::intattention && v.softmax_given_max)  // rows with a padding mask: the row kernel
    softmax = std::string(v.softmax_given_max_name) + " (maximum from the Q.K^T epilogue; masked rows: " + softmax + ")";
  const std::string_view row = pipeline == IntPipeline::quant_only ? v.softmax_f32_name : v.softmax_name;
  return {std::string(v.qk_name), softmax, std::string(v.pv_name), std::string(row)};
}

void int_attention_softmax_rows(Isa isa, IntPipeline pipeline, const IndexSoftmaxParams& softmax, std::int64_t c_int,
                                float alpha, const std::int32_t* s, Eigen::Index rows, Eigen::Index keys,
                                std::uint8_t* p) {
  if (!isa_available(isa))
    throw std::invalid_argument("int_attention: ISA " + std::string(isa_name(isa)) + " is not available here");
  const kernels::KernelVariant& f = kernels::kernel_variant(isa);
  const kernels::IndexSoftmaxTables tables =
      pipeline == IntPipeline::intattention ? kernels::IndexSoftmaxTables::make(softmax, c_int) : kernels::IndexSoftmaxTables{};
  std::vector<float> scratch(static_cast<std::size_t>(keys));
  for (Eigen::Index i = 0; i < rows; ++i) {
    if (pipeline == IntPipeline::quant_only) f.softmax_f32(s + i * keys, nullptr, keys, keys, alpha, scratch.data(), p + i * keys);
    else f.softmax(s + i * keys, nullptr, keys, keys, tables, p + i * keys);
  }
}

Eigen::Index int_attention_block_rows(const IntAttentionConfig& cfg, Eigen::Index lk) {
  if (cfg.block_rows > 0) return cfg.block_rows;
  const Eigen::Index rows = kernels::kernel_variant(cfg.isa).block_rows;
  return rows > 0 ? rows : auto_block_rows(lk);
}

namespace {

void check_fused_call(const Int8View& q, const Int8View& k, const Int8View& v, const IntAttentionConfig& cfg) {
  if (q.cols != k.cols || k.rows != v.rows)
    throw std::invalid_argument("int_attention: shapes q [" + std::to_string(q.rows) + ", " + std::to_string(q.cols) +
                                "], k [" + std::to_string(k.rows) + ", " + std::to_string(k.cols) + "], v [" +
                                std::to_string(v.rows) + ", " + std::to_string(v.cols) + "] do not fit");
  if (cfg.block_rows < 0 || cfg.s_rows < 0 || cfg.threads < 1)
    throw std::invalid_argument(
        "int_attention: block_rows and s_rows must be >= 0 (0: the library's choice) and threads >= 1");
  if (!isa_available(cfg.isa))
    throw std::invalid_argument("int_attention: ISA " + std::string(isa_name(cfg.isa)) + " is not available here");
}

// What one fused call fixes before its row blocks: the variant, the shapes and strides, the stages it runs, the
// softmax tables, K^T and V packed once, and the block schedule. The passes below (run_materialised,
// run_row_blocks) read it and write only O, and P where the call asks for it. Its memory and overflow bounds are
// docs/kernels.md's.
struct FusedCall {
  FusedCall(const Int8View& q, const Int8View& k, const Int8View& v, double scale, const IntAttentionConfig& cfg,
            float* o);

  // The softmax of one row of S (query `row`) into P: Quant-Only's float row, group-wise clipping's blocks, or the
  // variant's IndexSoftmax row, over the row's visible keys (causal limit, padding mask).
  void softmax_row(const std::int32_t* s_row, float* f_scratch, Eigen::Index row, std::uint8_t* p_row) const {
    const Eigen::Index limit = cfg.causal ? row + lk - lq + 1 : lk;
    const bool* valid = cfg.valid ? cfg.valid + row * lk : nullptr;
    if (quant_only) f.softmax_f32(s_row, valid, limit, lk, alpha, f_scratch, p_row);
    else if (grouped)
      grouped_softmax_row(f, s_row, valid, std::clamp<Eigen::Index>(limit, 0, lk), lk, cfg, block_tables, p_row);
    else f.softmax(s_row, valid, limit, lk, tables, p_row);
  }
  void pack(const Int8View& k, const Int8View& v);
  void dequantise(const std::int32_t* acc, Eigen::Index r0, Eigen::Index rows) const {
    f.dequantise(acc, rows, dv, dv16, out_scale, p_scale, o + r0 * dv, dv);
  }
  // Runs body(block) for every block on the threads (qattn/parallel.h); returns when all are done.
  template <typename Body>
  void parallel_blocks(Body&& body) const {
    parallel_for(static_cast<std::size_t>(blocks), threads, [&](std::size_t b) { body(static_cast<Eigen::Index>(b)); });
  }
  // Q's rows [r0, r0 + rows) into qb, each zero-padded from d to d4 bytes (the padding written by the caller).
  void copy_q_rows(Eigen::Index r0, Eigen::Index rows, std::int8_t* qb) const {
    for (Eigen::Index i = 0; i < rows; ++i) std::copy_n(q.values + (r0 + i) * d, d, qb + i * d4);
  }

  const Int8View& q;
  const IntAttentionConfig& cfg;
  const kernels::KernelVariant& f;
  float* o;
  Eigen::Index lq, lk, d, dv;
  bool quant_only, grouped;  // grouped: group-wise clipping, one table per key block (its c_int), shared LUT values
  kernels::IndexSoftmaxTables tables;
  std::vector<kernels::IndexSoftmaxTables> block_tables;
  float alpha;       // quant-only: S = fl32(A) * alpha
  double out_scale;
  int p_scale;       // quant-only: INT8 P
  Eigen::Index d4, lk_stride, dv16;
  bool run_qk, run_pv, run_softmax;
  AlignedArray<std::int8_t> k_packed, v_packed;
  std::vector<std::int32_t> k_sum, v_sum;
  Eigen::Index br, blocks;
  int threads;
  // IntAttention rows with no padding mask or key groups take their maximum from Q.K^T's epilogue where the ISA has
  // that pair (kernel_variants.h): the GEMM folds each row's visible values into 16 lanes as it stores them, and the
  // row kernel skips its first pass. The gemm-only stages run the plain GEMM.
  bool epilogue_max;
};

FusedCall::FusedCall(const Int8View& q_, const Int8View& k, const Int8View& v, double scale,
                     const IntAttentionConfig& cfg_, float* o_)
    : q(q_), cfg(cfg_), f(kernels::kernel_variant(cfg_.isa)), o(o_), lq(q_.rows), lk(k.rows), d(q_.cols), dv(v.cols) {
  quant_only = cfg.pipeline == IntPipeline::quant_only;
  if (!quant_only) {
    const std::int64_t c_int = cfg.c_int > 0 ? cfg.c_int
                                             : cint_from_alpha(cfg.softmax.c, q.scale * k.scale * scale,
                                                               cfg.softmax.cint_rounding);
    tables = kernels::IndexSoftmaxTables::make(cfg.softmax, c_int);
  }
  grouped = !quant_only && cfg.key_block > 0;
  if (grouped) {
    const Eigen::Index key_blocks = (lk + cfg.key_block - 1) / cfg.key_block;
    if (static_cast<Eigen::Index>(cfg.key_c_int.size()) != key_blocks ||
        static_cast<Eigen::Index>(cfg.key_ratio.size()) != key_blocks)
      throw std::invalid_argument("int_attention: " + std::to_string(lk) + " keys in blocks of " +
                                  std::to_string(cfg.key_block) + " need one c_int and one ratio per block");
    if (d > kMaxKeyBlockHeadDim)
      throw std::invalid_argument("int_attention: key blocks need d <= " + std::to_string(kMaxKeyBlockHeadDim));
    for (const std::int64_t c : cfg.key_c_int)
      block_tables.push_back(kernels::IndexSoftmaxTables::make(cfg.softmax, c));
  }
  alpha = static_cast<float>(q.scale * k.scale * scale);
  out_scale = v.scale;
  p_scale = p_code_max(quant_only ? PFormat::s8 : cfg.softmax.p_format);

  d4 = round_up(d, 4), lk_stride = key_stride(lk, f.key_stride_multiple), dv16 = round_up(dv, 16);
  using Stages = IntAttentionConfig::Stages;
  run_qk = cfg.stages != Stages::pv, run_pv = cfg.stages != Stages::qk, run_softmax = cfg.stages == Stages::all;
  pack(k, v);
  br = int_attention_block_rows(cfg, lk), blocks = (lq + br - 1) / br;
  threads = static_cast<int>(std::min<Eigen::Index>(cfg.threads, blocks));
  epilogue_max = f.qk_row_max && f.softmax_given_max && !quant_only && !grouped && !cfg.valid && run_softmax;
}

// K^T and V packed once per call. Each stage packs only its own operand, so a one-stage timing holds that stage's
// packing and no other. On several threads the keys are split into ranges, one per worker and at most one per 512
// keys, each a multiple of 64 keys (the last one shorter, or empty), so that packing is not a serial part of the
// call (at L = 4096, d = 128 it is about 0.2 ms, 5 % of a 2-thread call on an AMX Xeon, family 6 model 207): the
// same bytes and sums as one range, V's column sums added range by range in int32.
void FusedCall::pack(const Int8View& k, const Int8View& v) {
  k_packed = aligned_array<std::int8_t>(run_qk ? static_cast<std::size_t>(d4 * lk_stride) : 0);
  v_packed = aligned_array<std::int8_t>(run_pv ? static_cast<std::size_t>(lk_stride * dv16) : 0);
  k_sum.assign(run_qk ? lk_stride : 0, 0), v_sum.assign(run_pv ? dv16 : 0, 0);
  if (run_qk) kernels::pack_k_padding(lk, d4, lk_stride, k_packed.get(), k_sum.data());
  if (run_pv) kernels::pack_v_padding(lk, lk_stride, dv16, v_packed.get());
  const Eigen::Index ranges = parallel_workers(static_cast<std::size_t>(lk / 512 + 1), cfg.threads);
  if (ranges == 1) {  // one range: on this thread (waking a helper for a pack of microseconds costs more)
    if (run_qk) kernels::pack_k_keys(k.values, 0, lk, d, lk_stride, k_packed.get(), k_sum.data());
    if (run_pv) kernels::pack_v_keys(v.values, 0, lk, dv, dv16, v_packed.get(), v_sum.data());
    return;
  }
  const Eigen::Index step = round_up((lk + ranges - 1) / ranges, 64);
  std::vector<std::vector<std::int32_t>> v_parts(static_cast<std::size_t>(ranges),
                                                 std::vector<std::int32_t>(v_sum.size(), 0));
  parallel_for(static_cast<std::size_t>(2 * ranges), cfg.threads, [&](std::size_t i) {
    const Eigen::Index r = static_cast<Eigen::Index>(i / 2), begin = std::min(lk, r * step),
                       end = std::min(lk, begin + step);
    if (i % 2 == 0 && run_qk) kernels::pack_k_keys(k.values, begin, end, d, lk_stride, k_packed.get(), k_sum.data());
    if (i % 2 == 1 && run_pv)
      kernels::pack_v_keys(v.values, begin, end, dv, dv16, v_packed.get(), v_parts[static_cast<std::size_t>(r)].data());
  });
  for (const std::vector<std::int32_t>& part : v_parts)
    for (std::size_t c = 0; c < v_sum.size(); ++c) v_sum[c] += part[c];
}

// The materialised dataflow: S and P whole, in three passes over the row blocks (Q.K^T, softmax, P.V).
// S and P take 5 bytes per (query, key) pair, 80 MiB at L = 4096. Fresh pages cost a fault each, on some VMs 3 ms per
// MB with 4 KiB pages (docs/kernels.md), which would make this dataflow's time mostly faults; so both are allocated
// uninitialised and advised for huge pages before their first touch. Q.K^T writes S whole; P is zeroed after the
// advice, so that its columns past L_k, which no row writes, hold defined values (P.V meets them with V's zero
// padding) and a gemms-only run leaves P at zero.
void run_materialised(const FusedCall& c) {
  const Eigen::Index br = c.br, lq = c.lq, lk = c.lk, lk_stride = c.lk_stride, d4 = c.d4;
  const std::size_t pairs = static_cast<std::size_t>(lq * lk_stride);
  const AlignedArray<std::int32_t> s_buffer = aligned_array<std::int32_t>(pairs);
  const AlignedArray<std::uint8_t> p_buffer = aligned_array<std::uint8_t>(pairs);
  advise_huge_pages(s_buffer.get(), pairs * sizeof(std::int32_t));
  advise_huge_pages(p_buffer.get(), pairs);
  std::fill_n(p_buffer.get(), pairs, std::uint8_t{0});
  std::int32_t* const s_all = s_buffer.get();
  std::uint8_t* const p_all = p_buffer.get();
  c.parallel_blocks([&](Eigen::Index b) {  // pass 1: S = Q K^T
    const Eigen::Index r0 = b * br, rows = std::min(br, lq - r0);
    const AlignedArray<std::int8_t> qb = aligned_array<std::int8_t>(static_cast<std::size_t>(rows * d4));
    std::fill_n(qb.get(), rows * d4, std::int8_t{0});
    c.copy_q_rows(r0, rows, qb.get());
    if (c.run_qk) c.f.qk({qb.get(), rows, d4, c.k_packed.get(), c.k_sum.data(), lk_stride, s_all + r0 * lk_stride});
  });
  c.parallel_blocks([&](Eigen::Index b) {  // pass 2: P = softmax(S), row by row
    std::vector<float> scratch(c.quant_only ? static_cast<std::size_t>(lk_stride) : 0);
    for (Eigen::Index row = b * br; c.run_softmax && row < std::min(lq, (b + 1) * br); ++row) {
      c.softmax_row(s_all + row * lk_stride, scratch.data(), row, p_all + row * lk_stride);
      if (c.cfg.p_out) std::copy_n(p_all + row * lk_stride, lk, c.cfg.p_out + row * lk);
    }
  });
  c.parallel_blocks([&](Eigen::Index b) {  // pass 3: O = P V
    const Eigen::Index r0 = b * br, rows = std::min(br, lq - r0);
    if (!c.run_pv) return;
    const AlignedArray<std::int32_t> acc = aligned_array<std::int32_t>(static_cast<std::size_t>(rows * c.dv16));
    c.f.pv({p_all + r0 * lk_stride, rows, lk_stride, c.v_packed.get(), c.v_sum.data(), c.dv16, acc.get()});
    c.dequantise(acc.get(), r0, rows);
  });
}

// One worker's buffers, reused across its row blocks: Q block (zero-padded to d4), S, P (zero-padded to lk_stride),
// accumulators, each of min(B_r, L_q) rows: a call with fewer queries than a block (decoding) holds only the rows it
// has. S and the accumulators are written whole before they are read, so they are left uninitialised; P is zeroed
// once, so that its columns past L_k, which no row writes, hold defined values (P.V meets them with V's zero
// padding). A one-stage run holds only its stage's buffers.
struct RowBlockScratch {
  bool ready = false;
  AlignedArray<std::int8_t> qb;
  AlignedArray<std::int32_t> s, acc;
  std::unique_ptr<std::int32_t[]> lanes;
  AlignedArray<std::uint8_t> p;
  std::vector<float> f;

  void allocate(const FusedCall& c, Eigen::Index s_rows) {
    const Eigen::Index rows_max = std::min(c.br, c.lq);
    if (c.run_qk) {
      qb = aligned_array<std::int8_t>(static_cast<std::size_t>(rows_max * c.d4));
      std::fill_n(qb.get(), rows_max * c.d4, std::int8_t{0});
      s = aligned_array<std::int32_t>(static_cast<std::size_t>(s_rows * c.lk_stride));
    }
    if (c.run_pv) acc = aligned_array<std::int32_t>(static_cast<std::size_t>(rows_max * c.dv16));
    if (c.epilogue_max) lanes.reset(new std::int32_t[static_cast<std::size_t>(s_rows * 16)]);
    p = aligned_array<std::uint8_t>(static_cast<std::size_t>(rows_max * c.lk_stride));
    std::fill_n(p.get(), rows_max * c.lk_stride, std::uint8_t{0});
    f.resize(c.quant_only ? static_cast<std::size_t>(c.lk_stride) : 0);
    ready = true;
  }
};

// Rows [i0, i0 + n) of the block starting at query r0: their slice of S by Q.K^T, then their softmax rows into P.
void qk_softmax_slice(const FusedCall& c, RowBlockScratch& w, Eigen::Index r0, Eigen::Index i0, Eigen::Index n) {
  const IntAttentionConfig& cfg = c.cfg;
  // (a P.V-only run holds no Q block: no offset from its null pointer)
  kernels::GemmArgs qk{c.run_qk ? w.qb.get() + i0 * c.d4 : nullptr, n, c.d4, c.k_packed.get(), c.k_sum.data(),
                       c.lk_stride, w.s.get()};
  if (c.epilogue_max) {
    qk.row_max = w.lanes.get();
    qk.visible = cfg.causal ? r0 + i0 + c.lk - c.lq + 1 : c.lk;
    qk.visible_step = cfg.causal ? 1 : 0;
    qk.visible_cap = c.lk;
  }
  if (c.run_qk) c.f.qk(qk);
  for (Eigen::Index i = 0; c.run_softmax && i < n; ++i) {
    const std::int32_t* s_row = w.s.get() + i * c.lk_stride;
    std::uint8_t* p_row = w.p.get() + (i0 + i) * c.lk_stride;
    if (c.epilogue_max) {
      const std::int32_t* lanes = w.lanes.get() + i * 16;
      c.f.softmax_given_max(s_row, qk.limit(i), c.lk, c.tables, *std::max_element(lanes, lanes + 16), p_row);
    } else {
      c.softmax_row(s_row, w.f.data(), r0 + i0 + i, p_row);
    }
    if (cfg.p_out) std::copy_n(p_row, c.lk, cfg.p_out + (r0 + i0 + i) * c.lk);
  }
}

// The streaming dataflow: each row block runs Q.K^T and softmax in slices of s_rows rows, then P.V and the
// dequantisation, in its worker's buffers.
void run_row_blocks(const FusedCall& c) {
  // Rows of S per Q.K^T call: the call's, the variant's (kernel_variants.h), or the whole block.
  const Eigen::Index s_wanted = c.cfg.s_rows > 0 ? c.cfg.s_rows : c.f.s_rows;
  const Eigen::Index s_rows = std::min(s_wanted > 0 ? s_wanted : c.br, std::min(c.br, c.lq));
  std::vector<RowBlockScratch> scratch(
      static_cast<std::size_t>(parallel_workers(static_cast<std::size_t>(c.blocks), c.threads)));
  parallel_for_workers(static_cast<std::size_t>(c.blocks), c.threads, [&](std::size_t block, int worker) {
    RowBlockScratch& w = scratch[static_cast<std::size_t>(worker)];
    if (!w.ready) w.allocate(c, s_rows);
    const Eigen::Index r0 = static_cast<Eigen::Index>(block) * c.br, rows = std::min(c.br, c.lq - r0);
    if (c.run_qk) c.copy_q_rows(r0, rows, w.qb.get());
    for (Eigen::Index i0 = 0; i0 < rows; i0 += s_rows) qk_softmax_slice(c, w, r0, i0, std::min(s_rows, rows - i0));
    if (!c.run_pv) return;
    c.f.pv({w.p.get(), rows, c.lk_stride, c.v_packed.get(), c.v_sum.data(), c.dv16, w.acc.get()});
    c.dequantise(w.acc.get(), r0, rows);
  });
}

}  // namespace

// The kernel's schedule: check the call, pack K and V once (FusedCall), then per row block Q.K^T, softmax, P.V and
// dequantisation, with S and P whole (materialised) or in each worker's buffers.
void int_attention_fused(const Int8View& q, const Int8View& k, const Int8View& v, double scale,
                         const IntAttentionConfig& cfg, float* o) {
  check_fused_call(q, k, v, cfg);
  const Eigen::Index lq = q.rows, dv = v.cols;
  if (lq == 0 || dv == 0) return;
  if (k.rows == 0) {
    std::fill(o, o + lq * dv, 0.0f);
    return;
  }
  const FusedCall call(q, k, v, scale, cfg, o);
  if (cfg.materialise) run_materialised(call);
  else run_row_blocks(call);
}

RowMatrixXd int_attention_fused(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                const IntAttentionConfig& config) {
  double sq, sk, sv;
  const std::vector<std::int8_t> qi = quantize_per_tensor(q, &sq), ki = quantize_per_tensor(k, &sk),
                                 vi = quantize_per_tensor(v, &sv);
  std::vector<float> o(static_cast<std::size_t>(q.rows() * v.cols()));
  int_attention_fused({qi.data(), q.rows(), q.cols(), sq}, {ki.data(), k.rows(), k.cols(), sk},
                      {vi.data(), v.rows(), v.cols(), sv}, scale, config, o.data());
  return Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(o.data(), q.rows(), v.cols())
      .cast<double>();
}

}  // namespace qattn
