// Experiment sage2-worst: SageAttention2's worst-case tables (15-17): the orderings of granularity, P~/V format and
// smoothing read on the worst head instead of the mean. See README.md; `qattn reproduce sage2-worst` runs it.
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/parallel.h"

namespace qattn::experiments {

std::string run_sage2_worst(const ExperimentContext& ctx) {
  struct Claim {
    std::string table, paper;
    std::vector<std::string> labels, specs;  // claimed best first
  };
  const std::string q4 = "sage2:qk=4,smooth-q=true,smooth-k=true";
  const std::vector<Claim> claims = {
      {"Table 15", "worst CosSim 96.76 % > 96.72 % > 90.68 % > 85.85 %",
       {"per-token", "per-thread", "per-block", "per-tensor"},
       {q4 + ",gran=token", q4 + ",gran=thread", q4 + ",gran=block", q4 + ",gran=tensor"}},
      {"Table 16", "worst CosSim 96.76 % > 96.70 % > 94.94 % > 19.52 %",
       {"FP16", "E4M3", "E5M2", "INT8"}, {q4 + ",p=fp16", q4 + ",p=e4m3", q4 + ",p=e5m2", q4 + ",p=int8"}},
      {"Table 17", "worst CosSim 96.71 % > 93.10 % > 90.86 % > 4.83 %",
       {"smooth Q and K (SageAttn2-4b)", "smooth Q", "smooth K", "none"},
       {"sage2@paper-4b", "sage2@paper-4b:smooth-k=false", "sage2@paper-4b:smooth-q=false", "sage2@paper-4b:smooth-q=false,smooth-k=false"}},
  };
  const int L = ctx.fast ? 128 : 512;
  const std::vector<Source> sources = make_sources(outlier_source("synthetic", 4, L, 128, 7), use_lite_source(ctx));
  std::vector<std::string> specs;
  for (const Claim& c : claims) specs.insert(specs.end(), c.specs.begin(), c.specs.end());
  const Grid grid = run_grid(specs, sources, ctx);
  std::ostringstream r;
  r << "sage2-worst: SageAttention2's worst-case tables, the worst head's O CosSim, relative L1 and RMSE vs the fp64 "
       "reference (INT4 Q/K throughout, as in the paper)\n"
    << "paper (Tables 15-17, the worst layer of CogVideoX): the orderings of Tables 6, 7 and 4 hold in the worst case "
       "too\n"
    << "sources: synthetic: 4 heads, L = " << L << ", d = 128, channel-wise outliers (as sage2-tables), seed 7; "
    << "USE-Lite: the dump (worst of its head tensors)\n\n";
  Table t{{"table", "variant", "spec"}, {}};
  for (const Source& s : sources)
    for (const char* m : {" worst CosSim", " worst rel L1", " worst RMSE"}) t.header.push_back(s.name + m);
  std::vector<std::string> verdicts;
  std::size_t held = 0, total = 0, at = 0;
  for (const Claim& c : claims) {
    for (std::size_t i = 0; i < c.specs.size(); ++i) {
      std::vector<std::string> row = {c.table, c.labels[i], c.specs[i]};
      for (std::size_t s = 0; s < sources.size(); ++s) {
        const Metrics& w = grid.at(at + i, s).worst;
        row.push_back(fmt_sim(w.o_cossim)), row.push_back(fmt_err(w.o_rel_l1)), row.push_back(fmt_err(w.o_rmse));
      }
      t.rows.push_back(row);
    }
    for (std::size_t s = 0; s < sources.size(); ++s) {
      bool holds = true;
      std::string failed;
      for (std::size_t i = 0; i + 1 < c.specs.size(); ++i) {
        const bool step = grid.at(at + i, s).worst.o_cossim > grid.at(at + i + 1, s).worst.o_cossim;
        holds = holds && step;
        if (!step) failed += (failed.empty() ? "" : ", ") + c.labels[i] + " > " + c.labels[i + 1];
      }
      held += holds;
      ++total;
      verdicts.push_back(c.table + ", " + sources[s].name + ": " + (holds ? "HOLDS" : "DOES NOT HOLD (" + failed + ")") +
                         "; paper: " + c.paper);
    }
    at += c.specs.size();
  }
  // Table 15's point is that per-thread costs about what per-token does (96.72 % vs 96.76 %: the worst 1 - CosSim
  // 1.01 x per-token's), not only the order: judged with a declared tolerance of 1.25 x.
  constexpr double kCloseFactor = 1.25;
  std::size_t close_held = 0;
  for (std::size_t s = 0; s < sources.size(); ++s) {
    const double token = 1 - grid.at(0, s).worst.o_cossim;   // Table 15 rows: token, thread, ...
    const double thread = 1 - grid.at(1, s).worst.o_cossim;
    const double ratio = thread / token;
    const bool close = ratio <= kCloseFactor;
    close_held += close;
    std::ostringstream v;
    v << "Table 15, " << sources[s].name << ": per-thread close to per-token (worst 1 - CosSim at most "
      << fixed(kCloseFactor, 2) << " x per-token's; paper 1.01 x): " << (close ? "HOLDS" : "DOES NOT HOLD") << " ("
      << fixed(ratio, 2) << " x)";
    verdicts.push_back(v.str());
  }
  r << t.markdown() << "\n";
  for (const auto& v : verdicts) r << v << "\n";
  r << "verdict: " << (held == total ? "REPRODUCED" : held > 0 ? "PARTLY REPRODUCED" : "NOT REPRODUCED") << " (" << held
    << " of " << total << " (table, source) orderings hold in the worst case; per-thread close to per-token on "
    << close_held << " of " << sources.size() << " sources)\n";
  return r.str();
}

}  // namespace qattn::experiments
