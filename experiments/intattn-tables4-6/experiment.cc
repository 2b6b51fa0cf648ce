// Experiment intattn-tables4-6: IntAttention Tables 4-6 as an attention-level proxy: IndexSoftmax against EXAQ at
// INT2 and INT3 (the softmax replaced alone, attention around it in fp64), with FP16 and the Quant-Only / IntAttention
// pipelines for reference. See README.md; `qattn reproduce intattn-tables4-6` runs it.
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/parallel.h"

namespace qattn::experiments {

std::string run_intattn_tables4_6(const ExperimentContext& ctx) {
  // The claim's rows first: IndexSoftmax (paper rules), EXAQ INT3 and INT2 under both EXAQ presets.
  const std::vector<GridRow> rows = {
      {"IndexSoftmax (b = 5, c = 6.6, paper rules)", "index@paper"},
      {"EXAQ INT3, official grid (per-call sigma)", "exaq@upstream:bits=3"},
      {"EXAQ INT3, as printed", "exaq@paper:bits=3"},
      {"EXAQ INT2, official grid (per-call sigma)", "exaq@upstream:bits=2"},
      {"EXAQ INT2, as printed", "exaq@paper:bits=2"},
      {"FP16", "fp16"},
      {"IndexSoftmax, rounding rules", "index@upstream-neon"},
      {"Quant-Only INT8 pipeline", "quant-only"},
      {"IntAttention pipeline (paper rules)", "intattention@paper"},
  };
  std::ostringstream r;
  r << "intattn-tables4-6: the softmax replaced alone inside fp64 attention (the pipelines for reference), mean O "
       "CosSim and relative L1 vs the fp64 reference\n"
    << "paper (Tables 4-6, task accuracy and perplexity): IndexSoftmax stays at FP16 (Llama-3.2-1B avg 59.75 % vs "
       "59.76 %), above EXAQ INT3 (58.33 %) and INT2 (54.21 %); on long context and reasoning (Table 6) EXAQ INT2 "
       "collapses (GSM8K 5.99 vs 35.02)\n"
    << "measurable claim (ours), on every source: IndexSoftmax > EXAQ INT3 > EXAQ INT2 in mean O CosSim, under both "
       "EXAQ presets\n";
  const auto [src, grid] = accuracy_grid(r, rows, ctx, 2048, 256, 64, "softmax / pipeline");
  const std::vector<Source>& sources = src.sources;
  std::size_t holds = 0;
  for (std::size_t s = 0; s < sources.size(); ++s) {
    // rows 1, 2: INT3 (official, printed); rows 3, 4: INT2 (official, printed)
    const bool index_first = grid.cossim(0, s) > grid.cossim(1, s) && grid.cossim(0, s) > grid.cossim(2, s);
    const bool int3_over_int2 = grid.cossim(1, s) > grid.cossim(3, s) && grid.cossim(2, s) > grid.cossim(4, s);
    holds += index_first && int3_over_int2;
    r << sources[s].name << ": IndexSoftmax > EXAQ INT3: " << (index_first ? "HOLDS" : "DOES NOT HOLD")
      << "; EXAQ INT3 > INT2 (each preset): " << (int3_over_int2 ? "HOLDS" : "DOES NOT HOLD") << "\n";
  }
  r << "verdict: " << (holds == sources.size() ? "REPRODUCED" : holds > 0 ? "PARTLY REPRODUCED" : "NOT REPRODUCED")
    << " (the ordering, on " << holds << " of " << sources.size() << " sources)\n";
  return r.str();
}

}  // namespace qattn::experiments
