// qattn bench: the fused integer attention against its own GEMM floor and an fp32 baseline, timed in one run.
// Medians over repetitions (one warm-up first), with the CPU, ISA, kernels, threads, L and d printed. A program,
// not a test: timings drift between moments on a shared machine, so compare ratios within one run.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "commands.h"
#include "qattn/error.h"
#include "qattn/int_attention.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"
#include "table.h"

namespace qattn::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 || line.rfind("CPU part", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

template <typename F>
double median_ms(int reps, F&& f) {
  f();  // warm-up: first-touch pages, caches
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// fp32 attention by row blocks of 64: S = Q_blk K^T (Eigen GEMM at this build's baseline ISA), max-subtracted
// softmax with std::exp, O_blk = P V; blocks spread over threads. Memory O(64 L) per thread.
void fp32_attention_blocks(const RowMatrixXf& q, const RowMatrixXf& k, const RowMatrixXf& v, float scale, int threads,
                           RowMatrixXf& o) {
  const Eigen::Index lq = q.rows(), br = 64, blocks = (lq + br - 1) / br;
  auto worker = [&](int id) {
    RowMatrixXf s(br, k.rows());
    for (Eigen::Index b = id; b < blocks; b += threads) {
      const Eigen::Index r0 = b * br, rows = std::min(br, lq - r0);
      s.topRows(rows).noalias() = (q.middleRows(r0, rows) * k.transpose()) * scale;
      for (Eigen::Index i = 0; i < rows; ++i) {
        const float m = s.row(i).maxCoeff();
        float sum = 0;
        for (Eigen::Index j = 0; j < s.cols(); ++j) sum += (s(i, j) = std::exp(s(i, j) - m));
        s.row(i) /= sum;
      }
      o.middleRows(r0, rows).noalias() = s.topRows(rows) * v;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& t : pool) t.join();
}

struct BenchOptions {
  std::vector<int> lengths{1024, 2048, 4096}, threads{1, 2};
  int d = 128, reps = 5;
  std::string isa, format = "md", out, index = "index@upstream-neon";
};

void run_bench(const BenchOptions& o) {
  const Isa isa = o.isa.empty() ? default_isa() : parse_isa(o.isa);
  if (!isa_available(isa)) throw std::invalid_argument("--isa " + o.isa + ": not available on this CPU or build");
  if (o.d < 1 || o.reps < 1) throw CLI::ValidationError("--d/--reps", "must be >= 1");
  for (int l : o.lengths)
    if (l < 1) throw CLI::ValidationError("--L", "lengths must be >= 1");
  for (int t : o.threads)
    if (t < 1) throw CLI::ValidationError("--threads", "must be >= 1");
  const MethodSpec index_spec = parse_method_spec(o.index);
  if (index_spec.name != "index") throw SpecError("--index: expected an 'index' spec such as index@paper, got '" + o.index + "'");
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
           "GEMM % of peak", "quant-only / this"},
          {}};
  json j = {{"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}, {"isa", isa_name(isa)},
            {"kernels", {{"qk", names.qk}, {"softmax", names.softmax}, {"softmax_quant_only", qo_softmax}, {"pv", names.pv}}},
            {"peak_int8_gmacs_per_core", peak_gmacs}, {"reps", o.reps}, {"runs", json::array()}};
  std::mt19937_64 g(1);
  std::normal_distribution<float> n(0, 1);
  for (int l : o.lengths) {
    RowMatrixXf qf(l, o.d), kf(l, o.d), vf(l, o.d);
    for (auto* m : {&qf, &kf, &vf})
      for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = n(g);
    auto quant = [](const RowMatrixXf& x, double* s) {
      *s = x.cwiseAbs().maxCoeff() / 127.0;
      std::vector<std::int8_t> q(x.size());
      for (Eigen::Index i = 0; i < x.size(); ++i) q[i] = static_cast<std::int8_t>(std::nearbyint(x.data()[i] / *s));
      return q;
    };
    double sq, sk, sv;
    const auto q8 = quant(qf, &sq), k8 = quant(kf, &sk), v8 = quant(vf, &sv);
    std::vector<float> out(static_cast<std::size_t>(l) * o.d);
    RowMatrixXf of(l, o.d);
    const double scale = 1.0 / std::sqrt(static_cast<double>(o.d));
    const double ops = 4.0 * l * l * o.d;  // two GEMMs, 2 ops per MAC
    for (int threads : o.threads) {
      IntAttentionConfig cfg;
      cfg.isa = isa;
      cfg.threads = threads;
      cfg.softmax = index_params;
      using Stages = IntAttentionConfig::Stages;
      auto run_int = [&](Stages stages, IntPipeline pipeline = IntPipeline::intattention, bool materialise = false) {
        cfg.stages = stages;
        cfg.pipeline = pipeline;
        cfg.materialise = materialise;
        return median_ms(o.reps, [&] {
          int_attention_fused({q8.data(), l, o.d, sq}, {k8.data(), l, o.d, sk}, {v8.data(), l, o.d, sv}, scale, cfg,
                              out.data());
        });
      };
      const double t_int = run_int(Stages::all), t_gemm = run_int(Stages::gemms),
                   t_qo = run_int(Stages::all, IntPipeline::quant_only);
      const double t_qk = run_int(Stages::qk), t_pv = run_int(Stages::pv);
      const double t_int_m = run_int(Stages::all, IntPipeline::intattention, true),
                   t_qo_m = run_int(Stages::all, IntPipeline::quant_only, true);
      const double t_fp32 = median_ms(o.reps, [&] { fp32_attention_blocks(qf, kf, vf, static_cast<float>(scale), threads, of); });
      auto share_of_peak = [&](double macs, double ms) { return macs / (ms * 1e-3) * 1e-9 / (peak_gmacs * threads) * 100; };
      const double gemm_eff = share_of_peak(ops / 2, t_gemm), qk_eff = share_of_peak(ops / 4, t_qk),
                   pv_eff = share_of_peak(ops / 4, t_pv);
      auto fmt = [](double x, int p) {
        std::ostringstream s;
        s.setf(std::ios::fixed);
        s.precision(p);
        s << x;
        return s.str();
      };
      auto add = [&](const std::string& name, double ms, bool is_int) {
        t.rows.push_back({std::to_string(l), std::to_string(o.d), std::to_string(threads), name, fmt(ms, 2),
                          fmt(ops / (ms * 1e-3) * 1e-9, 1), fmt(ms / t_gemm, 2), fmt(t_fp32 / ms, 2),
                          is_int && name != "gemm-only" ? fmt((ms - t_gemm) / ms * 100, 1) + " %" : "-",
                          name == "gemm-only" ? fmt(gemm_eff, 1) + " % (QK " + fmt(qk_eff, 0) + " %, PV " + fmt(pv_eff, 0) + " %)" : "-",
                          fmt(t_qo / ms, 2)});
        j["runs"].push_back({{"L", l}, {"d", o.d}, {"threads", threads}, {"pipeline", name}, {"median_ms", ms},
                             {"gops", ops / (ms * 1e-3) * 1e-9}});
        if (name == "gemm-only")
          j["runs"].back().update({{"qk_ms", t_qk}, {"pv_ms", t_pv}, {"qk_percent_of_peak", qk_eff},
                                   {"pv_percent_of_peak", pv_eff}, {"gemms_percent_of_peak", gemm_eff}});
      };
      add("intattention fused", t_int, true);
      add("quant-only fused", t_qo, true);
      add("gemm-only", t_gemm, true);
      add("intattention materialised", t_int_m, true);
      add("quant-only materialised", t_qo_m, true);
      add("fp32 blocks (Eigen)", t_fp32, false);
      std::cerr << "qattn bench: L " << l << ", " << threads << " thread(s) done\n";
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  j["peak_rss_mib"] = ru.ru_maxrss / 1024.0;
  j["index"] = ref::reference_registry().canonical(index_spec);
  std::ostringstream head;
  head << "qattn bench: " << cpu_model() << ", " << std::thread::hardware_concurrency() << " hardware threads\n"
       << "ISA " << isa_name(isa) << ": " << names.qk << ", " << names.softmax << " (quant-only: " << qo_softmax << "), "
       << names.pv << "\n"
       << "IndexSoftmax: " << ref::reference_registry().canonical(index_spec) << "\n"
       << "int8 MAC peak, 1 core (" << isa_name(isa) << " loop, 12 accumulators): " << peak_gmacs << " GMAC/s\n"
       << "medians of " << o.reps << " runs after one warm-up; GOP/s counts the two GEMMs (4 L^2 d ops); "
       << "fp32 blocks runs Eigen at this build's baseline ISA; peak RSS of the whole run " << ru.ru_maxrss / 1024
       << " MiB\n\n";
  emit(o.format == "json" ? j.dump(2) + "\n" : head.str() + t.markdown(), o.out);
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
  sub->callback([o] { run_bench(*o); });
}

}  // namespace qattn::cli
