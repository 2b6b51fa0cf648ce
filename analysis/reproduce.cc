// qattn reproduce: each paper claim in scope as one command. An experiment prints a deterministic report (the
// numbers it measured, the paper's numbers, a verdict) that CTest compares with the committed expected output, and
// writes its data (CSV, figures) under --out-dir. `qattn plot` renders qattn's CSV with analysis/plots/qattn_plot.py.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <random>
#include <span>
#include <thread>
#include <tuple>

#include "commands.h"
#include "evaluate.h"
#include "qattn/reference/random.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/weight_quant.h"
#include "qattn/error.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"
#include "sweep.h"
#include "engine_setting.h"
#include "table.h"

namespace qattn::cli {
namespace fs = std::filesystem;
namespace {

const Registry& registry() { return ref::reference_registry(); }

std::string fixed(double v, int places) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(places);
  s << v;
  return s.str();
}

// ---- plot: run the matplotlib script ---------------------------------------------------------------------------
fs::path plots_script() {
  if (const char* dir = std::getenv("QATTN_PLOTS_DIR"); dir && *dir) return fs::path(dir) / "qattn_plot.py";
  return fs::path(QATTN_PLOTS_DIR) / "qattn_plot.py";
}

// Runs argv_s[0] with its arguments and waits; returns its exit status (127 when it cannot start).
int run_program(std::vector<std::string> argv_s) {
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("qattn plot: fork failed");
  if (pid == 0) {
    setenv("MPLBACKEND", "Agg", 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// Runs the plot script with args; returns its exit status.
int run_plot_script(const std::vector<std::string>& args) {
  const fs::path script = plots_script();
  std::error_code ec;
  if (!fs::is_regular_file(script, ec))
    throw InputError(script.string(), "QATTN_PLOTS_DIR", "plot script not found (set QATTN_PLOTS_DIR to analysis/plots)");
  const char* python = std::getenv("QATTN_PYTHON");
  std::vector<std::string> argv = {python && *python ? python : "/usr/bin/python3", script.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv);
}

// ---- the experiments -------------------------------------------------------------------------------------------
struct Context {
  std::string tensors;
  fs::path out_dir;
  bool fast = false, plots = true;
  int threads = 0;
};

struct Experiment {
  std::string name, claim, source;
  std::function<std::string(const Context&)> run;  // empty: the separate program `program` (next to qattn)
  std::string command, program;
};

// Evaluates each spec on the dump; the summaries in the given order.
std::vector<Summary> summaries(const std::vector<DumpLayer>& dump, const std::vector<std::string>& specs) {
  std::vector<Summary> out;
  for (const auto& s : specs) out.push_back(summarise(evaluate(dump, *make_method(s), s)));
  return out;
}

// A two-axis sweep (b rows, c columns) of mean O CosSim, threaded over points.
struct Sweep2 {
  std::vector<std::string> b, c;
  std::vector<std::vector<double>> mean;  // [b][c]
};

Sweep2 sweep_bc(const std::vector<DumpLayer>& dump, const std::string& spec, const std::string& b_grid,
                const std::string& c_grid, int threads) {
  Sweep2 s;
  s.b = parse_grid_axis("b=" + b_grid).values;
  s.c = parse_grid_axis("c=" + c_grid).values;
  s.mean.assign(s.b.size(), std::vector<double>(s.c.size(), NAN));
  parallel_for(s.b.size() * s.c.size(), threads, [&](std::size_t i) {
    const std::size_t bi = i / s.c.size(), ci = i % s.c.size();
    MethodSpec m = parse_method_spec(spec);
    m.overrides.emplace_back("b", s.b[bi]);
    m.overrides.emplace_back("c", s.c[ci]);
    s.mean[bi][ci] = summarise(evaluate(dump, *make_method(m), spec)).mean.o_cossim;
  });
  return s;
}

void write_sweep_csv(const Sweep2& s, const std::string& spec, std::size_t heads, const fs::path& path) {
  Table t{{"b", "c", "target", "metric", "mean", "heads", "method"}, {}};
  for (std::size_t bi = 0; bi < s.b.size(); ++bi)
    for (std::size_t ci = 0; ci < s.c.size(); ++ci)
      t.rows.push_back({s.b[bi], s.c[ci], "O", "cossim", fmt_sim(s.mean[bi][ci]), std::to_string(heads), spec});
  emit(t.csv(), path.string());
}

std::size_t head_count(const std::vector<DumpLayer>& dump) {
  std::size_t n = 0;
  for (const auto& l : dump) n += l.heads.size();
  return n;
}

// intattn-fig9: the (b, c) stability heatmap.
std::string run_fig9(const Context& ctx) {
  const std::vector<DumpLayer> dump = load_dump(ctx.tensors);
  const std::string c_grid = ctx.fast ? "3:0.5:10" : "3:0.1:10";
  constexpr double kPlateauFactor = 1.25;
  std::ostringstream r;
  r << "intattn-fig9: mean O CosSim of IntAttention over b = 2..8 and c = " << c_grid << " on " << head_count(dump)
    << " heads\n"
    << "plateau: points whose error 1 - CosSim is at most " << kPlateauFactor
    << " x the sweep's smallest (first and last c of each row listed); ridge: the best c of each b\n"
    << "paper (Fig. 9): stable for b >= 4 and c in [5.5, 7.7], ridge near c = 6.6\n\n";
  for (const std::string preset : {"paper", "upstream-sim", "upstream-neon"}) {
    const std::string spec = "intattention@" + preset;
    const Sweep2 s = sweep_bc(dump, spec, "2:8", c_grid, ctx.threads);
    double best = -INFINITY;
    std::size_t bb = 0, bc = 0;
    for (std::size_t bi = 0; bi < s.b.size(); ++bi)
      for (std::size_t ci = 0; ci < s.c.size(); ++ci)
        if (s.mean[bi][ci] > best) best = s.mean[bi][ci], bb = bi, bc = ci;
    r << "## " << spec << "\n";
    r << "best: b = " << s.b[bb] << ", c = " << s.c[bc] << ", mean O CosSim " << fmt_sim(best) << "\n";
    const double floor_cos = 1 - kPlateauFactor * (1 - best);
    Table t{{"b", "ridge c", "CosSim at ridge", "plateau c range", "CosSim at c = 6.6"}, {}};
    int first_plateau_b = -1;
    std::vector<double> ridges;
    for (std::size_t bi = 0; bi < s.b.size(); ++bi) {
      std::size_t arg = 0;
      for (std::size_t ci = 1; ci < s.c.size(); ++ci)
        if (s.mean[bi][ci] > s.mean[bi][arg]) arg = ci;
      std::string lo, hi;
      for (std::size_t ci = 0; ci < s.c.size(); ++ci)
        if (s.mean[bi][ci] >= floor_cos) {
          if (lo.empty()) lo = s.c[ci];
          hi = s.c[ci];
        }
      if (!lo.empty() && first_plateau_b < 0) first_plateau_b = std::stoi(s.b[bi]);
      if (std::stoi(s.b[bi]) >= 4) ridges.push_back(std::stod(s.c[arg]));
      std::string at66 = "-";
      for (std::size_t ci = 0; ci < s.c.size(); ++ci)
        if (std::abs(std::stod(s.c[ci]) - 6.6) < 1e-9) at66 = fmt_sim(s.mean[bi][ci]);
      t.rows.push_back({s.b[bi], s.c[arg], fmt_sim(s.mean[bi][arg]), lo.empty() ? "none" : "[" + lo + ", " + hi + "]", at66});
    }
    r << t.markdown();
    std::sort(ridges.begin(), ridges.end());
    const double ridge_median = ridges.empty() ? NAN
                                : ridges.size() % 2 ? ridges[ridges.size() / 2]
                                                    : (ridges[ridges.size() / 2 - 1] + ridges[ridges.size() / 2]) / 2;
    r << "plateau (CosSim >= " << fmt_sim(floor_cos) << ") starts at b = " << first_plateau_b
      << "; median ridge c over b >= 4: " << fixed(ridge_median, 2) << "\n";
    const bool b_ok = first_plateau_b == 4, ridge_ok = std::abs(ridge_median - 6.6) <= 0.5;
    r << "verdict: plateau from b = 4 " << (b_ok ? "HOLDS" : "DOES NOT HOLD") << "; ridge near 6.6 (within 0.5) "
      << (ridge_ok ? "HOLDS" : "DOES NOT HOLD") << "\n\n";
    const fs::path csv = ctx.out_dir / ("sweep-" + preset + ".csv");
    write_sweep_csv(s, spec, head_count(dump), csv);
    if (ctx.plots) {
      const fs::path png = ctx.out_dir / ("heatmap-" + preset + ".png");
      if (run_plot_script({"heatmap", csv.string(), "-o", png.string(), "--log-error", "--threshold", "0.999",
                           "--plateau-tol", fmt_err((kPlateauFactor - 1) * (1 - best)),
                           "--title", "IntAttention @" + preset}) != 0)
        std::cerr << "qattn reproduce: the heatmap for " << preset << " was not drawn (matplotlib missing?)\n";
    }
  }
  return r.str();
}

// intattn-table8: INT8 (x127) vs UINT8 (x255) P.
std::string run_table8(const Context& ctx) {
  const std::vector<DumpLayer> dump = load_dump(ctx.tensors);
  std::ostringstream r;
  r << "intattn-table8: P of IntAttention vs the fp64 reference, mean over " << head_count(dump) << " heads\n"
    << "paper (Table 8): INT8 P CosSim 0.996612, rel L1 0.0774, RMSE 0.00239; UINT8 0.999081, 0.0410, 0.00124\n\n";
  Table t{{"method", "P", "P CosSim", "P rel L1", "P RMSE", "O CosSim"}, {}};
  bool ordering = true;
  for (const std::string preset : {"paper", "upstream-sim"}) {
    const std::vector<std::string> specs = {"intattention@" + preset + ":p=s8", "intattention@" + preset + ":p=u8"};
    const std::vector<Summary> s = summaries(dump, specs);
    for (int i = 0; i < 2; ++i)
      t.rows.push_back({"intattention@" + preset, i == 0 ? "INT8 x127" : "UINT8 x255", fmt_sim(s[i].mean.p_cossim),
                        fmt_err(s[i].mean.p_rel_l1), fmt_err(s[i].mean.p_rmse), fmt_sim(s[i].mean.o_cossim)});
    ordering = ordering && s[1].mean.p_cossim > s[0].mean.p_cossim && s[1].mean.p_rel_l1 < s[0].mean.p_rel_l1 && s[1].mean.p_rmse < s[0].mean.p_rmse;
  }
  r << t.markdown() << "\n";
  r << "(upstream-neon is left out: its Q8 reciprocal normalisation exists for UINT8 P only)\n";
  r << "verdict: UINT8 better than INT8 on all three P metrics for both presets: " << (ordering ? "HOLDS" : "DOES NOT HOLD")
    << "\n";
  return r.str();
}

// A Pareto table [label, bits, O_error] (numbers as printed): written as out_dir/NAME.csv and drawn as NAME.png by
// `qattn plot pareto` (unless plots are off). Returns the rows on the front, in bits order: each has a lower
// error than every row with fewer (or as many) bits before it.
std::vector<std::size_t> pareto_outputs(const Context& ctx, const std::string& name, const Table& table,
                                        const std::string& title) {
  const fs::path csv = ctx.out_dir / (name + ".csv");
  emit(table.csv(), csv.string());
  if (ctx.plots) {
    const fs::path png = ctx.out_dir / (name + ".png");
    if (run_plot_script({"pareto", csv.string(), "-o", png.string(), "--x", table.header[1], "--y", table.header[2],
                         "--label", table.header[0], "--logy", "--title", title}) != 0)
      std::cerr << "qattn reproduce: " << png.filename().string() << " was not drawn (matplotlib missing?)\n";
  }
  std::vector<std::size_t> order(table.rows.size()), front;
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto num = [&](std::size_t i, int c) { return std::stod(table.rows[i][c]); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return num(a, 1) != num(b, 1) ? num(a, 1) < num(b, 1) : num(a, 2) < num(b, 2);
  });
  double best = INFINITY;
  for (std::size_t i : order)
    if (num(i, 2) < best) best = num(i, 2), front.push_back(i);
  return front;
}

// The nominal bits per element in which a method holds K and V (its registry entry's traits).
double kv_bits(const std::string& canonical) { return registry().traits(parse_method_spec(canonical)).kv_bits; }

// Every registered method for which `keep` holds, bare and under each preset, one spec per distinct configuration:
// (names, canonical specs), where a preset equal to the defaults or to another preset is one row listed under all
// its names ("index = index@paper").
std::pair<std::vector<std::string>, std::vector<std::string>> method_rows(
    const std::function<bool(const MethodEntry&)>& keep) {
  std::vector<std::string> names, canon;
  for (const auto& e : registry().entries()) {
    if (!keep(e)) continue;
    std::vector<std::string> specs{e.name};
    for (const auto& p : e.presets) specs.push_back(e.name + "@" + p.name);
    for (const auto& spec : specs) {
      const std::string c = registry().canonical(parse_method_spec(spec));
      const auto it = std::find(canon.begin(), canon.end(), c);
      if (it != canon.end()) {
        names[it - canon.begin()] += " = " + spec;
      } else {
        canon.push_back(c);
        names.push_back(spec);
      }
    }
  }
  return {names, canon};
}

// leaderboard: every registered method at its defaults and presets, one table.
std::string run_leaderboard(const Context& ctx) {
  const std::vector<DumpLayer> dump = load_dump(ctx.tensors);
  const auto [names, canon] = method_rows([](const MethodEntry& e) { return !e.reference; });
  const std::vector<Summary> s = summaries(dump, canon);
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
    const std::string bits_text = bits > 0 ? fixed(bits, 0) : "";
    t.rows.push_back({std::to_string(k + 1), names[i], fmt_sim(s[i].mean.o_cossim), fmt_sim(s[i].worst.o_cossim), fmt_err(s[i].mean.o_rel_l1),
                      fmt_err(s[i].mean.o_rmse), fmt_sim(s[i].mean.p_cossim), fmt_err(s[i].mean.p_rel_l1), bits > 0 ? bits_text : "fp64"});
    csv.rows.push_back({names[i], fmt_sim(s[i].mean.o_cossim), fmt_sim(s[i].worst.o_cossim), fmt_err(s[i].mean.o_rel_l1), fmt_err(s[i].mean.o_rmse),
                        fmt_sim(s[i].mean.p_cossim), fmt_err(s[i].mean.p_rel_l1), bits_text, fmt_err(1 - s[i].mean.o_cossim), canon[i]});
    if (bits > 0) front.rows.push_back({names[i], bits_text, fmt_err(1 - s[i].mean.o_cossim)});
  }
  emit(csv.csv(), (ctx.out_dir / "leaderboard.csv").string());
  const std::vector<std::size_t> on_front =
      pareto_outputs(ctx, "leaderboard-pareto", front, "Attention pipelines: 1 - O CosSim vs K/V bits per element");
  std::ostringstream r;
  r << "leaderboard: every registered method (defaults and presets) vs the fp64 reference on " << head_count(dump)
    << " heads, by mean O CosSim\n\n"
    << t.markdown() << "\n";
  // The Pareto front over the pipelines: no other pipeline has fewer K/V bits and a lower error.
  r << "Pareto front, attention pipelines (K/V bits per element, nominal; 1 - O CosSim):";
  for (std::size_t i : on_front) r << " " << front.rows[i][0] << " (" << front.rows[i][1] << " bits, " << front.rows[i][2] << ");";
  r << "\n";
  return r.str();
}

// long-context: softmax models on synthetic rows from L = 128 to 16K whose spread matches the real logits.
std::string run_long_context(const Context& ctx) {
  // The real rows' spread: the standard deviation of every logits row of the dump (layer*_head*_logits.npy).
  std::vector<double> sigmas;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(ctx.tensors, ec))
    if (e.path().filename().string().ends_with("_logits.npy")) files.push_back(e.path());
  if (ec) throw InputError(ctx.tensors, "--tensors", ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(ctx.tensors, "files", "no layer{L}_head{H}_logits.npy to take the row spread from");
  for (const auto& f : files) {
    for (const RowMatrixXd& m : split_batch(read_npy(f), f))
      for (Eigen::Index i = 0; i < m.rows(); ++i) {
        const double mean = m.row(i).mean();
        sigmas.push_back(std::sqrt((m.row(i).array() - mean).square().mean()));
      }
  }
  std::vector<double> sorted = sigmas;
  std::sort(sorted.begin(), sorted.end());
  const auto pct = [&](double q) { return sorted[static_cast<std::size_t>(q * (sorted.size() - 1))]; };
  // The softmax models of the registry at their defaults and presets, each under its first name.
  const auto [names, canon] = method_rows([](const MethodEntry& e) { return e.kind == MethodKind::softmax_model; });
  std::vector<std::string> specs;
  for (const std::string& n : names) specs.push_back(n.substr(0, n.find(" = ")));
  const int rows = ctx.fast ? 8 : 32;
  const std::vector<int> lengths = ctx.fast ? std::vector<int>{128, 1024, 8192} : std::vector<int>{128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  const auto reference = registry().create("fp64");
  std::vector<std::unique_ptr<Method>> methods;
  for (const auto& spec : canon) methods.push_back(make_method(spec));
  // Rows: logits_j = sigma z_j, z_j standard normal (Box-Muller on a fixed mt19937_64 stream, so every platform
  // draws the same numbers), sigma resampled from the real rows' spreads. The mean is irrelevant to softmax.
  std::mt19937_64 g(20261122);
  const auto uniform = [&] { return (static_cast<double>(g() >> 11) + 0.5) * 0x1p-53; };
  Table t{{"L"}, {}};
  for (const auto& spec : specs) t.header.push_back(spec + " rel L1");
  Table csv{{"L", "method", "p_cossim", "p_rel_l1", "p_rmse", "p_max_abs"}, {}};
  std::vector<std::vector<double>> rel(specs.size());
  std::vector<std::string> refused(specs.size());
  std::vector<std::vector<int>> ran(specs.size());  // the lengths each model ran at
  for (const int L : lengths) {
    RowMatrixXd logits(rows, L);
    for (int i = 0; i < rows; ++i) {
      const double sigma = sigmas[static_cast<std::size_t>(uniform() * sigmas.size()) % sigmas.size()];
      for (int j = 0; j < L; j += 2) {
        const double r = std::sqrt(-2 * std::log(uniform())), a = 2 * M_PI * uniform();
        logits(i, j) = sigma * r * std::cos(a);
        if (j + 1 < L) logits(i, j + 1) = sigma * r * std::sin(a);
      }
    }
    const RowMatrixXd p_ref = reference->softmax_rows(logits);
    std::vector<std::string> row = {std::to_string(L)};
    for (std::size_t m = 0; m < specs.size(); ++m) {
      RowMatrixXd p;
      try {
        p = methods[m]->softmax_rows(logits);
      } catch (const InputError& e) {  // a model with no result for such rows (e.g. tflite-int8's output shift)
        row.push_back("refused");
        if (refused[m].empty()) refused[m] = "refused from L = " + std::to_string(L) + ": " + e.what();
        continue;
      }
      const ErrorStats e = compare(std::span<const double>(p.data(), p.size()), std::span<const double>(p_ref.data(), p_ref.size()));
      rel[m].push_back(e.rel_l1);
      ran[m].push_back(L);
      row.push_back(fmt_err(e.rel_l1));
      csv.rows.push_back({std::to_string(L), specs[m], fmt_sim(e.cossim), fmt_err(e.rel_l1), fmt_err(e.rmse), fmt_err(e.max_abs)});
    }
    t.rows.push_back(row);
  }
  const fs::path csv_path = ctx.out_dir / "long-context.csv";
  emit(csv.csv(), csv_path.string());
  if (ctx.plots) {
    const fs::path png = ctx.out_dir / "long-context.png";
    if (run_plot_script({"lines", csv_path.string(), "-o", png.string(), "--x", "L", "--y", "p_rel_l1", "--series", "method",
                         "--logx", "--logy", "--title", "P relative L1 vs L, synthetic rows with USE-Lite's spread"}) != 0)
      std::cerr << "qattn reproduce: the long-context figure was not drawn (matplotlib missing?)\n";
  }
  std::ostringstream r;
  r << "long-context: P error of each softmax model vs the fp64 softmax, " << rows << " synthetic rows per L\n"
    << "rows: logits = sigma z, z ~ N(0, 1) i.i.d., sigma drawn from the " << sigmas.size() << " real rows' standard "
    << "deviations (" << files.size() << " logits files; sigma percentiles 10/50/90: " << fixed(pct(0.1), 3) << " / "
    << fixed(pct(0.5), 3) << " / " << fixed(pct(0.9), 3) << ")\n\n"
    << t.markdown() << "\n";
  for (std::size_t m = 0; m < specs.size(); ++m) {
    bool monotone = true;
    for (std::size_t k = 1; k < rel[m].size(); ++k) monotone = monotone && rel[m][k] >= rel[m][k - 1];
    r << specs[m] << ": ";
    if (rel[m].size() > 1) {
      r << "rel L1 x" << fixed(rel[m].back() / rel[m].front(), 2) << " from L = " << ran[m].front() << " to "
        << ran[m].back()
        << (monotone ? ", growing at every step" : ", not monotone in L");
    }
    if (!refused[m].empty()) r << (rel[m].size() > 1 ? "; " : "") << refused[m];
    r << "\n";
  }
  return r.str();
}

// Synthetic heads with the structure SageAttention2's Fig. 2 describes: every channel of K carries a bias shared by
// all tokens (channel-wise outliers), Q a smaller one, V a per-channel offset. x[t][c] = bias[c] + N(0, 1), bias[c] ~
// N(0, sigma_x^2) with sigma_K = 4, sigma_Q = 1, sigma_V = 2, and every 16th channel of K an outlier with 4x the
// bias. One layer of `heads` heads, L tokens, d channels, fixed seed; the fp64 reference is computed as for a dump.
std::vector<DumpLayer> synthetic_outlier_dump(int heads, int L, int d, std::uint64_t seed) {
  ref::Normals n(seed);
  const auto reference = registry().create("fp64");
  DumpLayer l;
  for (int h = 0; h < heads; ++h) {
    RowMatrixXd q(L, d), k(L, d), v(L, d);
    for (auto [m, sigma, outliers] : {std::tuple{&q, 1.0, false}, std::tuple{&k, 4.0, true}, std::tuple{&v, 2.0, false}}) {
      std::vector<double> bias(d);
      for (int c = 0; c < d; ++c) bias[c] = sigma * n() * (outliers && c % 16 == 0 ? 4.0 : 1.0);
      for (int t = 0; t < L; ++t)
        for (int c = 0; c < d; ++c) (*m)(t, c) = bias[c] + n();
    }
    l.heads.push_back(h);
    l.q_paths.push_back("synthetic");
    l.q.push_back({q});
    l.k.push_back({k});
    l.v.push_back({v});
    l.reference.push_back({reference->attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(d)), {})});
  }
  return {l};
}

// sage2-tables: the orderings of SageAttention2's ablation tables.
std::string run_sage2_tables(const Context& ctx) {
  struct Claim {
    std::string table, what;
    std::vector<std::string> specs;  // claimed best first: the claim is "each row beats the next"
    std::vector<std::string> labels;
  };
  const std::string q4 = "sage2:qk=4,smooth-q=true,smooth-k=true";
  const std::vector<Claim> claims = {
      {"Table 4", "smoothing (INT4 Q/K): smooth Q+K > smooth K > none",
       {q4, "sage2:qk=4,smooth-q=false,smooth-k=true", "sage2:qk=4,smooth-q=false,smooth-k=false"},
       {"smooth Q+K", "smooth K", "none"}},
      {"Table 6", "granularity (INT4 Q/K, smoothed): per-thread > per-warp > per-block > per-tensor",
       {q4 + ",gran=thread", q4 + ",gran=warp", q4 + ",gran=block", q4 + ",gran=tensor"},
       {"per-thread", "per-warp", "per-block", "per-tensor"}},
      {"Table 7", "P~ and V format (INT8 Q/K): E4M3 > E5M2, E4M3 > INT8",
       {"sage2@8b:p=e4m3", "sage2@8b:p=e5m2"}, {"E4M3", "E5M2"}},
      {"Table 7", "",
       {"sage2@8b:p=e4m3", "sage2@8b:p=int8"}, {"E4M3", "INT8"}},
      {"Table 10", "smoothing V (INT8 Q/K, E4M3 V): smooth V > none",
       {"sage2@8b:smooth-v=true", "sage2@8b:smooth-v=false"}, {"smooth V", "none"}},
  };
  const int L = ctx.fast ? 128 : 512;
  struct Source {
    std::string name;
    std::vector<DumpLayer> dump;
  };
  std::vector<Source> sources;
  sources.push_back({"synthetic (4 heads, L = " + std::to_string(L) + ", d = 128, channel-wise outliers)",
                     synthetic_outlier_dump(4, L, 128, 7)});
  sources.push_back({"USE-Lite", load_dump(ctx.tensors)});
  std::ostringstream r;
  r << "sage2-tables: orderings of SageAttention2's ablations, mean O CosSim (and relative L1) vs the fp64 reference\n"
    << "synthetic heads: x = bias[c] + N(0, 1), bias ~ N(0, s^2), s = 1 (Q), 4 (K; every 16th channel 4x), 2 (V); seed 7\n\n";
  Table t{{"table", "variant", "spec"}, {}};
  for (const auto& src : sources) t.header.push_back(src.name.substr(0, src.name.find(' ')) + " O CosSim"),
                                  t.header.push_back(src.name.substr(0, src.name.find(' ')) + " O rel L1");
  // Every distinct (spec, source) pair once, spread over threads; the table is assembled afterwards in order.
  std::vector<std::string> distinct;
  for (const Claim& c : claims)
    for (const auto& spec : c.specs)
      if (std::find(distinct.begin(), distinct.end(), spec) == distinct.end()) distinct.push_back(spec);
  std::vector<Summary> results(distinct.size() * sources.size());
  parallel_for(results.size(), ctx.threads, [&](std::size_t i) {
    const std::string& spec = distinct[i / sources.size()];
    results[i] = summarise(evaluate(sources[i % sources.size()].dump, *make_method(spec), spec));
  });
  auto result = [&](const std::string& spec, std::size_t si) -> const Summary& {
    return results[(std::find(distinct.begin(), distinct.end(), spec) - distinct.begin()) * sources.size() + si];
  };
  std::vector<std::string> verdicts;
  for (const Claim& c : claims) {
    for (std::size_t i = 0; i < c.specs.size(); ++i) {
      std::vector<std::string> row = {c.table, c.labels[i], c.specs[i]};
      for (std::size_t si = 0; si < sources.size(); ++si) {
        row.push_back(fmt_sim(result(c.specs[i], si).mean.o_cossim));
        row.push_back(fmt_err(result(c.specs[i], si).mean.o_rel_l1));
      }
      t.rows.push_back(row);
    }
    for (std::size_t si = 0; si < sources.size(); ++si) {
      bool holds = true;
      for (std::size_t i = 0; i + 1 < c.specs.size(); ++i)
        holds = holds && result(c.specs[i], si).mean.o_cossim > result(c.specs[i + 1], si).mean.o_cossim;
      std::string labels;
      for (const auto& lab : c.labels) labels += (labels.empty() ? "" : " > ") + lab;
      verdicts.push_back(c.table + ", " + sources[si].name.substr(0, sources[si].name.find(' ')) + ": " + labels + ": " +
                         (holds ? "HOLDS" : "DOES NOT HOLD"));
    }
  }
  r << t.markdown() << "\n";
  for (const auto& v : verdicts) r << v << "\n";
  return r.str();
}

// kv-quantizers: every KV-cache quantizer at 2/3/4 bits under fp32 attention, on USE-Lite and on a long synthetic
// sequence with channel-wise outliers in K; bits per element with scales and zero points counted; a Pareto plot.
std::string run_kv_quantizers(const Context& ctx) {
  const std::vector<std::string> specs = {
      "rtn:bits=2",          "rtn:bits=3",          "rtn:bits=4",          "rtn:bits=2,k=token",
      "kivi:bits=2",         "kivi:bits=3",         "kivi:bits=4",         "flashq:bits=2",
      "flashq@mixed",        "flashq:bits=4",       "turboquant:bits=2",   "turboquant:bits=3",
      "turboquant:bits=4",   "turboquant:bits=2,k=prod", "turboquant:bits=3,k=prod", "turboquant:bits=4,k=prod",
      "saw",                 "saw:block=1",         "saw:v=true"};
  const int L = ctx.fast ? 1024 : 4096;
  struct Source {
    std::string name;
    std::vector<DumpLayer> dump;
  };
  std::vector<Source> sources;
  sources.push_back({"USE-Lite", load_dump(ctx.tensors)});
  sources.push_back({"synthetic", synthetic_outlier_dump(4, L, 64, 11)});
  const auto fp32 = make_method("fp32");
  std::vector<std::vector<HeadResult>> res(specs.size() * sources.size());
  parallel_for(res.size(), ctx.threads, [&](std::size_t i) {
    const auto kv = ref::kv_registry().create(specs[i / sources.size()]);
    res[i] = evaluate(sources[i % sources.size()].dump, *fp32, "fp32", kv.get());
  });
  auto bits = [&](std::size_t m, std::size_t si) {
    double b = 0;
    for (const HeadResult& h : res[m * sources.size() + si]) b += 0.5 * (h.k_bits + h.v_bits);
    return b / static_cast<double>(res[m * sources.size() + si].size());
  };
  auto mean = [&](std::size_t m, std::size_t si) { return summarise(res[m * sources.size() + si]).mean; };
  Table t{{"quantizer", "K bits", "V bits"}, {}};
  for (const auto& src : sources)
    for (const char* h : {" bits", " O CosSim", " O rel L1", " O RMSE"}) t.header.push_back(src.name + h);
  t.header.erase(t.header.begin() + 1, t.header.begin() + 3);  // K/V bits differ by source: one mean per source
  Table csv{{"quantizer", "source", "K_bits", "V_bits", "bits", "O_cossim", "O_rel_l1", "O_rmse", "O_error", "canonical"}, {}};
  Table pareto{{"quantizer", "bits", "O_error"}, {}};
  for (std::size_t m = 0; m < specs.size(); ++m) {
    std::vector<std::string> row = {specs[m]};
    for (std::size_t si = 0; si < sources.size(); ++si) {
      const auto s = mean(m, si);
      row.push_back(fmt_bits(bits(m, si)));
      row.push_back(fmt_sim(s.o_cossim));
      row.push_back(fmt_err(s.o_rel_l1));
      row.push_back(fmt_err(s.o_rmse));
      double kb = 0, vb = 0;
      for (const HeadResult& h : res[m * sources.size() + si]) kb += h.k_bits, vb += h.v_bits;
      const double n = static_cast<double>(res[m * sources.size() + si].size());
      csv.rows.push_back({specs[m], sources[si].name, fmt_bits(kb / n), fmt_bits(vb / n), fmt_bits(bits(m, si)),
                          fmt_sim(s.o_cossim), fmt_err(s.o_rel_l1), fmt_err(s.o_rmse), fmt_err(1 - s.o_cossim),
                          ref::kv_registry().canonical(specs[m])});
      if (si == 0) pareto.rows.push_back({specs[m], fmt_bits(bits(m, si)), fmt_err(1 - s.o_cossim)});
    }
    t.rows.push_back(row);
  }
  emit(csv.csv(), (ctx.out_dir / "kv-quantizers.csv").string());
  const std::vector<std::size_t> on_front = pareto_outputs(
      ctx, "kv-quantizers-pareto", pareto, "KV-cache quantizers on USE-Lite: 1 - O CosSim vs bits per element");
  std::ostringstream r;
  r << "kv-quantizers: K and V through each KV-cache quantizer, then fp32 attention, vs the fp64 reference; mean over "
       "heads\nbits: per element of K and V (mean of the two), codes plus scales and zero points (fp32 scales and "
       "offsets, zero points in the code width, fp16 residual tokens)\n"
    << "USE-Lite: " << head_count(sources[0].dump) << " heads, L = 128; synthetic: 4 heads, L = " << L
    << ", d = 64, channel-wise outliers in K (as in sage2-tables), seed 11\n\n"
    << t.markdown() << "\n";
  auto index = [&](const std::string& spec) {
    return static_cast<std::size_t>(std::find(specs.begin(), specs.end(), spec) - specs.begin());
  };
  auto cos = [&](const std::string& spec, std::size_t si) { return mean(index(spec), si).o_cossim; };
  for (std::size_t si = 0; si < sources.size(); ++si) {
    const std::string& n = sources[si].name;
    r << n << ": per-channel K beats per-token K at 2 bits (KIVI's premise): "
      << (cos("rtn:bits=2", si) > cos("rtn:bits=2,k=token", si) ? "HOLDS" : "DOES NOT HOLD") << " ("
      << fmt_sim(cos("rtn:bits=2", si)) << " vs " << fmt_sim(cos("rtn:bits=2,k=token", si)) << ")\n";
    r << n << ": the block Hadamard lowers per-token INT4 K error (SAW's premise): "
      << (cos("saw", si) > cos("saw:block=1", si) ? "HOLDS" : "DOES NOT HOLD") << " (" << fmt_sim(cos("saw", si))
      << " vs " << fmt_sim(cos("saw:block=1", si)) << " without rotation)\n";
    const bool mixed_between = cos("flashq:bits=2", si) < cos("flashq@mixed", si) &&
                               cos("flashq@mixed", si) < cos("flashq:bits=4", si) &&
                               bits(index("flashq:bits=2"), si) < bits(index("flashq@mixed"), si) &&
                               bits(index("flashq@mixed"), si) < bits(index("flashq:bits=4"), si);
    r << n << ": FlashQ head-wise mixed 2/4 lies between pure 2 and pure 4 bits in bits and error: "
      << (mixed_between ? "HOLDS" : "DOES NOT HOLD") << "\n";
    int mse_wins = 0;
    for (const char* b : {"2", "3", "4"})
      mse_wins += cos(std::string("turboquant:bits=") + b, si) > cos(std::string("turboquant:bits=") + b + ",k=prod", si);
    r << n << ": TurboQuant mse vs prod keys (same bits): mse gives the better attention output at " << mse_wins
      << " of 3 bit widths\n";
  }
  // The Pareto front on USE-Lite: no other quantizer has fewer bits and a lower error.
  r << "USE-Lite Pareto front (bits, 1 - O CosSim):";
  for (std::size_t i : on_front) r << " " << pareto.rows[i][0] << " (" << pareto.rows[i][1] << ", " << pareto.rows[i][2] << ");";
  r << "\n";
  return r.str();
}

// weight-quantizers: RTN, GPTQ and AWQ on the real Q/K/V projection weights, measured on held-out windows by the
// layer-output error and by the attention error the quantized projections cause.
std::string run_weight_quantizers(const Context& ctx) {
  const fs::path dir = ctx.tensors;
  const std::vector<DumpLayer> dump = load_dump(dir);
  std::ostringstream r;
  Table t{{"layer", "bits", "quantizer", "W_q err", "W_k err", "W_v err", "fp32 O CosSim", "intattention O CosSim"}, {}};
  std::vector<std::string> failures;
  int layers_done = 0, comparisons = 0;
  for (const DumpLayer& dl : dump) {
    const std::optional<LayerProjections> proj = load_projections(dir, dl.layer);
    if (!proj) continue;
    const std::int64_t windows = proj->windows, T = proj->tokens;
    const Eigen::Index dm = proj->x.cols();
    const auto& w = proj->w;
    const Eigen::Index heads = static_cast<Eigen::Index>(dl.heads.size()), hd = w[0].cols() / heads;
    // Calibration on the first half of the windows, evaluation on the rest (in-sample when there is one window).
    const std::int64_t n_cal = std::max<std::int64_t>(1, windows / 2);
    const RowMatrixXd x_cal = proj->x.topRows(n_cal * T);
    const RowMatrixXd x_eval = windows > 1 ? RowMatrixXd(proj->x.bottomRows((windows - n_cal) * T)) : proj->x;
    // The reference: fp64 attention of the unquantized projections, per evaluation window and head.
    DumpLayer exact = project_layer(dl, x_eval, T, w, proj->b);
    compute_reference(exact);
    const auto fp32 = make_method("fp32"), intatt = make_method("intattention@upstream-neon");
    auto attention_row = [&](const std::string& bits, const std::string& name, const std::array<RowMatrixXd, 3>& wq,
                             const std::array<double, 3>& err) {
      DumpLayer l = project_layer(dl, x_eval, T, wq, proj->b);
      l.reference = exact.reference;
      const std::vector<DumpLayer> one = {l};
      t.rows.push_back({std::to_string(dl.layer), bits, name, fmt_err(err[0]), fmt_err(err[1]), fmt_err(err[2]),
                        fmt_sim(summarise(evaluate(one, *fp32, "fp32")).mean.o_cossim),
                        fmt_sim(summarise(evaluate(one, *intatt, "intattention")).mean.o_cossim)});
    };
    attention_row("fp32", "none", w, {0, 0, 0});
    for (int b : {4, 3}) {
      const char* names[3] = {"rtn", "gptq", "awq"};
      std::array<std::array<RowMatrixXd, 3>, 3> wq;  // [quantizer][projection]
      std::array<std::array<double, 3>, 3> err{};
      parallel_for(9, ctx.threads, [&](std::size_t i) {
        const std::size_t qi = i / 3, p = i % 3;
        const auto quantizer = ref::weight_registry().create(std::string(names[qi]) + ":bits=" + std::to_string(b) + ",group=128");
        wq[qi][p] = quantizer->apply(w[p], x_cal);
        err[qi][p] = ref::relative_output_error(x_eval, w[p], wq[qi][p]);
      });
      for (int qi = 0; qi < 3; ++qi) attention_row(std::to_string(b), names[qi], wq[qi], err[qi]);
      for (int qi = 1; qi < 3; ++qi)
        for (int p = 0; p < 3; ++p) {
          ++comparisons;
          if (!(err[qi][p] < err[0][p]))
            failures.push_back(std::string(names[qi]) + " on layer " + std::to_string(dl.layer) + " W_" + "qkv"[p] +
                               " at " + std::to_string(b) + " bits: " + fmt_err(err[qi][p]) + " vs RTN " + fmt_err(err[0][p]));
        }
    }
    ++layers_done;
    r << "layer " << dl.layer << ": X " << windows << " windows x " << T << " tokens x d_model " << dm << "; calibration "
      << (windows > 1 ? "windows 0-" + std::to_string(n_cal - 1) + ", evaluation windows " + std::to_string(n_cal) +
                            "-" + std::to_string(windows - 1)
                      : std::string("and evaluation on the one window (in-sample)"))
      << "; " << heads << " heads of d = " << hd << "\n";
  }
  if (layers_done == 0)
    throw InputError(dir.string(), "files", "no layer{L}_attn_input.npy with layer{L}_w{q,k,v}.npy and b{q,k,v}.npy");
  std::ostringstream head;
  head << "weight-quantizers: RTN, GPTQ and AWQ (asymmetric, group 128 along the input, per output column) on the "
          "Q/K/V projections; err = |X W^ - X W|_F / |X W|_F on the evaluation windows; attention O CosSim vs fp64 "
          "attention of the unquantized projections (mean over heads)\n";
  r << "\n" << t.markdown() << "\n";
  r << "verdict: GPTQ and AWQ beat RTN on the layer-output error in " << comparisons - failures.size() << " of "
    << comparisons << " (layer, projection, bits) cases: " << (failures.empty() ? "HOLDS" : "DOES NOT HOLD everywhere")
    << "\n";
  for (const auto& f : failures) r << "  not better: " << f << "\n";
  return head.str() + r.str();
}

const std::vector<Experiment>& experiments() {
  static const std::vector<Experiment> list = {
      {"intattn-fig9", "IndexSoftmax is stable for b >= 4 and c in [5.5, 7.7], ridge near c = 6.6", "IntAttention Fig. 9",
       run_fig9, "qattn reproduce intattn-fig9 [--fast]"},
      {"intattn-table8", "UINT8 (x255) P beats INT8 (x127) P: CosSim 0.999081 vs 0.996612", "IntAttention Table 8",
       run_table8, "qattn reproduce intattn-table8"},
      {"leaderboard", "every registered method on the same tensors in one table", "(none of the papers)", run_leaderboard,
       "qattn reproduce leaderboard"},
      {"sage2-tables", "orderings of the smoothing, granularity, P/V format and smooth-V ablations", "SageAttention2 Tables 4, 6, 7, 10",
       run_sage2_tables, "qattn reproduce sage2-tables [--fast]"},
      {"long-context", "clipping and 8-bit normalisation errors grow with L (128 to 16K)", "IntAttention, EXAQ, TurboAttention",
       run_long_context, "qattn reproduce long-context [--fast]"},
      {"kv-quantizers", "KV-cache quantizers: error vs bits; per-channel K, Hadamard rotation and mixed precision help",
       "KIVI, TurboQuant, SAW-INT4, TurboAttention", run_kv_quantizers, "qattn reproduce kv-quantizers [--fast]"},
      {"weight-quantizers", "GPTQ and AWQ beat RTN on the layer output", "GPTQ, AWQ", run_weight_quantizers,
       "qattn reproduce weight-quantizers"},
      {"sas-poly", "SAS's cubic is a least-squares fit of e^-x on [0, 1]", "TurboAttention Eq. 15", {},
       "qattn reproduce sas-poly", "qattn_exp_sas_poly"},
      {"exaq-clipping", "the clipping table C*(sigma) follows from Eq. 14", "EXAQ Table 1", {},
       "qattn reproduce exaq-clipping [--fast]", "qattn_exp_exaq_clipping"},
  };
  return list;
}

struct ReproduceOptions {
  std::string name, tensors = QATTN_DEFAULT_TENSORS, out_dir = ".", out;
  bool list = false, fast = false, no_plots = false;
  int threads = 0;
};

void run_reproduce(const ReproduceOptions& o) {
  if (o.list || o.name.empty()) {
    Table t{{"experiment", "source", "claim", "command"}, {}};
    for (const auto& e : experiments()) t.rows.push_back({e.name, e.source, e.claim, e.command});
    std::cout << t.markdown();
    return;
  }
  const auto it = std::find_if(experiments().begin(), experiments().end(), [&](const Experiment& e) { return e.name == o.name; });
  if (it == experiments().end()) {
    std::string names;
    for (const auto& e : experiments()) names += (names.empty() ? "" : ", ") + e.name;
    throw CLI::ValidationError("NAME", "'" + o.name + "' is not an experiment (" + names + ")");
  }
  if (!it->run) {  // its own program, built next to qattn under experiments/
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    const fs::path program = self.parent_path() / "experiments" / it->program;
    if (ec || !fs::is_regular_file(program, ec))
      throw InputError(program.string(), "NAME", "'" + o.name + "' is the program " + it->program +
                                                   ": build it (cmake --build build-release --target " + it->program + ")");
    std::vector<std::string> argv = {program.string()};
    if (o.fast && it->command.find("--fast") != std::string::npos) argv.push_back("--fast");
    const int rc = run_program(argv);
    if (rc != 0) throw ExitCode{rc};
    return;
  }
  require_range("--threads", o.threads, 0, kMaxThreads);
  require_distinct_files({{"--tensors", o.tensors}}, {{"--out", o.out}});
  // The experiment writes its data files into a staging directory beside --out-dir; they move into --out-dir (created
  // then) only once the experiment and its report have succeeded, so a failure leaves no directory and no file.
  std::error_code ec;
  const fs::path out_dir = fs::absolute(o.out_dir, ec).lexically_normal();
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw InputError(o.out_dir, "--out-dir", "exists and is not a directory");
  fs::path anchor = out_dir;  // the nearest existing ancestor, where the staging directory goes
  while (!anchor.empty() && !fs::is_directory(anchor, ec) && anchor != anchor.parent_path()) anchor = anchor.parent_path();
  std::string tmpl = (anchor / ".qattn-reproduce-XXXXXX").string();
  if (!mkdtemp(tmpl.data()))
    throw InputError(o.out_dir, "--out-dir", "cannot create a staging directory in " + anchor.string() + ": " +
                                                 std::strerror(errno));
  const fs::path staging = tmpl;
  struct RemoveStaging {
    fs::path dir;
    ~RemoveStaging() {
      std::error_code e;
      fs::remove_all(dir, e);
    }
  } cleanup{staging};
  Context ctx{o.tensors, staging, o.fast, !o.no_plots, o.threads};
  const std::string report = it->run(ctx);
  std::vector<std::unique_ptr<PendingFile>> files;
  if (!o.out.empty()) files.push_back(std::make_unique<PendingFile>(o.out, std::as_bytes(std::span(report.data(), report.size()))));
  fs::create_directories(out_dir, ec);
  if (ec) throw InputError(o.out_dir, "--out-dir", "cannot be created: " + ec.message());
  for (const auto& entry : fs::directory_iterator(staging)) {
    fs::rename(entry.path(), out_dir / entry.path().filename(), ec);
    if (ec) throw InputError((out_dir / entry.path().filename()).string(), "file", "cannot move into place: " + ec.message());
  }
  for (auto& f : files) f->commit();
  if (o.out.empty()) emit(report, "");
}

}  // namespace

