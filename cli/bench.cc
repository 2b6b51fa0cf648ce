// qattn bench: the fused integer attention against its own GEMM floor and an fp32 baseline, timed in one run.
// Medians over repetitions (one warm-up first), with the CPU, ISA, kernels, threads, L and d printed. A program,
// not a test: timings drift between moments on a shared machine, so compare ratios within one run.
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "commands.h"
#include "onednn_gemm.h"
#include "qattn/error.h"
#include "qattn/int_attention.h"
#include "qattn/parallel.h"
#include "qattn/quantize.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"
#include "evaluate.h"

namespace qattn::cli {

// "AMD EPYC (family 25, model 17)" on x86, "implementer 0x41, part 0xd0b" on Arm: the model name alone does not tell
// Zen 4 (one 512-bit vpdpbusd per cycle) from Zen 5 (two), and every ratio depends on which it was.
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, name, family, model, implementer, part;
  auto value = [&] { return line.substr(line.find(':') + 2); };
  while (std::getline(f, line) && line.find_first_not_of(" \t") != std::string::npos) {  // the first processor
    if (line.rfind("model name", 0) == 0) name = value();
    else if (line.rfind("cpu family", 0) == 0) family = value();
    else if (line.rfind("model\t", 0) == 0 || line.rfind("model ", 0) == 0) model = value();
    else if (line.rfind("CPU implementer", 0) == 0) implementer = value();
    else if (line.rfind("CPU part", 0) == 0) part = value();
  }
  if (!family.empty()) return (name.empty() ? "unknown" : name) + " (family " + family + ", model " + model + ")";
  if (!part.empty()) return "implementer " + implementer + ", part " + part;
  return name.empty() ? "unknown" : name;
}

namespace {

// Bounds of the bench's options: the materialised rows hold L^2 int32 S and L^2 u8 P (5 GiB at L = 32768).
constexpr int kMaxBenchL = 32768, kMaxBenchD = 1024, kMaxBenchReps = 1000;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;


// Peak resident memory per row: writing 5 to /proc/self/clear_refs resets the kernel's high-water mark (VmHWM), so
// each row's figure is what the process held at most while that row ran (its inputs included: BenchInputs). -1 where
// /proc lacks it.
void reset_peak_rss() {
  malloc_trim(0);  // hand freed heap pages back first, so that an earlier row's buffers do not count
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";
}
double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // "VmHWM:   1234 kB"
  return -1;
}

