// Experiment leaderboard: every registered method at its defaults and presets in one table, with the Pareto front
// over K/V bits. See README.md; `qattn reproduce leaderboard` runs it.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"

namespace qattn::experiments {

// leaderboard: every registered method at its defaults and presets, one table.
std::string run_leaderboard(const ExperimentContext& ctx) {
  const std::vector<DumpLayer> dump = load_dump(ctx.tensors);
  const auto [names, canon] = method_rows([](const MethodEntry& e) { return !e.reference; });
  const std::vector<Summary> s = summaries(dump, canon, ctx.engine);
  std::vector<std::size_t> order(canon.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return s[a].mean.o_cossim > s[b].mean.o_cossim; });
  Table t{{"rank", "method", "O CosSim mean", "O CosSim worst", "O rel L1 mean", "O RMSE mean", "P CosSim mean", "P rel L1 mean",
           "K/V bits"},
          {}};
  Table csv{{"method", "O_cossim_mean", "O_cossim_worst", "O_rel_l1_mean", "O_rmse_mean", "P_cossim_mean", "P_rel_l1_mean",
             "kv_bits", "O_error", "canonical"},
            {}};
  Table front{{"method", "kv_bits", "O_error"}, {}};  // the pipelines only, for the Pareto plot
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    const double bits = kv_bits(canon[i]);
    const std::string bits_text = bits <= 0 ? "" : bits == std::floor(bits) ? fixed(bits, 0) : fixed(bits, 2);  // NVFP4: 4.5
    t.rows.push_back({std::to_string(k + 1), names[i], fmt_sim(s[i].mean.o_cossim), fmt_sim(s[i].worst.o_cossim), fmt_err(s[i].mean.o_rel_l1),
                      fmt_err(s[i].mean.o_rmse), fmt_sim(s[i].mean.p_cossim), fmt_err(s[i].mean.p_rel_l1), bits > 0 ? bits_text : "fp64"});
    csv.rows.push_back({names[i], fmt_sim(s[i].mean.o_cossim), fmt_sim(s[i].worst.o_cossim), fmt_err(s[i].mean.o_rel_l1), fmt_err(s[i].mean.o_rmse),
                        fmt_sim(s[i].mean.p_cossim), fmt_err(s[i].mean.p_rel_l1), bits_text, fmt_err(1 - s[i].mean.o_cossim), canon[i]});
    if (bits > 0) front.rows.push_back({names[i], bits_text, fmt_err(1 - s[i].mean.o_cossim)});
  }
  write_text(ctx.out_dir / "leaderboard.csv", csv.csv());
  const std::vector<std::size_t> on_front =
      pareto_outputs(ctx, "leaderboard-pareto", front, "Attention pipelines: 1 - O CosSim vs K/V bits per element");
  std::ostringstream r;
  r << "leaderboard: every registered method (defaults and presets) vs the fp64 reference on " << head_count(dump)
    << " heads, by mean O CosSim\n\n"
    << t.markdown() << "\n";
  // The Pareto front over the pipelines: no other pipeline has fewer K/V bits and a lower error.
  r << "Pareto front, attention pipelines (K/V bits per element, nominal; 1 - O CosSim):"
    << pareto_front_text(front, on_front, " bits") << "\n";
  return r.str();
}

}  // namespace qattn::experiments
