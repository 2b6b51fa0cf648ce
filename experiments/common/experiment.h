// The experiments of `qattn reproduce`: one paper claim each, in its own folder. experiments/<name>/experiment.cmake
// declares it (its claim, source, whether it takes --fast) and says how CTest checks it; experiments/<name>/
// experiment.cc defines `std::string run_<name, '-' as '_'>(const ExperimentContext&)` in this namespace, which
// prints a deterministic report (what it measured, the paper's numbers, a verdict) and writes its data files (CSV,
// figures) into the context's out_dir. experiments/CMakeLists.txt compiles every such file, with this folder's
// helpers, into the library qattn_experiments and generates from the experiment.cmake files the list that
// experiment_list() returns. The library stands on the evaluation layer (qattn/eval) and the engine, never on the
// CLI: the CLI's `qattn reproduce` fills an ExperimentContext (data directory, plot runner) and calls an
// Experiment's run. An experiment may instead be its own program (sas-poly, exaq-clipping: experiment_executable),
// built next to qattn under experiments/ and run by `qattn reproduce` as it is.
//
// The helpers below are what more than one experiment uses.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "qattn/engine.h"
#include "qattn/eval/evaluate.h"
#include "qattn/eval/report.h"
#include "qattn/eval/table.h"
#include "qattn/method.h"

namespace qattn::experiments {
using namespace qattn::eval;

struct ExperimentContext {
  std::string tensors;             // --tensors: the dump directory
  std::filesystem::path out_dir;   // where the data files go (a staging directory, moved into place on success)
  bool fast = false;               // --fast: the reduced variant CI re-checks under sanitizers
  bool plots = true;               // draw figures (needs Python with matplotlib)
  int threads = 0;                 // worker threads, 0 = all cores
  EngineSetting engine;            // --engine, --verbose: every method the experiment builds (make_method)
  std::filesystem::path share_dir; // qattn's data files (share/qattn: data/use-lite, data/h100-mma, experiments/)
  // Runs the plot script (`qattn plot ARGS`) and returns its exit status; empty: no figures can be drawn.
  std::function<int(const std::vector<std::string>& args)> plot;
};

// One entry of the list, as experiment.cmake declares it (experiment_claim, experiment_source, experiment_takes_fast,
// experiment_executable).
struct Experiment {
  std::string name;    // the folder's name
  std::string claim;   // the claim tested, with the paper's numbers where it has them
  std::string source;  // where the claim is made ("IntAttention Fig. 9")
  bool fast = false;   // the run has a --fast variant (ctx.fast; a program gets --fast)
  std::function<std::string(const ExperimentContext&)> run;  // the report; empty: `program` runs instead
  std::string program;  // a separate program built under experiments/ next to qattn
  std::string command;  // for --list, set by ExperimentList::add: "qattn reproduce <name>", " [--fast]" if `fast`
};

// Thrown by a run whose child program failed after saying why on stderr: the front end exits with `code`.
struct ExperimentExit {
  int code;
};

class ExperimentList {
 public:
  void add(Experiment e);  // sets e.command; std::logic_error for a name already added
  const std::vector<Experiment>& all() const { return list_; }
  const Experiment* find(const std::string& name) const;

