// qattn bench: the fused integer attention against its own GEMM floor and an fp32 baseline, timed in one run.
// Medians over repetitions (one warm-up first), with the CPU, ISA, kernels, threads, L and d printed. A program,
// not a test: timings drift between moments on a shared machine, so compare ratios within one run.
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "commands.h"
#include "onednn_gemm.h"
#include "qattn/error.h"
#include "qattn/int_attention.h"
#include "qattn/parallel.h"
#include "qattn/quantize.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"
#include "table.h"

namespace qattn::cli {
namespace {

// Bounds of the bench's options: the materialised rows hold L^2 int32 S and L^2 u8 P (5 GiB at L = 32768).
constexpr int kMaxBenchL = 32768, kMaxBenchD = 1024, kMaxBenchReps = 1000;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

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

// Peak resident memory per row: writing 5 to /proc/self/clear_refs resets the kernel's high-water mark (VmHWM), so
// each row's figure is what the process held at most while that row ran (inputs included). -1 where /proc lacks it.
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
};

bool wants(const BenchOptions& o, const std::string& group) {
  return std::find(o.rows.begin(), o.rows.end(), group) != o.rows.end();
}

void run_bench(const BenchOptions& o) {
  Isa isa;
  try {
    isa = o.isa.empty() ? default_isa() : parse_isa(o.isa);
  } catch (const std::exception& e) {
    throw CLI::ValidationError("--isa", e.what());
  }
  if (!isa_available(isa))
    throw CLI::ValidationError("--isa", o.isa + " is not available on this CPU or build (available: " +
                                            available_isa_names() + ")");
  require_range("--d", o.d, 1, kMaxBenchD);
  require_range("--reps", o.reps, 1, kMaxBenchReps);
  if (o.lengths.empty() || o.threads.empty()) throw CLI::ValidationError("--L/--threads", "give at least one value");
  for (int l : o.lengths) require_range("--L", l, 1, kMaxBenchL);
  for (int t : o.threads) require_range("--threads", t, 1, kMaxThreads);
  const MethodSpec index_spec = parse_method_spec(o.index);
  // Any method that takes IndexSoftmax's parameters (index, intattention) names a configuration of the kernels.
  const MethodEntry* index_entry = ref::reference_registry().find(index_spec.name);
  for (const ParamInfo& p : ref::index_softmax_param_infos())
    if (!index_entry || std::none_of(index_entry->params.begin(), index_entry->params.end(),
                                     [&](const ParamInfo& q) { return q.key == p.key; }))
      throw SpecError("--index: expected a method with IndexSoftmax's parameters such as index@paper, got '" + o.index +
                      "'");
  const IndexSoftmaxParams index_params = ref::index_softmax_params(ref::reference_registry().resolve(index_spec));
  const IntAttentionKernels names = int_attention_kernels(isa);
  const std::string qo_softmax = int_attention_kernels(isa, IntPipeline::quant_only).softmax;

  // Peak: 1 thread, the GEMMs' MAC instruction, about 0.3 s.
  std::int32_t checksum = 0;
  std::int64_t iters = 1 << 20;
  double peak_gmacs = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    const std::int64_t macs = int8_mac_peak_loop(isa, iters, &checksum);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    peak_gmacs = std::max(peak_gmacs, macs / s * 1e-9);
    if (s < 0.1) iters *= 4;
  }

