// The fused IntAttention driver: packs K^T and V once, then runs row blocks (each thread its own buffers, reused
// across blocks) through qk GEMM -> IndexSoftmax per row -> pv GEMM -> dequantisation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

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

// One function of about 100 lines on purpose: the block loop is the kernel's schedule (pack K and V once, then per
// row block Q.K^T, softmax, P.V, dequantise, with each worker's scratch), and reading it whole is how its memory and
// overflow bounds (docs/kernels.md) are checked against it.
void int_attention_fused(const Int8View& q, const Int8View& k, const Int8View& v, double scale,
                         const IntAttentionConfig& cfg, float* o) {
  if (q.cols != k.cols || k.rows != v.rows)
    throw std::invalid_argument("int_attention: shapes q [" + std::to_string(q.rows) + ", " + std::to_string(q.cols) +
                                "], k [" + std::to_string(k.rows) + ", " + std::to_string(k.cols) + "], v [" +
                                std::to_string(v.rows) + ", " + std::to_string(v.cols) + "] do not fit");
  if (cfg.block_rows < 0 || cfg.s_rows < 0 || cfg.threads < 1)
    throw std::invalid_argument("int_attention: block_rows and s_rows must be >= 0 (0: the library's choice) and threads >= 1");
  if (!isa_available(cfg.isa))
    throw std::invalid_argument("int_attention: ISA " + std::string(isa_name(cfg.isa)) + " is not available here");
  const kernels::KernelVariant& f = kernels::kernel_variant(cfg.isa);
  const Eigen::Index lq = q.rows, lk = k.rows, d = q.cols, dv = v.cols;
  if (lq == 0 || dv == 0) return;
  if (lk == 0) {
    std::fill(o, o + lq * dv, 0.0f);
    return;
  }
  const bool quant_only = cfg.pipeline == IntPipeline::quant_only;
  kernels::IndexSoftmaxTables tables;
  if (!quant_only) {
    const std::int64_t c_int =
        cfg.c_int > 0 ? cfg.c_int : cint_from_alpha(cfg.softmax.c, q.scale * k.scale * scale, cfg.softmax.cint_rounding);
    tables = kernels::IndexSoftmaxTables::make(cfg.softmax, c_int);
  }
  // Group-wise clipping: one table per key block (its c_int), shared LUT values.
  const bool grouped = !quant_only && cfg.key_block > 0;
  std::vector<kernels::IndexSoftmaxTables> block_tables;
  if (grouped) {
    const Eigen::Index key_blocks = (lk + cfg.key_block - 1) / cfg.key_block;
    if (static_cast<Eigen::Index>(cfg.key_c_int.size()) != key_blocks ||
        static_cast<Eigen::Index>(cfg.key_ratio.size()) != key_blocks)
      throw std::invalid_argument("int_attention: " + std::to_string(lk) + " keys in blocks of " +
                                  std::to_string(cfg.key_block) + " need one c_int and one ratio per block");
    if (d > kMaxKeyBlockHeadDim)
      throw std::invalid_argument("int_attention: key blocks need d <= " + std::to_string(kMaxKeyBlockHeadDim));
    for (const std::int64_t c : cfg.key_c_int) block_tables.push_back(kernels::IndexSoftmaxTables::make(cfg.softmax, c));
  }
  const float alpha = static_cast<float>(q.scale * k.scale * scale);  // quant-only: S = fl32(A) * alpha
  const double out_scale = v.scale;
  const int p_scale = p_code_max(quant_only ? PFormat::s8 : cfg.softmax.p_format);  // quant-only: INT8 P

  const Eigen::Index d4 = round_up(d, 4), lk_stride = key_stride(lk, f.key_stride_multiple), dv16 = round_up(dv, 16);
  using Stages = IntAttentionConfig::Stages;
  const bool run_qk = cfg.stages != Stages::pv, run_pv = cfg.stages != Stages::qk, run_softmax = cfg.stages == Stages::all;
  // Each stage packs only its own operand, so a one-stage timing holds that stage's packing and no other.
  const AlignedArray<std::int8_t> k_packed = aligned_array<std::int8_t>(run_qk ? static_cast<std::size_t>(d4 * lk_stride) : 0),
                                  v_packed = aligned_array<std::int8_t>(run_pv ? static_cast<std::size_t>(lk_stride * dv16) : 0);
  std::vector<std::int32_t> k_sum(run_qk ? lk_stride : 0), v_sum(run_pv ? dv16 : 0);
  if (run_qk) kernels::pack_k_transposed(k.values, lk, d, d4, lk_stride, k_packed.get(), k_sum.data());
  if (run_pv) kernels::pack_v(v.values, lk, dv, lk_stride, dv16, v_packed.get(), v_sum.data());
  const Eigen::Index br = int_attention_block_rows(cfg, lk), blocks = (lq + br - 1) / br;
  const int threads = static_cast<int>(std::min<Eigen::Index>(cfg.threads, blocks));
  // Runs body(block) for every block on the threads (qattn/parallel.h); returns when all are done.
  auto parallel_blocks = [&](auto&& body) {
    parallel_for(static_cast<std::size_t>(blocks), threads, [&](std::size_t b) { body(static_cast<Eigen::Index>(b)); });
  };
  // IntAttention rows with no padding mask or key groups take their maximum from Q.K^T's epilogue where the ISA has
  // that pair (kernel_variants.h): the GEMM folds each row's visible values into 16 lanes as it stores them, and the
  // row kernel skips its first pass. The gemm-only stages run the plain GEMM.
  const bool epilogue_max = f.qk_row_max && f.softmax_given_max && !quant_only && !grouped && !cfg.valid && run_softmax;
  auto softmax_row = [&](const std::int32_t* s_row, float* f_scratch, Eigen::Index row, std::uint8_t* p_row) {
    const Eigen::Index limit = cfg.causal ? row + lk - lq + 1 : lk;
    const bool* valid = cfg.valid ? cfg.valid + row * lk : nullptr;
    if (quant_only) f.softmax_f32(s_row, valid, limit, lk, alpha, f_scratch, p_row);
    else if (grouped) grouped_softmax_row(f, s_row, valid, std::clamp<Eigen::Index>(limit, 0, lk), lk, cfg, block_tables, p_row);
    else f.softmax(s_row, valid, limit, lk, tables, p_row);
  };
  auto dequantise = [&](const std::int32_t* acc, Eigen::Index r0, Eigen::Index rows) {
    f.dequantise(acc, rows, dv, dv16, out_scale, p_scale, o + r0 * dv, dv);
  };
  if (cfg.materialise) {
    // S and P whole: 5 bytes per (query, key) pair, 80 MiB at L = 4096. Fresh pages cost a fault each, on some VMs
    // 3 ms per MB with 4 KiB pages (docs/kernels.md), which would make this dataflow's time mostly faults; so both are
    // allocated uninitialised and advised for huge pages before their first touch. Q.K^T writes S whole; P is zeroed
    // after the advice, so that its columns past L_k, which no row writes, hold defined values (P.V meets them with
    // V's zero padding) and a gemms-only run leaves P at zero.
    const std::size_t pairs = static_cast<std::size_t>(lq * lk_stride);
    const AlignedArray<std::int32_t> s_buffer = aligned_array<std::int32_t>(pairs);
    const AlignedArray<std::uint8_t> p_buffer = aligned_array<std::uint8_t>(pairs);
    advise_huge_pages(s_buffer.get(), pairs * sizeof(std::int32_t));
    advise_huge_pages(p_buffer.get(), pairs);
    std::fill_n(p_buffer.get(), pairs, std::uint8_t{0});
    std::int32_t* const s_all = s_buffer.get();
    std::uint8_t* const p_all = p_buffer.get();
    parallel_blocks([&](Eigen::Index b) {  // pass 1: S = Q K^T
      const Eigen::Index r0 = b * br, rows = std::min(br, lq - r0);
      const AlignedArray<std::int8_t> qb = aligned_array<std::int8_t>(static_cast<std::size_t>(rows * d4));
      std::fill_n(qb.get(), rows * d4, std::int8_t{0});
      for (Eigen::Index i = 0; i < rows; ++i) std::copy_n(q.values + (r0 + i) * d, d, qb.get() + i * d4);
      if (run_qk) f.qk({qb.get(), rows, d4, k_packed.get(), k_sum.data(), lk_stride, s_all + r0 * lk_stride});
    });
    parallel_blocks([&](Eigen::Index b) {  // pass 2: P = softmax(S), row by row
      std::vector<float> scratch(quant_only ? static_cast<std::size_t>(lk_stride) : 0);
      for (Eigen::Index row = b * br; run_softmax && row < std::min(lq, (b + 1) * br); ++row) {
        softmax_row(s_all + row * lk_stride, scratch.data(), row, p_all + row * lk_stride);
        if (cfg.p_out) std::copy_n(p_all + row * lk_stride, lk, cfg.p_out + row * lk);
      }
    });
    parallel_blocks([&](Eigen::Index b) {  // pass 3: O = P V
      const Eigen::Index r0 = b * br, rows = std::min(br, lq - r0);
      if (!run_pv) return;
      const AlignedArray<std::int32_t> acc = aligned_array<std::int32_t>(static_cast<std::size_t>(rows * dv16));
      f.pv({p_all + r0 * lk_stride, rows, lk_stride, v_packed.get(), v_sum.data(), dv16, acc.get()});
      dequantise(acc.get(), r0, rows);
    });
    return;
  }
  // Each worker's blocks reuse its buffers: Q block (zero-padded to d4), S, P (zero-padded to lk_stride), accumulators,
  // each of min(B_r, L_q) rows: a call with fewer queries than a block (decoding) holds only the rows it has.
  // S and the accumulators are written whole before they are read, so they are left uninitialised; P is zeroed once,
  // so that its columns past L_k, which no row writes, hold defined values (P.V meets them with V's zero padding).
  // A one-stage run holds only its stage's buffers.
  struct Scratch {
    bool ready = false;
    AlignedArray<std::int8_t> qb;
    AlignedArray<std::int32_t> s, acc;
    std::unique_ptr<std::int32_t[]> lanes;
    AlignedArray<std::uint8_t> p;
    std::vector<float> f;
  };
  // Rows of S per Q.K^T call: the call's, the variant's (kernel_variants.h), or the whole block.
  const Eigen::Index s_wanted = cfg.s_rows > 0 ? cfg.s_rows : f.s_rows;
  const Eigen::Index s_rows = std::min(s_wanted > 0 ? s_wanted : br, std::min(br, lq));
  std::vector<Scratch> scratch(static_cast<std::size_t>(parallel_workers(static_cast<std::size_t>(blocks), threads)));
  parallel_for_workers(static_cast<std::size_t>(blocks), threads, [&](std::size_t block, int worker) {
    Scratch& w = scratch[static_cast<std::size_t>(worker)];
    if (!w.ready) {
      const Eigen::Index rows_max = std::min(br, lq);
      if (run_qk) {
        w.qb = aligned_array<std::int8_t>(static_cast<std::size_t>(rows_max * d4));
        std::fill_n(w.qb.get(), rows_max * d4, std::int8_t{0});
        w.s = aligned_array<std::int32_t>(static_cast<std::size_t>(s_rows * lk_stride));
      }
      if (run_pv) w.acc = aligned_array<std::int32_t>(static_cast<std::size_t>(rows_max * dv16));
      if (epilogue_max) w.lanes.reset(new std::int32_t[static_cast<std::size_t>(s_rows * 16)]);
      w.p = aligned_array<std::uint8_t>(static_cast<std::size_t>(rows_max * lk_stride));
      std::fill_n(w.p.get(), rows_max * lk_stride, std::uint8_t{0});
      w.f.resize(quant_only ? static_cast<std::size_t>(lk_stride) : 0);
      w.ready = true;
    }
    const Eigen::Index r0 = static_cast<Eigen::Index>(block) * br, rows = std::min(br, lq - r0);
    for (Eigen::Index i = 0; run_qk && i < rows; ++i) std::copy_n(q.values + (r0 + i) * d, d, w.qb.get() + i * d4);
    for (Eigen::Index i0 = 0; i0 < rows; i0 += s_rows) {  // slices of S: Q.K^T, then their softmax rows
      const Eigen::Index n = std::min(s_rows, rows - i0);
      // (a P.V-only run holds no Q block: no offset from its null pointer)
      kernels::GemmArgs qk{run_qk ? w.qb.get() + i0 * d4 : nullptr, n, d4, k_packed.get(), k_sum.data(), lk_stride, w.s.get()};
      if (epilogue_max) {
        qk.row_max = w.lanes.get();
        qk.visible = cfg.causal ? r0 + i0 + lk - lq + 1 : lk;
        qk.visible_step = cfg.causal ? 1 : 0;
        qk.visible_cap = lk;
      }
      if (run_qk) f.qk(qk);
      for (Eigen::Index i = 0; run_softmax && i < n; ++i) {
        const std::int32_t* s_row = w.s.get() + i * lk_stride;
        std::uint8_t* p_row = w.p.get() + (i0 + i) * lk_stride;
        if (epilogue_max) {
          const std::int32_t* lanes = w.lanes.get() + i * 16;
          f.softmax_given_max(s_row, qk.limit(i), lk, tables, *std::max_element(lanes, lanes + 16), p_row);
        } else {
          softmax_row(s_row, w.f.data(), r0 + i0 + i, p_row);
        }
        if (cfg.p_out) std::copy_n(p_row, lk, cfg.p_out + (r0 + i0 + i) * lk);
      }
    }
    if (!run_pv) return;
    f.pv({w.p.get(), rows, lk_stride, v_packed.get(), v_sum.data(), dv16, w.acc.get()});
    dequantise(w.acc.get(), r0, rows);
  });
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