// Medians of several forms timed in turns. Each is first run once alone (the warm-up: first touches, caches; its peak
// RSS is read then, since every call allocates the same buffers as its first), and the timed repetitions then run
// round-robin (f0, f1, ..., f0, f1, ...). A drift of the machine's speed during the cell so falls on every form
// alike, and the ratios between them (fused / gemm-only) compare like with like.
std::vector<double> interleaved_medians_ms(int reps, const std::vector<std::function<void()>>& forms,
                                           std::vector<double>* rss_mib = nullptr) {
  const std::size_t n = forms.size();
  if (rss_mib) rss_mib->assign(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    reset_peak_rss();
    forms[i]();
    if (rss_mib) (*rss_mib)[i] = peak_rss_mib();
  }
  std::vector<std::vector<double>> t(n);
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      forms[i]();
      t[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  std::vector<double> medians(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::sort(t[i].begin(), t[i].end());
    medians[i] = t[i][t[i].size() / 2];
  }
  return medians;
}

template <typename F>
double median_ms(int reps, F&& f, double* rss_mib = nullptr) {
  reset_peak_rss();
  f();  // warm-up: first-touch pages, caches
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  if (rss_mib) *rss_mib = peak_rss_mib();
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// fp32 attention by row blocks of 64: S = Q_blk K^T (Eigen GEMM at this build's baseline ISA), max-subtracted
// softmax with std::exp, O_blk = P V; blocks spread over threads. Memory O(64 L) per thread.
void fp32_attention_blocks(const RowMatrixXf& q, const RowMatrixXf& k, const RowMatrixXf& v, float scale, int threads,
                           RowMatrixXf& o) {
  const Eigen::Index lq = q.rows(), br = 64, blocks = (lq + br - 1) / br;
  std::vector<RowMatrixXf> scores(static_cast<std::size_t>(parallel_workers(static_cast<std::size_t>(blocks), threads)));
  parallel_for_workers(static_cast<std::size_t>(blocks), threads, [&](std::size_t block, int worker) {
    RowMatrixXf& s = scores[static_cast<std::size_t>(worker)];
    if (s.size() == 0) s.resize(br, k.rows());
    const Eigen::Index r0 = static_cast<Eigen::Index>(block) * br, rows = std::min(br, lq - r0);
    s.topRows(rows).noalias() = (q.middleRows(r0, rows) * k.transpose()) * scale;
    for (Eigen::Index i = 0; i < rows; ++i) {
      const float m = s.row(i).maxCoeff();
      float sum = 0;
      for (Eigen::Index j = 0; j < s.cols(); ++j) sum += (s(i, j) = std::exp(s(i, j) - m));
      s.row(i) /= sum;
    }
    o.middleRows(r0, rows).noalias() = s.topRows(rows) * v;
  });
}

struct BenchOptions {
  std::vector<int> lengths{1024, 2048, 4096}, threads{1, 2};
  int d = 128, reps = 5;
  std::string isa, format = "md", out, index = "index@upstream-neon";
  std::vector<std::string> rows{"fused", "materialised", "fp32", "onednn", "softmax"};
  bool list_targets = false;
};

bool wants(const BenchOptions& o, const std::string& group) {
  return std::find(o.rows.begin(), o.rows.end(), group) != o.rows.end();
}

std::string fmt(double x, int places) {
  if (!std::isfinite(x)) return "-";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(places);
  s << x;
  return s.str();
}

// ---- the measured cells and the targets they are checked against -----------------------------------------------

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// One (L, threads) of a run: the medians (ms) and derived figures the targets read; NaN where not measured.
struct Cell {
  int l = 0, threads = 0;
  double t_int = kNan, t_gemm = kNan, t_qo = kNan, t_qk = kNan, t_pv = kNan;  // fused rows and GEMM stages
  double qk_eff = kNan, pv_eff = kNan;                                         // % of the measured peak
  double t_int_m = kNan, t_qo_m = kNan, t_fp32 = kNan;                         // materialised and fp32 rows
  double rss_int = kNan;                                                       // MiB while fused intattention ran
  double t_dnnl_qk = kNan, t_dnnl_pv = kNan;                                   // oneDNN's matmuls
  double ns_index = kNan, ns_float = kNan;  // softmax rows alone, ns per element (the first thread count's cell)
  // 2-thread cells: fused intattention at 1 and at 2 threads, the two calls timed in turns, and their ratio
  double t_int_turns1 = kNan, t_int_turns2 = kNan, speedup = kNan;
  double growth = kNan;   // this cell's t_int / t_int at L = 4096, same threads (L = 16384 cells)
};

enum class Bound { at_most, at_least, above };

// A target of docs/kernels.md: on every cell where `applies` holds and `value` is finite, value against the
// threshold. `qattn bench` prints each verdict with the figures behind it; `qattn bench --list-targets` prints this
// table for docs/kernels.md (checked by CTest: scripts/doc_blocks.py).
struct BenchTarget {
  const char* name;
  Bound bound;
  double threshold;
  const char* figure;  // what value is, in words
  const char* cells;   // the cells it reads, in words
  bool (*applies)(const Cell&);
  double (*value)(const Cell&);
  int places = 2;
};

double dnnl_two(const Cell& c) { return c.t_dnnl_qk + c.t_dnnl_pv; }

const std::vector<BenchTarget>& bench_targets() {
  static const std::vector<BenchTarget> list = {
      {"fused intattention <= 1.10 x gemm-only at L >= 2048", Bound::at_most, 1.10,
       "fused intattention / gemm-only (ms / ms)", "L >= 2048",
       [](const Cell& c) { return c.l >= 2048; }, [](const Cell& c) { return c.t_int / c.t_gemm; }},
      {"int8 Q.K^T stage >= 70 % of the measured peak", Bound::at_least, 70, "Q.K^T GMAC/s / (peak x threads), %",
       "every cell", [](const Cell&) { return true; }, [](const Cell& c) { return c.qk_eff; }, 0},
      {"int8 P.V stage >= 85 % of the measured peak", Bound::at_least, 85, "P.V GMAC/s / (peak x threads), %",
       "every cell", [](const Cell&) { return true; }, [](const Cell& c) { return c.pv_eff; }, 0},
      {"our Q.K^T stage <= 1.10 x oneDNN's at L in {2048, 4096, 8192}", Bound::at_most, 1.10,
       "Q.K^T stage ours / oneDNN (ms / ms)", "L in {2048, 4096, 8192}",
       [](const Cell& c) { return c.l == 2048 || c.l == 4096 || c.l == 8192; },
       [](const Cell& c) { return c.t_qk / c.t_dnnl_qk; }},
      {"our P.V stage <= 1.10 x oneDNN's at L in {2048, 4096, 8192}", Bound::at_most, 1.10,
       "P.V stage ours / oneDNN (ms / ms)", "L in {2048, 4096, 8192}",
       [](const Cell& c) { return c.l == 2048 || c.l == 4096 || c.l == 8192; },
       [](const Cell& c) { return c.t_pv / c.t_dnnl_pv; }},
      {"fused intattention <= 1.25 x oneDNN's two GEMMs at L = 4096", Bound::at_most, 1.25,
       "fused intattention / (oneDNN Q.K^T + P.V)", "L = 4096", [](const Cell& c) { return c.l == 4096; },
       [](const Cell& c) { return c.t_int / dnnl_two(c); }},
      {"fused quant-only <= 1.25 x oneDNN's two GEMMs at L = 4096", Bound::at_most, 1.25,
       "fused quant-only / (oneDNN Q.K^T + P.V)", "L = 4096", [](const Cell& c) { return c.l == 4096; },
       [](const Cell& c) { return c.t_qo / dnnl_two(c); }},
      {"IndexSoftmax row >= 1.5 x faster per element than the float softmax row of fused quant-only", Bound::at_least,
       1.5, "float row ns / IndexSoftmax row ns, per element", "each L, at its first thread count",
       [](const Cell&) { return true; }, [](const Cell& c) { return c.ns_float / c.ns_index; }},
      {"t(16384) / t(4096) <= 17 for fused intattention", Bound::at_most, 17, "t_int(16384) / t_int(4096)",
       "L = 16384, against L = 4096 at the same threads", [](const Cell& c) { return c.l == 16384; },
       [](const Cell& c) { return c.growth; }, 1},
      {"2-thread speedup of fused intattention >= 1.8 at L >= 4096", Bound::at_least, 1.8,
       "t_int(1 thread) / t_int(2 threads), the two calls timed in turns", "2 threads at L >= 4096",
       [](const Cell& c) { return c.l >= 4096; }, [](const Cell& c) { return c.speedup; }},
      {"fused intattention faster than fused quant-only at every L", Bound::above, 1.0,
       "fused quant-only / fused intattention", "every cell", [](const Cell&) { return true; },
       [](const Cell& c) { return c.t_qo / c.t_int; }},
      {"materialised time order fp32 > quant-only > intattention", Bound::above, 1.0,
       "min(fp32 / quant-only, quant-only / intattention), materialised", "every cell",
       [](const Cell&) { return true; }, [](const Cell& c) { return std::min(c.t_fp32 / c.t_qo_m, c.t_qo_m / c.t_int_m); }},
      {"peak memory of fused intattention at L = 16384 <= 64 MB", Bound::at_most, 64,
       "whole-process peak RSS while the row ran, MB", "L = 16384",
       [](const Cell& c) { return c.l == 16384 && c.rss_int > 0; }, [](const Cell& c) { return c.rss_int * 1.048576; }, 1},
  };
  return list;
}

const char* bound_text(Bound b) { return b == Bound::at_most ? "<=" : b == Bound::at_least ? ">=" : ">"; }

// The declarative table itself, as docs/kernels.md holds it between markers.
std::string targets_markdown() {
  Table t{{"target", "figure", "bound", "cells it reads"}, {}};
  for (const BenchTarget& b : bench_targets())
    t.rows.push_back({b.name, b.figure, std::string(bound_text(b.bound)) + " " + fmt(b.threshold, 2), b.cells});
  return "<!-- begin: qattn bench --list-targets, targets -->\n" + t.markdown() +
         "<!-- end: targets -->\n";
}

// Every target on the run's cells: one markdown line each, and the same as JSON.
std::string check_targets(const std::vector<Cell>& cells, json& out) {
  std::ostringstream text;
  out = json::array();
  for (const BenchTarget& b : bench_targets()) {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells) {
      if (!b.applies(c)) continue;
      const double v = b.value(c);
      if (!std::isfinite(v)) continue;
      any = true;
      ok = ok && (b.bound == Bound::at_most ? v <= b.threshold : b.bound == Bound::at_least ? v >= b.threshold : v > b.threshold);
      fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c.l) + " t" + std::to_string(c.threads) + ": " + fmt(v, b.places));
    }
    const std::string verdict = !any ? "not measured in this run" : ok ? "met" : "missed";
    text << "- " << b.name << ": **" << verdict << "**" << (fig.empty() ? "" : " (" + fig + ")") << "\n";
    out.push_back({{"target", b.name}, {"verdict", verdict}, {"figures", fig}});
  }
  return text.str();
}