 private:
  std::vector<Experiment> list_;
};

// Every experiment folder's entry, in folder-name order (generated from the experiment.cmake files:
// experiment_files.cc).
const ExperimentList& experiment_list();

// ---- helpers shared by experiments -----------------------------------------------------------------------------

// Writes `text` to `path` atomically (the whole file or none of it).
void write_text(const std::filesystem::path& path, const std::string& text);
// ctx.plot(args) when figures are on; a line on stderr when the figure `png` was not drawn. Whether it was drawn.
bool draw(const ExperimentContext& ctx, const std::vector<std::string>& args, const std::filesystem::path& png);

// ---- the grid of rows x sources that most experiments measure -------------------------------------------------

// A set of heads an experiment evaluates on: the dump (--tensors) or synthetic heads, under the name its table shows.
struct Source {
  std::string name;
  std::vector<DumpLayer> dump;
};
// The dump named by --tensors, as the source "USE-Lite".
Source use_lite_source(const ExperimentContext& ctx);
// synthetic_outlier_dump(heads, L, d, seed) under `name`.
Source outlier_source(std::string name, int heads, int L, int d, std::uint64_t seed);
// The sources in order, each moved in (a braced list would copy every dump).
template <class... Sources>
std::vector<Source> make_sources(Sources&&... sources) {
  std::vector<Source> v;
  v.reserve(sizeof...(sources));
  (v.push_back(std::forward<Sources>(sources)), ...);
  return v;
}

// The three sources of the accuracy tables (exaq-table2, intattn-accuracy, intattn-tables4-6, fp4-attention): the
// dump (--tensors) as "USE-Lite"; "synthetic", 4 outlier heads of 512 tokens and 128 channels (seed 7); "long", 2
// outlier heads of long_L tokens and d channels (seed 21), long_L being fast_L under --fast and full_L otherwise.
struct AccuracySources {
  int long_L = 0, d = 0;
  std::vector<Source> sources;  // USE-Lite, synthetic, long
  // The report's line on them: "sources: USE-Lite (the dump, L = 128); synthetic: 4 heads, L = 512, d = 128,
  // channel-wise K outliers (seed 7); long: 2 heads, L = <long_L>, d = <d>, the same structure (seed 21)", then a
  // blank line.
  std::string line() const;
};
AccuracySources accuracy_sources(const ExperimentContext& ctx, int full_L, int fast_L, int d);

// Every spec evaluated on every source, threaded over the (spec, source) pairs (ctx.threads, ctx.engine).
class Grid {
 public:
  Grid(std::size_t sources, std::vector<Summary> results) : sources_(sources), results_(std::move(results)) {}
  const Summary& at(std::size_t spec, std::size_t source) const { return results_[spec * sources_ + source]; }
  double cossim(std::size_t spec, std::size_t source) const { return at(spec, source).mean.o_cossim; }
  double error(std::size_t spec, std::size_t source) const { return 1 - cossim(spec, source); }  // 1 - O CosSim

