// Experiment kv-quantizers: every KV-cache quantizer under fp32 attention, error against bits per element. See
// README.md; `qattn reproduce kv-quantizers` runs it.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/reference/kv_quant.h"

namespace qattn::experiments {
namespace {

// Every quantizer on every source under fp32 attention, and what the report reads from the runs.
struct Runs {
  std::vector<std::string> specs;
  std::vector<Source> sources;
  std::vector<std::vector<HeadResult>> res;  // [spec * sources + source]

  const std::vector<HeadResult>& at(std::size_t m, std::size_t si) const { return res[m * sources.size() + si]; }
  double mean_bits(std::size_t m, std::size_t si, double HeadResult::*which) const {
    double b = 0;
    for (const HeadResult& h : at(m, si)) b += h.*which;
    return b / static_cast<double>(at(m, si).size());
  }
  // Bits per element of K and V, the mean of the two.
  double bits(std::size_t m, std::size_t si) const {
    return 0.5 * (mean_bits(m, si, &HeadResult::k_bits) + mean_bits(m, si, &HeadResult::v_bits));
  }
  Metrics mean(std::size_t m, std::size_t si) const { return summarise(at(m, si)).mean; }
  std::size_t index(const std::string& spec) const {
    return static_cast<std::size_t>(std::find(specs.begin(), specs.end(), spec) - specs.begin());
  }
  double cos(const std::string& spec, std::size_t si) const { return mean(index(spec), si).o_cossim; }
};

// The four premises, checked on each source.
std::string premise_lines(const Runs& g) {
  std::ostringstream r;
  for (std::size_t si = 0; si < g.sources.size(); ++si) {
    const std::string& n = g.sources[si].name;
    const auto cos = [&](const std::string& spec) { return g.cos(spec, si); };
    const auto bits = [&](const std::string& spec) { return g.bits(g.index(spec), si); };
    r << n << ": per-channel K beats per-token K at 2 bits (KIVI's premise): "
      << (cos("rtn:bits=2") > cos("rtn:bits=2,k=token") ? "HOLDS" : "DOES NOT HOLD") << " ("
      << fmt_sim(cos("rtn:bits=2")) << " vs " << fmt_sim(cos("rtn:bits=2,k=token")) << ")\n";
    r << n << ": the block Hadamard lowers per-token INT4 K error (SAW's premise): "
      << (cos("saw") > cos("saw:block=1") ? "HOLDS" : "DOES NOT HOLD") << " (" << fmt_sim(cos("saw")) << " vs "
      << fmt_sim(cos("saw:block=1")) << " without rotation)\n";
    const bool mixed_between = cos("flashq:bits=2") < cos("flashq@mixed") && cos("flashq@mixed") < cos("flashq:bits=4") &&
                               bits("flashq:bits=2") < bits("flashq@mixed") && bits("flashq@mixed") < bits("flashq:bits=4");
    r << n << ": FlashQ head-wise mixed 2/4 lies between pure 2 and pure 4 bits in bits and error: "
      << (mixed_between ? "HOLDS" : "DOES NOT HOLD") << "\n";
    // TurboAttention's abstract: "reduces the KV cache size by over 4.4x" (vs FP16), with FlashQ's own bit count
    const double r4 = 16 / bits("flashq:bits=4"), rm = 16 / bits("flashq@mixed"), r2 = 16 / bits("flashq:bits=2");
    r << n << ": FlashQ compresses the KV cache more than 4.4x against FP16 (TurboAttention's abstract; scales and zero "
      << "points counted): 4 bits " << fixed(r4, 2) << " x: " << (r4 > 4.4 ? "HOLDS" : "DOES NOT HOLD") << "; mixed 2/4 "
      << fixed(rm, 2) << " x: " << (rm > 4.4 ? "HOLDS" : "DOES NOT HOLD") << "; 2 bits " << fixed(r2, 2) << " x\n";
    // TurboAttention App. D / Fig. 10: channel-wise V quantisation has less error than token-wise (K per channel)
    bool v_channel = true;
    std::string v_detail;
    for (const char* b : {"2", "4"}) {
      const double ch = cos(std::string("rtn:bits=") + b + ",v=channel"), tok = cos(std::string("rtn:bits=") + b);
      v_channel = v_channel && ch > tok;
      v_detail += (v_detail.empty() ? "" : "; ") + std::string(b) + " bits " + fmt_sim(ch) + " vs " + fmt_sim(tok);
    }
    r << n << ": channel-wise V beats token-wise V (TurboAttention App. D, Fig. 10): "
      << (v_channel ? "HOLDS" : "DOES NOT HOLD") << " (" << v_detail << ")\n";
    int mse_wins = 0;
    for (const char* b : {"2", "3", "4"})
      mse_wins += cos(std::string("turboquant:bits=") + b) > cos(std::string("turboquant:bits=") + b + ",k=prod");
    r << n << ": TurboQuant mse vs prod keys (same bits): mse gives the better attention output at " << mse_wins
      << " of 3 bit widths\n";
    // NVFP4 against the 4-bit integer caches, and what a dequantise-to-bf16-then-FP8 attention adds
    r << n << ": NVFP4 (" << fixed(bits("nvfp4"), 3) << " bits) beats per-token INT4 with a Hadamard (saw, "
      << fixed(bits("saw"), 3) << " bits): " << (cos("nvfp4") > cos("saw") ? "HOLDS" : "DOES NOT HOLD") << " ("
      << fmt_sim(cos("nvfp4")) << " vs " << fmt_sim(cos("saw")) << "); read through bf16 and an FP8 attention's "
      << "E4M3, 1 - CosSim grows " << fixed((1 - cos("nvfp4@fp8-attention")) / (1 - cos("nvfp4")), 2) << " x ("
      << fmt_sim(cos("nvfp4@fp8-attention")) << ")\n";
  }
  return r.str();
}

}  // namespace

// kv-quantizers: every KV-cache quantizer at 2/3/4 bits under fp32 attention, on USE-Lite and on a long synthetic
// sequence with channel-wise outliers in K; bits per element with scales and zero points counted; a Pareto plot.
std::string run_kv_quantizers(const ExperimentContext& ctx) {
  Runs g;
  g.specs = {"rtn:bits=2",        "rtn:bits=3",        "rtn:bits=4",        "rtn:bits=2,k=token",
             "kivi:bits=2",       "kivi:bits=3",       "kivi:bits=4",       "flashq:bits=2",
             "flashq:bits=3",     "flashq@mixed",      "flashq:bits=4",     "turboquant:bits=2", "turboquant:bits=3",
             "turboquant:bits=4", "turboquant:bits=2,k=prod", "turboquant:bits=3,k=prod", "turboquant:bits=4,k=prod",
             "saw",               "saw:block=1",       "saw:rotate-v=true", "saw@fp16-v",
             "rtn:bits=2,v=channel", "rtn:bits=4,v=channel", "nvfp4", "nvfp4@fp8-attention"};
  const int L = ctx.fast ? 1024 : 4096;
  g.sources = make_sources(use_lite_source(ctx), outlier_source("synthetic", 4, L, 64, 11));
  const auto fp32 = make_method("fp32", ctx.engine);
  g.res.resize(g.specs.size() * g.sources.size());
  parallel_for(g.res.size(), ctx.threads, [&](std::size_t i) {
    const auto kv = ref::kv_registry().create(g.specs[i / g.sources.size()]);
    g.res[i] = evaluate(g.sources[i % g.sources.size()].dump, *fp32, "fp32", kv.get());
  });
  Table t{{"quantizer"}, {}};
  for (const auto& src : g.sources)
    for (const char* h : {" bits", " O CosSim", " O rel L1", " O RMSE"}) t.header.push_back(src.name + h);
  Table csv{{"quantizer", "source", "K_bits", "V_bits", "bits", "O_cossim", "O_rel_l1", "O_rmse", "O_error", "canonical"}, {}};
  Table pareto{{"quantizer", "bits", "O_error"}, {}};
  for (std::size_t m = 0; m < g.specs.size(); ++m) {
    std::vector<std::string> row = {g.specs[m]};
    for (std::size_t si = 0; si < g.sources.size(); ++si) {
      const Metrics s = g.mean(m, si);
      const std::string bits = fmt_bits(g.bits(m, si));
      row.insert(row.end(), {bits, fmt_sim(s.o_cossim), fmt_err(s.o_rel_l1), fmt_err(s.o_rmse)});
      csv.rows.push_back({g.specs[m], g.sources[si].name, fmt_bits(g.mean_bits(m, si, &HeadResult::k_bits)),
                          fmt_bits(g.mean_bits(m, si, &HeadResult::v_bits)), bits, fmt_sim(s.o_cossim),
                          fmt_err(s.o_rel_l1), fmt_err(s.o_rmse), fmt_err(1 - s.o_cossim),
                          ref::kv_registry().canonical(g.specs[m])});
      if (si == 0) pareto.rows.push_back({g.specs[m], bits, fmt_err(1 - s.o_cossim)});
    }
    t.rows.push_back(row);
  }
  write_text(ctx.out_dir / "kv-quantizers.csv", csv.csv());
  const std::vector<std::size_t> on_front = pareto_outputs(
      ctx, "kv-quantizers-pareto", pareto, "KV-cache quantizers on USE-Lite: 1 - O CosSim vs bits per element");
  std::ostringstream r;
  r << "kv-quantizers: K and V through each KV-cache quantizer, then fp32 attention, vs the fp64 reference; mean over "
       "heads\nbits: per element of K and V (mean of the two), codes plus scales and zero points (fp32 scales and "
       "offsets, zero points in the code width, fp16 residual tokens)\n"
    << "USE-Lite: " << head_count(g.sources[0].dump) << " heads, L = 128; synthetic: 4 heads, L = " << L
    << ", d = 64, channel-wise outliers in K (as in sage2-tables), seed 11\n\n"
    << t.markdown() << "\n" << premise_lines(g);
  // The Pareto front on USE-Lite: no other quantizer has fewer bits and a lower error.
  r << "USE-Lite Pareto front (bits, 1 - O CosSim):" << pareto_front_text(pareto, on_front, "") << "\n";
  return r.str();
}

}  // namespace qattn::experiments