// ---- measuring ------------------------------------------------------------------------------------------------

// The rate of the ISA's register-only MAC loop, 1 thread, about 0.3 s: the "% of peak" denominator.
double measure_peak_gmacs(Isa isa) {
  std::int32_t checksum = 0;
  std::int64_t iters = 1 << 20;
  double peak = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    const std::int64_t macs = int8_mac_peak_loop(isa, iters, &checksum);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    peak = std::max(peak, macs / s * 1e-9);
    if (s < 0.1) iters *= 4;
  }
  return peak;
}

// The same loop on `threads` threads at once, each its own iterations (about 0.1 s), best of 3: the rate they reach
// together. On a VM whose vCPUs share a core's vector units this is well under `threads` times one core's, and a
// kernel bound by those units cannot scale past it (docs/kernels.md).
double measure_peak_gmacs_together(Isa isa, int threads) {
  std::int64_t iters = 1 << 20;
  for (;;) {  // the count that takes about 0.1 s alone
    std::int32_t checksum = 0;
    const auto t0 = Clock::now();
    int8_mac_peak_loop(isa, iters, &checksum);
    if (std::chrono::duration<double>(Clock::now() - t0).count() >= 0.1 || iters > (std::int64_t{1} << 40)) break;
    iters *= 2;
  }
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::int64_t> macs(static_cast<std::size_t>(threads));
    std::vector<std::int32_t> sums(static_cast<std::size_t>(threads));
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { macs[t] = int8_mac_peak_loop(isa, iters, &sums[t]); });
    for (std::thread& th : pool) th.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    double total = 0;
    for (const std::int64_t m : macs) total += static_cast<double>(m);
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