 private:
  std::size_t sources_;
  std::vector<Summary> results_;
};
Grid run_grid(const std::vector<std::string>& specs, const std::vector<Source>& sources, const ExperimentContext& ctx);
// A row of a grid: the label its table shows and the spec it runs.
struct GridRow {
  std::string label, spec;
};
// The same over rows that carry a `spec` member (GridRow, or rows with more columns).
template <class Row>
  requires requires(const Row& r) { std::string(r.spec); }
Grid run_grid(const std::vector<Row>& rows, const std::vector<Source>& sources, const ExperimentContext& ctx) {
  std::vector<std::string> specs;
  for (const Row& r : rows) specs.push_back(r.spec);
  return run_grid(specs, sources, ctx);
}

// The accuracy sources (accuracy_sources) and every row evaluated on them (run_grid).
struct AccuracyGrid {
  AccuracySources src;
  Grid grid;
};
template <class Row>
AccuracyGrid accuracy_grid(const std::vector<Row>& rows, const ExperimentContext& ctx, int full_L, int fast_L, int d) {
  AccuracySources src = accuracy_sources(ctx, full_L, fast_L, d);
  Grid grid = run_grid(rows, src.sources, ctx);
  return {std::move(src), std::move(grid)};
}
// The same for the accuracy tables whose report states the claim first: after what `report` holds, the sources' line
// (AccuracySources::line), then the grid's table (grid_table, first column `label_header`) and a blank line.
AccuracyGrid accuracy_grid(std::ostream& report, const std::vector<GridRow>& rows, const ExperimentContext& ctx,
                           int full_L, int fast_L, int d, const std::string& label_header);

// The grid as a table: the columns `head`, then per source "<name> O CosSim" and "<name> O rel L1"; row i the cells
// lead[i], then spec i's mean O CosSim (fmt_sim) and relative L1 (fmt_err) on each source.
Table grid_table(std::vector<std::string> head, const std::vector<std::vector<std::string>>& lead,
                 const std::vector<Source>& sources, const Grid& grid);
// The same with the columns `label_header` and "spec", each row's label and spec first.
Table grid_table(const std::string& label_header, const std::vector<GridRow>& rows, const std::vector<Source>& sources,
                 const Grid& grid);

// Each spec evaluated on the dump; the summaries in the order given.
std::vector<Summary> summaries(const std::vector<DumpLayer>& dump, const std::vector<std::string>& specs,
                               const EngineSetting& engine);
std::size_t head_count(const std::vector<DumpLayer>& dump);

// A two-axis sweep (b rows, c columns) of mean O CosSim, threaded over points.
struct Sweep2 {
  std::vector<std::string> b, c;
  std::vector<std::vector<double>> mean;  // [b][c]
};
Sweep2 sweep_bc(const std::vector<DumpLayer>& dump, const std::string& spec, const std::string& b_grid,
                const std::string& c_grid, const ExperimentContext& ctx);
void write_sweep_csv(const Sweep2& s, const std::string& spec, std::size_t heads, const std::filesystem::path& path);

// A Pareto table [label, bits, O_error] (numbers as printed): written as out_dir/NAME.csv and drawn as NAME.png by
// `qattn plot pareto` (unless plots are off). Returns the rows on the front, in bits order: each has a lower
// error than every row with fewer (or as many) bits before it.
std::vector<std::size_t> pareto_outputs(const ExperimentContext& ctx, const std::string& name, const Table& table,
                                        const std::string& title);
// The rows `front` of such a table as a report lists them: " <label> (<bits><bits_unit>, <error>);" each.
std::string pareto_front_text(const Table& table, const std::vector<std::size_t>& front, const std::string& bits_unit);

// The nominal bits per element in which a method holds K and V (its registry entry's traits).
double kv_bits(const std::string& canonical);

// Every registered method for which `keep` holds, bare and under each preset, one spec per distinct configuration:
// (names, canonical specs), where a preset equal to the defaults or to another preset is one row listed under all
// its names ("index = index@paper").
std::pair<std::vector<std::string>, std::vector<std::string>> method_rows(
    const std::function<bool(const MethodEntry&)>& keep);

// Synthetic heads with the structure SageAttention2's Fig. 2 describes: every channel of K carries a bias shared by
// all tokens (channel-wise outliers), Q a smaller one, V a per-channel offset. x[t][c] = bias[c] + N(0, 1), bias[c] ~
// N(0, sigma_x^2) with sigma_K = 4, sigma_Q = 1, sigma_V = 2, and every 16th channel of K an outlier with 4x the
// bias. One layer of `heads` heads, L tokens, d channels, fixed seed; the fp64 reference is computed as for a dump.
std::vector<DumpLayer> synthetic_outlier_dump(int heads, int L, int d, std::uint64_t seed);
// Appends head `head` of synthetic Q, K, V to `layer`, with its fp64 reference at scale 1/sqrt(d), as a dump's.
void add_synthetic_head(DumpLayer& layer, int head, RowMatrixXd q, RowMatrixXd k, RowMatrixXd v);

// A needle among diffuse keys, for the accumulation experiments: `rows` identical queries over `keys` keys, d >= 2.
// Channel 1 spreads the diffuse logits (N(0, 1/4) at scale 1); channel 0 holds the needle's margin, chosen so that
// its weight is about 1/4. V is 1 everywhere but 2 at the needle's channel 0, so O_0 = 1 + w exactly: the needle's
// weight w rides on the sum of every other key's, which an accumulator holds. Seed 4096 + keys.
struct NeedleHead {
  RowMatrixXd q, k, v;
  Eigen::Index needle = 0;  // the needle's key: keys / 3
};
NeedleHead needle_head(Eigen::Index keys, Eigen::Index d, Eigen::Index rows);

}  // namespace qattn::experiments