  Table t{{"L", "d", "threads", "pipeline", "median ms", "GOP/s", "vs gemm-only", "fp32 / this", "softmax share",
           "GEMM % of peak", "quant-only / this", "peak RSS MiB"},
          {}};
  json j = {{"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}, {"isa", isa_name(isa)},
            {"kernels", {{"qk", names.qk}, {"softmax", names.softmax}, {"softmax_quant_only", qo_softmax}, {"pv", names.pv}}},
            {"peak_int8_gmacs_per_core", peak_gmacs}, {"reps", o.reps}, {"runs", json::array()}};
  auto fmt = [](double x, int p) {
    if (!std::isfinite(x)) return std::string("-");
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(p);
    s << x;
    return s.str();
  };
  // Per (L, threads): the medians the targets need.
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  struct Cell {
    int l, threads;
    double t_int = kNan, t_gemm = kNan, t_qo = kNan, qk_eff = kNan, pv_eff = kNan, t_int_m = kNan, t_qo_m = kNan,
           t_fp32 = kNan, rss_int = kNan, t_qk = kNan, t_pv = kNan, t_dnnl_qk = kNan, t_dnnl_pv = kNan;
  };
  std::vector<Cell> cells;
  struct SoftmaxRows {
    int l;
    double ns_index, ns_float;
  };
  std::vector<SoftmaxRows> softmax_rows;
  std::mt19937_64 g(1);
  std::normal_distribution<float> n(0, 1);
  for (int l : o.lengths) {
    RowMatrixXf qf(l, o.d), kf(l, o.d), vf(l, o.d);
    for (auto* m : {&qf, &kf, &vf})
      for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = n(g);
    auto quant = [](const RowMatrixXf& x, double* s) {  // the pipelines' quantiser (qattn/quantize.h)
      std::vector<std::int8_t> q(static_cast<std::size_t>(x.size()));
      *s = quantize_int8_symmetric(std::span<const float>(x.data(), q.size()), std::span<std::int8_t>(q));
      return q;
    };
    double sq, sk, sv;
    const auto q8 = quant(qf, &sq), k8 = quant(kf, &sk), v8 = quant(vf, &sv);
    std::vector<float> out(static_cast<std::size_t>(l) * o.d);
    RowMatrixXf of;
    if (wants(o, "fp32")) of.resize(l, o.d);
    else qf.resize(0, 0), kf.resize(0, 0), vf.resize(0, 0);  // the integer rows' memory is then theirs alone
    const double scale = 1.0 / std::sqrt(static_cast<double>(o.d));
    const double ops = 4.0 * l * l * o.d;  // two GEMMs, 2 ops per MAC
    if (wants(o, "softmax")) {
      // The two row kernels alone, 1 thread, on one block of 64 rows of this run's S = Q K^T: per element.
      const Eigen::Index rows = std::min(64, l);
      std::vector<std::int32_t> s_block(static_cast<std::size_t>(rows) * l);
      for (Eigen::Index i = 0; i < rows; ++i)
        for (int j = 0; j < l; ++j) {
          std::int32_t acc = 0;
          for (int t = 0; t < o.d; ++t) acc += std::int32_t{q8[i * o.d + t]} * k8[static_cast<std::size_t>(j) * o.d + t];
          s_block[i * l + j] = acc;
        }
      std::vector<std::uint8_t> p_block(s_block.size());
      const std::int64_t c_int = cint_from_alpha(index_params.c, sq * sk * scale, index_params.cint_rounding);
      const float alpha = static_cast<float>(sq * sk * scale);
      auto per_element_ns = [&](IntPipeline pipeline) {
        return median_ms(o.reps, [&] {
          int_attention_softmax_rows(isa, pipeline, index_params, c_int, alpha, s_block.data(), rows, l, p_block.data());
        }) * 1e6 / static_cast<double>(s_block.size());
      };
      const double ns_index = per_element_ns(IntPipeline::intattention), ns_float = per_element_ns(IntPipeline::quant_only);
      softmax_rows.push_back({l, ns_index, ns_float});
      j["softmax_rows"].push_back({{"L", l}, {"index_ns_per_element", ns_index}, {"float_ns_per_element", ns_float}});
    }
    for (int threads : o.threads) {
      Cell c{l, threads};
      IntAttentionConfig cfg;
      cfg.isa = isa;
      cfg.threads = threads;
      cfg.softmax = index_params;
      using Stages = IntAttentionConfig::Stages;
      auto run_int = [&](Stages stages, IntPipeline pipeline = IntPipeline::intattention, bool materialise = false,
                         double* rss = nullptr) {
        cfg.stages = stages;
        cfg.pipeline = pipeline;
        cfg.materialise = materialise;
        return median_ms(o.reps, [&] {
          int_attention_fused({q8.data(), l, o.d, sq}, {k8.data(), l, o.d, sk}, {v8.data(), l, o.d, sv}, scale, cfg,
                              out.data());
        }, rss);
      };
      struct Row {
        std::string name;
        double ms, rss;
        bool is_int;
      };
      std::vector<Row> rows;
      if (wants(o, "fused")) {
        double r_int, r_qo, r_gemm;
        c.t_int = run_int(Stages::all, IntPipeline::intattention, false, &r_int);
        c.t_gemm = run_int(Stages::gemms, IntPipeline::intattention, false, &r_gemm);
        c.t_qo = run_int(Stages::all, IntPipeline::quant_only, false, &r_qo);
        const double t_qk = c.t_qk = run_int(Stages::qk), t_pv = c.t_pv = run_int(Stages::pv);
        auto share_of_peak = [&](double macs, double ms) { return macs / (ms * 1e-3) * 1e-9 / (peak_gmacs * threads) * 100; };
        c.qk_eff = share_of_peak(ops / 4, t_qk);
        c.pv_eff = share_of_peak(ops / 4, t_pv);
        c.rss_int = r_int;
        rows.push_back({"intattention fused", c.t_int, r_int, true});
        rows.push_back({"quant-only fused", c.t_qo, r_qo, true});
        rows.push_back({"gemm-only", c.t_gemm, r_gemm, true});
        j["gemm_stages"].push_back({{"L", l}, {"threads", threads}, {"qk_ms", t_qk}, {"pv_ms", t_pv},
                                    {"qk_percent_of_peak", c.qk_eff}, {"pv_percent_of_peak", c.pv_eff},
                                    {"gemms_percent_of_peak", share_of_peak(ops / 2, c.t_gemm)}});
      }
      if (wants(o, "materialised")) {
        double r_int_m, r_qo_m;
        c.t_int_m = run_int(Stages::all, IntPipeline::intattention, true, &r_int_m);
        c.t_qo_m = run_int(Stages::all, IntPipeline::quant_only, true, &r_qo_m);
        rows.push_back({"intattention materialised", c.t_int_m, r_int_m, true});
        rows.push_back({"quant-only materialised", c.t_qo_m, r_qo_m, true});
      }
      if (wants(o, "onednn") && onednn_built()) {
        const OneDnnTimes dn = time_onednn_gemms(q8.data(), k8.data(), v8.data(), l, o.d, threads, o.reps);
        c.t_dnnl_qk = dn.qk_ms;
        c.t_dnnl_pv = dn.pv_ms;
        j["onednn_stages"].push_back({{"L", l}, {"threads", threads}, {"qk_ms", dn.qk_ms}, {"pv_ms", dn.pv_ms}});
      }
      if (wants(o, "fp32")) {
        double r_fp32;
        c.t_fp32 = median_ms(o.reps, [&] { fp32_attention_blocks(qf, kf, vf, static_cast<float>(scale), threads, of); }, &r_fp32);
        rows.push_back({"fp32 blocks (Eigen)", c.t_fp32, r_fp32, false});
      }
      for (const Row& r : rows) {
        const bool gemm_row = r.name == "gemm-only";
        t.rows.push_back({std::to_string(l), std::to_string(o.d), std::to_string(threads), r.name, fmt(r.ms, 2),
                          fmt(ops / (r.ms * 1e-3) * 1e-9, 1), fmt(r.ms / c.t_gemm, 2), fmt(c.t_fp32 / r.ms, 2),
                          r.is_int && !gemm_row && std::isfinite(c.t_gemm) ? fmt((r.ms - c.t_gemm) / r.ms * 100, 1) + " %" : "-",
                          gemm_row ? fmt((ops / 2) / (r.ms * 1e-3) * 1e-9 / (peak_gmacs * threads) * 100, 1) + " % (QK " +
                                         fmt(c.qk_eff, 0) + " %, PV " + fmt(c.pv_eff, 0) + " %)"
                                   : "-",
                          fmt(c.t_qo / r.ms, 2), fmt(r.rss, 1)});
        j["runs"].push_back({{"L", l}, {"d", o.d}, {"threads", threads}, {"pipeline", r.name}, {"median_ms", r.ms},
                             {"gops", ops / (r.ms * 1e-3) * 1e-9}, {"peak_rss_mib", r.rss}});
      }
      cells.push_back(c);
      std::cerr << "qattn bench: L " << l << ", " << threads << " thread(s) done\n";
    }
  }
  // The targets of docs/kernels.md, checked on this run's cells: one line each, with the figures behind it.
  std::ostringstream targets;
  json jt = json::array();
  auto target = [&](const std::string& name, bool measured, bool met, const std::string& figures) {
    const std::string verdict = !measured ? "not measured in this run" : met ? "met" : "missed";
    targets << "- " << name << ": **" << verdict << "**" << (figures.empty() ? "" : " (" + figures + ")") << "\n";
    jt.push_back({{"target", name}, {"verdict", verdict}, {"figures", figures}});
  };
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if (c.l >= 2048 && std::isfinite(c.t_int) && std::isfinite(c.t_gemm)) {
        any = true;
        ok = ok && c.t_int / c.t_gemm <= 1.10;
        fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c.l) + " t" + std::to_string(c.threads) + ": " + fmt(c.t_int / c.t_gemm, 2));
      }
    target("fused intattention <= 1.10 x gemm-only at L >= 2048", any, ok, fig);
  }
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if (std::isfinite(c.qk_eff)) {
        any = true;
        ok = ok && c.qk_eff >= 70 && c.pv_eff >= 85;
        fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c.l) + " t" + std::to_string(c.threads) + ": QK " + fmt(c.qk_eff, 0) + " %, PV " + fmt(c.pv_eff, 0) + " %");
      }
    target("int8 GEMMs: Q.K^T >= 70 % and P.V >= 85 % of the measured peak", any, ok, fig);
  }
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if (std::isfinite(c.t_int_m) && std::isfinite(c.t_qo_m) && std::isfinite(c.t_fp32)) {
        any = true;
        ok = ok && c.t_fp32 > c.t_qo_m && c.t_qo_m > c.t_int_m;
        fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c.l) + " t" + std::to_string(c.threads) + ": " + fmt(c.t_fp32, 1) + " > " + fmt(c.t_qo_m, 1) + " > " + fmt(c.t_int_m, 1) + " ms");
      }
    target("materialised time order fp32 > quant-only > intattention", any, ok, fig);
  }
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if (std::isfinite(c.t_int) && std::isfinite(c.t_qo)) {
        any = true;
        ok = ok && c.t_int < c.t_qo;
        fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c.l) + " t" + std::to_string(c.threads) + ": quant-only / intattention " + fmt(c.t_qo / c.t_int, 2));
      }
    target("fused intattention faster than fused quant-only at every L", any, ok, fig);
  }
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if (c.l == 16384 && std::isfinite(c.rss_int) && c.rss_int > 0) {
        any = true;
        ok = ok && c.rss_int * 1.048576 <= 64;  // MiB -> MB
        fig += (fig.empty() ? "" : ", ") + ("t" + std::to_string(c.threads) + ": " + fmt(c.rss_int * 1.048576, 1) + " MB whole process");
      }
    target("peak memory of fused intattention at L = 16384 <= 64 MB", any, ok, fig);
  }
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c1 : cells)
      for (const Cell& c2 : cells)
        if (c1.l == c2.l && c1.threads == 1 && c2.threads == 2 && std::isfinite(c1.t_int) && std::isfinite(c2.t_int)) {
          any = true;
          ok = ok && c1.t_int / c2.t_int >= 1.8;
          fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c1.l) + ": " + fmt(c1.t_int / c2.t_int, 2));
        }
    target("2-thread speedup of fused intattention >= 1.8", any, ok, fig);
  }
  // oneDNN, the anchor: our GEMM stages (each timed alone, packing included) against its matmuls on the same shapes.
  Table anchor{{"L", "threads", "Q.K^T ours ms", "Q.K^T oneDNN ms", "ours / oneDNN", "P.V ours ms", "P.V oneDNN ms",
                "ours / oneDNN", "fused intattention / oneDNN two GEMMs"},
               {}};
  for (const Cell& c : cells)
    if (std::isfinite(c.t_dnnl_qk))
      anchor.rows.push_back({std::to_string(c.l), std::to_string(c.threads), fmt(c.t_qk, 2), fmt(c.t_dnnl_qk, 2),
                             fmt(c.t_qk / c.t_dnnl_qk, 2), fmt(c.t_pv, 2), fmt(c.t_dnnl_pv, 2),
                             fmt(c.t_pv / c.t_dnnl_pv, 2), fmt(c.t_int / (c.t_dnnl_qk + c.t_dnnl_pv), 2)});
  for (const char* stage : {"Q.K^T", "P.V"}) {
    const bool qk = std::string(stage) == "Q.K^T";
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if ((c.l == 2048 || c.l == 4096 || c.l == 8192) && std::isfinite(c.t_dnnl_qk) && std::isfinite(c.t_qk)) {
        const double r = qk ? c.t_qk / c.t_dnnl_qk : c.t_pv / c.t_dnnl_pv;
        any = true;
        ok = ok && r <= 1.10;
        fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(c.l) + " t" + std::to_string(c.threads) + ": " + fmt(r, 2));
      }
    target(std::string("our ") + stage + " stage <= 1.10 x oneDNN's at L in {2048, 4096, 8192}", any, ok, fig);
  }
  {
    bool any = false, ok = true;
    std::string fig;
    for (const Cell& c : cells)
      if (c.l == 4096 && std::isfinite(c.t_dnnl_qk) && std::isfinite(c.t_int)) {
        const double r = c.t_int / (c.t_dnnl_qk + c.t_dnnl_pv);
        any = true;
        ok = ok && r <= 1.25;
        fig += (fig.empty() ? "" : ", ") + ("t" + std::to_string(c.threads) + ": " + fmt(r, 2));
      }
    target("fused intattention <= 1.25 x oneDNN's two GEMMs at L = 4096", any, ok, fig);
  }
  Table softmax_table{{"L", "IndexSoftmax row ns/element", "float softmax row ns/element", "float / IndexSoftmax"}, {}};
  {
    bool ok = true;
    std::string fig;
    for (const SoftmaxRows& r : softmax_rows) {
      softmax_table.rows.push_back({std::to_string(r.l), fmt(r.ns_index, 3), fmt(r.ns_float, 3), fmt(r.ns_float / r.ns_index, 2)});
      ok = ok && r.ns_float / r.ns_index >= 1.5;
      fig += (fig.empty() ? "" : ", ") + ("L " + std::to_string(r.l) + ": " + fmt(r.ns_float / r.ns_index, 2));
    }
    target("IndexSoftmax row >= 1.5 x faster per element than the float softmax row of fused quant-only",
           !softmax_rows.empty(), ok, fig);
  }
  j["onednn"] = onednn_version();
  j["targets"] = jt;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  j["peak_rss_mib"] = ru.ru_maxrss / 1024.0;
  j["index"] = ref::reference_registry().canonical(index_spec);
  std::ostringstream head;
  head << "qattn bench: " << cpu_model() << ", " << std::thread::hardware_concurrency() << " hardware threads\n"
       << "ISA " << isa_name(isa) << ": " << names.qk << ", " << names.softmax << " (quant-only: " << qo_softmax << "), "
       << names.pv << "\n"
       << "IndexSoftmax: " << ref::reference_registry().canonical(index_spec) << "\n"
       << "int8 MAC peak, 1 core (" << isa_name(isa) << " loop, register-only inline assembly): " << peak_gmacs << " GMAC/s\n"
       << "medians of " << o.reps << " runs after one warm-up; GOP/s counts the two GEMMs (4 L^2 d ops); "
       << "fp32 blocks runs Eigen at this build's baseline ISA; peak RSS per row is the process's high-water mark "
       << "while that row ran (inputs included; " << ru.ru_maxrss / 1024 << " MiB for the whole run)\n\n";
  std::string anchor_text;
  if (!softmax_rows.empty())
    anchor_text += "\nSoftmax row kernels alone (" + names.softmax + " vs " + qo_softmax +
                   "; 64 rows of this run's S, 1 thread, every key visible)\n\n" + softmax_table.markdown();
  if (wants(o, "onednn"))
    anchor_text += "\nGEMM stages against " + onednn_version() + " (same shapes; ours: int_attention_fused with one stage, K/V "
                  "packing included; oneDNN: plain row-major Q, K read as K^T, P, V, primitives made outside the timing)\n\n" +
                  (anchor.rows.empty() ? std::string("(no oneDNN rows in this build)\n") : anchor.markdown());
  emit(o.format == "json" ? j.dump(2) + "\n"
                          : head.str() + t.markdown() + anchor_text + "\nTargets (docs/kernels.md):\n" + targets.str(),
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
  sub->add_option("--isa", o->isa, "scalar|avx2|avx512|neon-dotprod|neon-i8mm (default: QATTN_ISA or the best)");
  sub->add_option("--index", o->index, "IndexSoftmax spec of the intattention rows")->capture_default_str();
  sub->add_option("--format", o->format, "md|json")->check(CLI::IsMember({"md", "json"}))->capture_default_str();
  sub->add_option("--out", o->out, "write here instead of stdout");
  sub->add_option("--rows", o->rows,
                  "row groups to time: fused (intattention, quant-only, gemm-only), materialised, fp32, onednn (its "
                  "two GEMMs, where the build has oneDNN), softmax (the two softmax row kernels alone)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fused", "materialised", "fp32", "onednn", "softmax"}))
      ->capture_default_str();
  sub->callback([o] { run_bench(*o); });
}

}  // namespace qattn::cli