// One L's inputs: Q, K, V drawn as float32 N(0, 1) and quantised per tensor as the pipelines quantise
// (qattn/quantize.h). Only the INT8 copies are held; the fp32 row draws the floats again (float_inputs) while it
// runs, so that the integer rows' peak memory is their own inputs' and buffers', whatever other rows the run asks for.
struct BenchInputs {
  int l = 0, d = 0;
  std::mt19937_64 draws;  // the generator's state before Q, K, V were drawn
  std::vector<std::int8_t> q8, k8, v8;
  double sq = 0, sk = 0, sv = 0;
};

struct FloatInputs {
  RowMatrixXf q, k, v;
};

// The floats make_inputs drew for `in`, drawn again from the same state: the same values. `after`, if given, gets the
// generator's state past them.
FloatInputs float_inputs(const BenchInputs& in, std::mt19937_64* after = nullptr) {
  std::mt19937_64 g = in.draws;
  std::normal_distribution<float> n(0, 1);
  FloatInputs f{RowMatrixXf(in.l, in.d), RowMatrixXf(in.l, in.d), RowMatrixXf(in.l, in.d)};
  for (RowMatrixXf* m : {&f.q, &f.k, &f.v})
    for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = n(g);
  if (after) *after = g;
  return f;
}

BenchInputs make_inputs(int l, int d, std::mt19937_64& g) {
  BenchInputs in;
  in.l = l;
  in.d = d;
  in.draws = g;
  const FloatInputs f = float_inputs(in, &g);
  auto quant = [](const RowMatrixXf& x, double* s) {
    std::vector<std::int8_t> q(static_cast<std::size_t>(x.size()));
    *s = quantize_int8_symmetric(std::span<const float>(x.data(), q.size()), std::span<std::int8_t>(q));
    return q;
  };
  in.q8 = quant(f.q, &in.sq), in.k8 = quant(f.k, &in.sk), in.v8 = quant(f.v, &in.sv);
  return in;
}

