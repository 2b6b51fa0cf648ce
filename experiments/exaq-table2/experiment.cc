// Experiment exaq-table2: EXAQ's headline (Table 2): with its sigma-based clip, 2- and 3-bit softmax inputs stay
// near the baseline, far above NAIVE quantisation over the whole [min, 0] range. At the attention level: the softmax
// replaced alone inside fp64 attention. See README.md; `qattn reproduce exaq-table2` runs it.
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/parallel.h"

namespace qattn::experiments {

std::string run_exaq_table2(const ExperimentContext& ctx) {
  // Pairs (EXAQ, NAIVE) at each bit width, under the official grid and as printed.
  const std::vector<GridRow> rows = {
      {"EXAQ INT3, official grid", "exaq@upstream:bits=3"},  {"NAIVE INT3, official grid", "exaq@upstream:bits=3,clip=none"},
      {"EXAQ INT2, official grid", "exaq@upstream:bits=2"},  {"NAIVE INT2, official grid", "exaq@upstream:bits=2,clip=none"},
      {"EXAQ INT3, as printed", "exaq@paper:bits=3"},        {"NAIVE INT3, as printed", "exaq@paper:bits=3,clip=none"},
      {"EXAQ INT2, as printed", "exaq@paper:bits=2"},        {"NAIVE INT2, as printed", "exaq@paper:bits=2,clip=none"},
      {"FP16 (baseline)", "fp16"},
  };
  std::ostringstream r;
  r << "exaq-table2: EXAQ's sigma-based clip against NAIVE quantisation of the whole [min, 0] range (exaq:clip=none), "
       "the softmax replaced alone inside fp64 attention; mean O CosSim and relative L1 vs the fp64 reference\n"
    << "paper (Table 2, LLaMA-1 7B-70B, 7 tasks): EXAQ at 3 bits within 0.65 % of the baseline's accuracy on average "
       "and at 2 bits within 1.9 %, state of the art in almost every experiment; NAIVE far below at 2 bits\n"
    << "measurable claim (ours), on every source and bit width, under both grids: EXAQ's error 1 - O CosSim below "
       "NAIVE's, by at least 2x (\"far above\")\n";
  const auto [src, grid] = accuracy_grid(r, rows, ctx, 2048, 256, 64, "softmax");
  const std::vector<Source>& sources = src.sources;
  std::size_t holds = 0, better = 0, cases = 0;
  for (std::size_t s = 0; s < sources.size(); ++s)
    for (std::size_t pair = 0; pair < 4; ++pair) {
      const double e = grid.error(2 * pair, s), naive = grid.error(2 * pair + 1, s);
      ++cases;
      better += e < naive;
      holds += 2 * e <= naive;
      r << sources[s].name << ", " << rows[2 * pair].label << ": NAIVE / EXAQ error " << fixed(naive / e, 2) << " x: "
        << (2 * e <= naive ? "HOLDS" : e < naive ? "DOES NOT HOLD (better, not 2x)" : "DOES NOT HOLD (not better)")
        << "\n";
    }
  r << "verdict: " << (holds == cases ? "REPRODUCED" : holds > 0 ? "PARTLY REPRODUCED" : "NOT REPRODUCED") << " (EXAQ "
    << "at least 2x below NAIVE's error in " << holds << " of " << cases << " (source, bits, grid) cases; below it in "
    << better << ")\n";
  return r.str();
}

}  // namespace qattn::experiments