void add_reproduce(CLI::App& app) {
  auto* sub = app.add_subcommand("reproduce", "Run one paper claim as an experiment (a report with a verdict, data files)");
  auto o = std::make_shared<ReproduceOptions>();
  sub->add_option("NAME", o->name, "experiment (see --list)");
  sub->add_flag("--list", o->list, "list the experiments");
  sub->add_flag("--fast", o->fast, "the reduced variant (coarser grids) that CI re-checks under sanitizers");
  sub->add_option("--tensors", o->tensors, "dump directory")->capture_default_str();
  sub->add_option("--out-dir", o->out_dir, "where data files (CSV, PNG) go")->capture_default_str();
  sub->add_option("--out", o->out, "write the report here instead of stdout");
  sub->add_flag("--no-plots", o->no_plots, "skip the figures (no Python needed)");
  sub->add_option("--threads", o->threads, "worker threads, at most " + std::to_string(kMaxThreads) + " (default 0: all cores)");
  add_engine_options(sub);
  sub->callback([o] { run_reproduce(*o); });
}

void add_plot(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "plot", "Render qattn CSV with matplotlib: heatmap|lines|pareto CSV -o FIG.{png,pdf,svg} [options] "
              "(analysis/plots/qattn_plot.py; `qattn plot heatmap --help` lists the options)");
  sub->prefix_command();  // everything after `plot` goes to the script as given
  sub->callback([sub] {
    const std::vector<std::string> args = sub->remaining();
    if (args.empty()) throw CLI::ValidationError("plot", "expected heatmap|lines|pareto CSV -o FIG");
    const int rc = run_plot_script(args);
    if (rc != 0) throw ExitCode{rc == 2 ? kExitBadInput : rc};
  });
}

}  // namespace qattn::cli