// The two softmax row kernels alone, 1 thread, on one block of 64 rows of this input's S = Q K^T: ns per element.
std::pair<double, double> measure_softmax_rows(const BenchInputs& in, Isa isa, const IndexSoftmaxParams& index_params,
                                               int reps) {
  const int l = in.l, d = in.d;
  const Eigen::Index rows = std::min(64, l);
  std::vector<std::int32_t> s_block(static_cast<std::size_t>(rows) * l);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (int j = 0; j < l; ++j) {
      std::int32_t acc = 0;
      for (int t = 0; t < d; ++t) acc += std::int32_t{in.q8[i * d + t]} * in.k8[static_cast<std::size_t>(j) * d + t];
      s_block[i * l + j] = acc;
    }
  std::vector<std::uint8_t> p_block(s_block.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::int64_t c_int = cint_from_alpha(index_params.c, in.sq * in.sk * scale, index_params.cint_rounding);
  const float alpha = static_cast<float>(in.sq * in.sk * scale);
  auto per_element_ns = [&](IntPipeline pipeline) {
    return median_ms(reps, [&] {
      int_attention_softmax_rows(isa, pipeline, index_params, c_int, alpha, s_block.data(), rows, l, p_block.data());
    }) * 1e6 / static_cast<double>(s_block.size());
  };
  return {per_element_ns(IntPipeline::intattention), per_element_ns(IntPipeline::quant_only)};
}

// One printed row of the timing table.
struct Row {
  std::string name;
  double ms, rss;
  bool is_int;
};

// Every row group the options ask for at one (L, threads); fills the cell's medians and returns the printed rows.
std::vector<Row> measure_cell(const BenchOptions& o, const BenchInputs& in, Isa isa, const IndexSoftmaxParams& index_params,
                              double peak_gmacs, Cell& c, json& j) {
  const int l = in.l, threads = c.threads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(o.d)), macs = 1.0 * l * l * o.d;  // per GEMM
  std::vector<float> out(static_cast<std::size_t>(l) * o.d);
  IntAttentionConfig cfg;
  cfg.isa = isa;
  cfg.threads = threads;
  cfg.softmax = index_params;
  using Stages = IntAttentionConfig::Stages;
  // One form of the fused call, as a function the timer runs.
  auto int_form = [&](Stages stages, IntPipeline pipeline = IntPipeline::intattention, bool materialise = false) {
    return std::function<void()>([&, stages, pipeline, materialise] {
      cfg.stages = stages;
      cfg.pipeline = pipeline;
      cfg.materialise = materialise;
      int_attention_fused({in.q8.data(), l, o.d, in.sq}, {in.k8.data(), l, o.d, in.sk}, {in.v8.data(), l, o.d, in.sv},
                          scale, cfg, out.data());
    });
  };
  auto share_of_peak = [&](double m, double ms) { return m / (ms * 1e-3) * 1e-9 / (peak_gmacs * threads) * 100; };
  std::vector<Row> rows;
  if (wants(o, "fused")) {
    // The group's five forms in turns: fused / gemm-only and the stage shares come from the same minutes.
    std::vector<double> rss;
    const std::vector<double> t = interleaved_medians_ms(
        o.reps, {int_form(Stages::all), int_form(Stages::gemms), int_form(Stages::all, IntPipeline::quant_only),
                 int_form(Stages::qk), int_form(Stages::pv)}, &rss);
    c.t_int = t[0], c.t_gemm = t[1], c.t_qo = t[2], c.t_qk = t[3], c.t_pv = t[4];
    const double r_int = rss[0], r_gemm = rss[1], r_qo = rss[2];
    c.qk_eff = share_of_peak(macs, c.t_qk);
    c.pv_eff = share_of_peak(macs, c.t_pv);
    c.rss_int = r_int;
    rows.push_back({"intattention fused", c.t_int, r_int, true});
    rows.push_back({"quant-only fused", c.t_qo, r_qo, true});
    rows.push_back({"gemm-only", c.t_gemm, r_gemm, true});
    j["gemm_stages"].push_back({{"L", l}, {"threads", threads}, {"qk_ms", c.t_qk}, {"pv_ms", c.t_pv},
                                {"qk_percent_of_peak", c.qk_eff}, {"pv_percent_of_peak", c.pv_eff},
                                {"gemms_percent_of_peak", share_of_peak(2 * macs, c.t_gemm)}});
  }
  if (wants(o, "fused") && threads == 2) {
    // The 2-thread speedup from 1- and 2-thread calls in turns, so that both medians come from the same minutes: the
    // cells of two thread counts run minutes apart, and on a VM the second vCPU is not always a second core.
    const std::function<void()> all = int_form(Stages::all);
    const std::vector<double> t =
        interleaved_medians_ms(o.reps, {[&] { cfg.threads = 1, all(); }, [&] { cfg.threads = 2, all(); }});
    cfg.threads = threads;
    c.t_int_turns1 = t[0], c.t_int_turns2 = t[1], c.speedup = t[0] / t[1];
    j["speedup_in_turns"].push_back(
        {{"L", l}, {"one_thread_ms", t[0]}, {"two_threads_ms", t[1]}, {"speedup", c.speedup}});
  }
  if (wants(o, "materialised")) {
    std::vector<double> rss;
    const std::vector<double> t = interleaved_medians_ms(
        o.reps, {int_form(Stages::all, IntPipeline::intattention, true), int_form(Stages::all, IntPipeline::quant_only, true)},
        &rss);
    c.t_int_m = t[0], c.t_qo_m = t[1];
    const double r_int_m = rss[0], r_qo_m = rss[1];
    rows.push_back({"intattention materialised", c.t_int_m, r_int_m, true});
    rows.push_back({"quant-only materialised", c.t_qo_m, r_qo_m, true});
  }
  if (wants(o, "onednn") && onednn_built()) {
    const OneDnnTimes dn = time_onednn_gemms(in.q8.data(), in.k8.data(), in.v8.data(), l, o.d, threads, o.reps);
    c.t_dnnl_qk = dn.qk_ms;
    c.t_dnnl_pv = dn.pv_ms;
    j["onednn_stages"].push_back({{"L", l}, {"threads", threads}, {"qk_ms", dn.qk_ms}, {"pv_ms", dn.pv_ms}});
  }
  if (wants(o, "fp32")) {
    double r_fp32;
    const FloatInputs f = float_inputs(in);
    RowMatrixXf of(l, o.d);
    c.t_fp32 = median_ms(o.reps, [&] { fp32_attention_blocks(f.q, f.k, f.v, static_cast<float>(scale), threads, of); }, &r_fp32);
    rows.push_back({"fp32 blocks (Eigen)", c.t_fp32, r_fp32, false});
  }
  return rows;
}

// The figure that compares two cells: the growth from L = 4096 to 16384.
void relate_cells(std::vector<Cell>& cells) {
  for (Cell& c : cells)
    for (const Cell& other : cells)
      if (c.l == 16384 && other.l == 4096 && other.threads == c.threads) c.growth = c.t_int / other.t_int;
}

// ---- the report -----------------------------------------------------------------------------------------------

// The timing table's row for one measured pipeline.
std::vector<std::string> timing_row(const Cell& c, const Row& r, int d, double peak_gmacs) {
  const double ops = 4.0 * c.l * c.l * d;  // two GEMMs, 2 ops per MAC
  const bool gemm_row = r.name == "gemm-only";
  return {std::to_string(c.l), std::to_string(d), std::to_string(c.threads), r.name, fmt(r.ms, 2),
          fmt(ops / (r.ms * 1e-3) * 1e-9, 1), fmt(r.ms / c.t_gemm, 2), fmt(c.t_fp32 / r.ms, 2),
          r.is_int && !gemm_row && std::isfinite(c.t_gemm) ? fmt((r.ms - c.t_gemm) / r.ms * 100, 1) + " %" : "-",
          gemm_row ? fmt((ops / 2) / (r.ms * 1e-3) * 1e-9 / (peak_gmacs * c.threads) * 100, 1) + " % (QK " +
                         fmt(c.qk_eff, 0) + " %, PV " + fmt(c.pv_eff, 0) + " %)"
                   : "-",
          fmt(c.t_qo / r.ms, 2), fmt(r.rss, 1)};
}

// The tables under the timing table: the softmax rows alone and the GEMM stages against oneDNN.
std::string anchor_tables(const BenchOptions& o, const std::vector<Cell>& cells, const std::string& index_kernel,
                          const std::string& float_kernel) {
  std::string text;
  Table softmax{{"L", "IndexSoftmax row ns/element", "float softmax row ns/element", "float / IndexSoftmax"}, {}};
  for (const Cell& c : cells)
    if (std::isfinite(c.ns_index))
      softmax.rows.push_back({std::to_string(c.l), fmt(c.ns_index, 3), fmt(c.ns_float, 3), fmt(c.ns_float / c.ns_index, 2)});
  if (!softmax.rows.empty())
    text += "\nSoftmax row kernels alone (" + index_kernel + " vs " + float_kernel +
            "; 64 rows of this run's S, 1 thread, every key visible)\n\n" + softmax.markdown();
  Table turns{{"L", "1 thread ms", "2 threads ms", "speedup"}, {}};
  for (const Cell& c : cells)
    if (std::isfinite(c.speedup))
      turns.rows.push_back({std::to_string(c.l), fmt(c.t_int_turns1, 2), fmt(c.t_int_turns2, 2), fmt(c.speedup, 2)});
  if (!turns.rows.empty())
    text += "\nFused intattention at 1 and 2 threads, the two calls timed in turns (medians of " +
            std::to_string(o.reps) + ")\n\n" + turns.markdown();
  Table anchor{{"L", "threads", "Q.K^T ours ms", "Q.K^T oneDNN ms", "ours / oneDNN", "P.V ours ms", "P.V oneDNN ms",
                "ours / oneDNN", "fused intattention / oneDNN two GEMMs"},
               {}};
  for (const Cell& c : cells)
    if (std::isfinite(c.t_dnnl_qk))
      anchor.rows.push_back({std::to_string(c.l), std::to_string(c.threads), fmt(c.t_qk, 2), fmt(c.t_dnnl_qk, 2),
                             fmt(c.t_qk / c.t_dnnl_qk, 2), fmt(c.t_pv, 2), fmt(c.t_dnnl_pv, 2),
                             fmt(c.t_pv / c.t_dnnl_pv, 2), fmt(c.t_int / dnnl_two(c), 2)});
  if (wants(o, "onednn"))
    text += "\nGEMM stages against " + onednn_version() + " (same shapes; ours: int_attention_fused with one stage, K/V "
            "packing included; oneDNN: plain row-major Q, K read as K^T, P, V, primitives made outside the timing)\n\n" +
            (anchor.rows.empty() ? std::string("(no oneDNN rows in this build)\n") : anchor.markdown());
  return text;
}

Isa bench_isa(const std::string& name) {
  Isa isa;
  try {
    isa = name.empty() ? default_isa() : parse_isa(name);
  } catch (const std::exception& e) {
    throw CLI::ValidationError("--isa", e.what());
  }
  if (!isa_available(isa))
    throw CLI::ValidationError("--isa", name + " is not available on this CPU or build (available: " +
                                            available_isa_names() + ")");
  return isa;
}

// --index: any method that takes IndexSoftmax's parameters (index, intattention) names a configuration of the kernels.
IndexSoftmaxParams bench_index_params(const MethodSpec& spec, const std::string& text) {
  const MethodEntry* entry = ref::reference_registry().find(spec.name);
  for (const ParamInfo& p : ref::index_softmax_param_infos())
    if (!entry || std::none_of(entry->params.begin(), entry->params.end(), [&](const ParamInfo& q) { return q.key == p.key; }))
      throw SpecError("--index: expected a method with IndexSoftmax's parameters such as index@paper, got '" + text + "'");
  return ref::index_softmax_params(ref::reference_registry().resolve(spec));
}

// What the report says before its table: the machine, the kernels, the peak, the block rows and how it measured.
std::string bench_header(const BenchOptions& o, Isa isa, const IntAttentionKernels& names, const std::string& qo_softmax,
                         const std::string& index, double peak_gmacs, int most_threads, double together_gmacs,
                         long rss_mib) {
  IntAttentionConfig chosen;  // the rows the fused rows ran with: the ISA's own, or the rule from L_k
  chosen.isa = isa;
  std::string block_rows_text;
  for (int l : o.lengths)
    block_rows_text += (block_rows_text.empty() ? "" : ", ") + ("L " + std::to_string(l) + ": " +
                                                                 std::to_string(int_attention_block_rows(chosen, l)));
  std::ostringstream head;
  head << "qattn bench: " << cpu_model() << ", " << std::thread::hardware_concurrency() << " hardware threads\n"
       << "ISA " << isa_name(isa) << ": " << names.qk << ", " << names.softmax << " (quant-only: " << qo_softmax << "), "
       << names.pv << "\n"
       << "IndexSoftmax: " << index << "\n"
       << "int8 MAC peak, 1 core (" << isa_name(isa) << " loop, register-only inline assembly): " << peak_gmacs << " GMAC/s\n"
       << (most_threads > 1 ? "the same loop on " + std::to_string(most_threads) + " threads at once: " + fmt(together_gmacs, 1) +
                                  " GMAC/s together, " + fmt(together_gmacs / peak_gmacs, 2) +
                                  " x one core (what the vector units give more threads here)\n"
                            : std::string())
       << "query rows per block (the ISA's own, or chosen from L_k): " << block_rows_text << "\n"
       << "medians of " << o.reps << " runs after one warm-up; the fused rows with the Q.K^T and P.V stages, and the "
       << "two materialised rows, are timed in turns (one call of each, then again), so their ratios come from the same "
       << "minutes; GOP/s counts the two GEMMs (4 L^2 d ops); "
       << "fp32 blocks runs Eigen at this build's baseline ISA; peak RSS per row is the process's high-water mark "
       << "while that row's warm-up ran (its inputs included: INT8 Q, K, V for the integer rows, float32 for the fp32 row; "
       << rss_mib << " MiB for the whole run)\n\n";
  return head.str();
}

void run_bench(const BenchOptions& o) {
  if (o.list_targets) {
    emit(targets_markdown(), o.out);
    return;
  }
  const Isa isa = bench_isa(o.isa);
  require_range("--d", o.d, 1, kMaxBenchD);
  require_range("--reps", o.reps, 1, kMaxBenchReps);
  if (o.lengths.empty() || o.threads.empty()) throw CLI::ValidationError("--L/--threads", "give at least one value");
  for (int l : o.lengths) require_range("--L", l, 1, kMaxBenchL);
  for (int t : o.threads) require_range("--threads", t, 1, kMaxThreads);
  const MethodSpec index_spec = parse_method_spec(o.index);
  const IndexSoftmaxParams index_params = bench_index_params(index_spec, o.index);
  const IntAttentionKernels names = int_attention_kernels(isa);
  const std::string qo_softmax = int_attention_kernels(isa, IntPipeline::quant_only).softmax;
  const double peak_gmacs = measure_peak_gmacs(isa);
  const int most_threads = *std::max_element(o.threads.begin(), o.threads.end());
  const double together_gmacs = most_threads > 1 ? measure_peak_gmacs_together(isa, most_threads) : kNan;

  Table t{{"L", "d", "threads", "pipeline", "median ms", "GOP/s", "vs gemm-only", "fp32 / this", "softmax share",
           "GEMM % of peak", "quant-only / this", "peak RSS MiB"},
          {}};
  json j = {{"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}, {"isa", isa_name(isa)},
            {"kernels", {{"qk", names.qk}, {"softmax", names.softmax}, {"softmax_quant_only", qo_softmax}, {"pv", names.pv}}},
            {"peak_int8_gmacs_per_core", peak_gmacs}, {"reps", o.reps}, {"runs", json::array()}};
  if (most_threads > 1)
    j["peak_int8_gmacs_together"] = {{"threads", most_threads}, {"gmacs", together_gmacs}, {"x_one_core", together_gmacs / peak_gmacs}};
  std::vector<Cell> cells;
  std::mt19937_64 g(1);
  for (int l : o.lengths) {
    const BenchInputs in = make_inputs(l, o.d, g);
    for (std::size_t ti = 0; ti < o.threads.size(); ++ti) {
      Cell c;
      c.l = l;
      c.threads = o.threads[ti];
      if (ti == 0 && wants(o, "softmax")) {
        std::tie(c.ns_index, c.ns_float) = measure_softmax_rows(in, isa, index_params, o.reps);
        j["softmax_rows"].push_back({{"L", l}, {"index_ns_per_element", c.ns_index}, {"float_ns_per_element", c.ns_float}});
      }
      for (const Row& r : measure_cell(o, in, isa, index_params, peak_gmacs, c, j)) {
        t.rows.push_back(timing_row(c, r, o.d, peak_gmacs));
        j["runs"].push_back({{"L", l}, {"d", o.d}, {"threads", c.threads}, {"pipeline", r.name}, {"median_ms", r.ms},
                             {"gops", 4.0 * l * l * o.d / (r.ms * 1e-3) * 1e-9}, {"peak_rss_mib", r.rss}});
      }
      cells.push_back(c);
      std::cerr << "qattn bench: L " << l << ", " << c.threads << " thread(s) done\n";
    }
  }
  relate_cells(cells);
  json jt;
  const std::string targets = check_targets(cells, jt);
  j["onednn"] = onednn_version();
  j["targets"] = jt;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  j["peak_rss_mib"] = ru.ru_maxrss / 1024.0;
  j["index"] = ref::reference_registry().canonical(index_spec);
  IntAttentionConfig chosen;  // the rows the fused rows ran with: the ISA's own, or the rule from L_k
  chosen.isa = isa;
  for (int l : o.lengths) j["block_rows"].push_back({{"L", l}, {"rows", int_attention_block_rows(chosen, l)}});
  const std::string head = bench_header(o, isa, names, qo_softmax, ref::reference_registry().canonical(index_spec),
                                        peak_gmacs, most_threads, together_gmacs, ru.ru_maxrss / 1024);
  emit(o.format == "json" ? j.dump(2) + "\n"
                          : head + t.markdown() + anchor_tables(o, cells, names.softmax_row, qo_softmax) +
                                "\nTargets (docs/kernels.md):\n" + targets,
       o.out);
}

}  // namespace

void add_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "Time the fused integer attention against its GEMM floor and fp32 (medians)");
  auto o = std::make_shared<BenchOptions>();
  sub->add_option("--L", o->lengths, "sequence lengths L = L_q = L_k")->delimiter(',')->capture_default_str();
  sub->add_option("--d", o->d, "head dimension")->capture_default_str();
  sub->add_option("--threads", o->threads, "thread counts")->delimiter(',')->capture_default_str();
  sub->add_option("--reps", o->reps, "timed repetitions per cell (median)")->capture_default_str();
  sub->add_option("--isa", o->isa, "scalar|avx2|avxvnni|avx512|amx|neon-dotprod|neon-i8mm (default: QATTN_ISA or the best)");
  sub->add_option("--index", o->index, "IndexSoftmax spec of the intattention rows")->capture_default_str();
  sub->add_option("--format", o->format, "md|json")->check(CLI::IsMember({"md", "json"}))->capture_default_str();
  sub->add_option("--out", o->out, "write here instead of stdout");
  sub->add_option("--rows", o->rows,
                  "row groups to time: fused (intattention, quant-only, gemm-only), materialised, fp32, onednn (its "
                  "two GEMMs, where the build has oneDNN), softmax (the two softmax row kernels alone)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fused", "materialised", "fp32", "onednn", "softmax"}))
      ->capture_default_str();
  sub->add_flag("--list-targets", o->list_targets,
                "print the targets the run checks (name, bound, figure) as docs/kernels.md holds them, and exit");
  sub->callback([o] { run_bench(*o); });
}

}  // namespace qattn::cli
