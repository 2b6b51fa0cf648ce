// The experiment list and the helpers experiments share (experiments/common/experiment.h).
#include "experiment.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "qattn/error.h"
#include "qattn/eval/grid.h"
#include "qattn/parallel.h"
#include "qattn/reference/random.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"

namespace qattn::experiments {
namespace fs = std::filesystem;

ExperimentList experiment_files();  // generated from experiments/*/experiment.cmake

void ExperimentList::add(Experiment e) {
  if (find(e.name)) throw std::logic_error("experiment '" + e.name + "' registered twice");
  e.command = "qattn reproduce " + e.name + (e.fast ? " [--fast]" : "");
  list_.push_back(std::move(e));
}

const Experiment* ExperimentList::find(const std::string& name) const {
  for (const Experiment& e : list_)
    if (e.name == name) return &e;
  return nullptr;
}

const ExperimentList& experiment_list() {
  static const ExperimentList list = experiment_files();
  return list;
}

void write_text(const fs::path& path, const std::string& text) {
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

bool draw(const ExperimentContext& ctx, const std::vector<std::string>& args, const fs::path& png) {
  if (!ctx.plots) return false;
  if (ctx.plot && ctx.plot(args) == 0) return true;
  std::cerr << "qattn reproduce: " << png.filename().string() << " was not drawn (matplotlib missing?)\n";
  return false;
}

Source use_lite_source(const ExperimentContext& ctx) { return {"USE-Lite", load_dump(ctx.tensors)}; }

Source outlier_source(std::string name, int heads, int L, int d, std::uint64_t seed) {
  return {std::move(name), synthetic_outlier_dump(heads, L, d, seed)};
}

AccuracySources accuracy_sources(const ExperimentContext& ctx, int full_L, int fast_L, int d) {
  const int long_L = ctx.fast ? fast_L : full_L;
  return {long_L, d,
          make_sources(use_lite_source(ctx), outlier_source("synthetic", 4, 512, 128, 7),
                       outlier_source("long", 2, long_L, d, 21))};
}

std::string AccuracySources::line() const {
  return "sources: USE-Lite (the dump, L = 128); synthetic: 4 heads, L = 512, d = 128, channel-wise K outliers (seed "
         "7); long: 2 heads, L = " + std::to_string(long_L) + ", d = " + std::to_string(d) +
         ", the same structure (seed 21)\n\n";
}

Grid run_grid(const std::vector<std::string>& specs, const std::vector<Source>& sources, const ExperimentContext& ctx) {
  std::vector<Summary> results(specs.size() * sources.size());
  parallel_for(results.size(), ctx.threads, [&](std::size_t i) {
    const std::string& spec = specs[i / sources.size()];
    results[i] = summarise(evaluate(sources[i % sources.size()].dump, *make_method(spec, ctx.engine), spec));
  });
  return Grid(sources.size(), std::move(results));
}

Table grid_table(std::vector<std::string> head, const std::vector<std::vector<std::string>>& lead,
                 const std::vector<Source>& sources, const Grid& grid) {
  Table t{std::move(head), {}};
  for (const Source& s : sources) t.header.push_back(s.name + " O CosSim"), t.header.push_back(s.name + " O rel L1");
  for (std::size_t i = 0; i < lead.size(); ++i) {
    std::vector<std::string> cells = lead[i];
    for (std::size_t s = 0; s < sources.size(); ++s)
      cells.push_back(fmt_sim(grid.cossim(i, s))), cells.push_back(fmt_err(grid.at(i, s).mean.o_rel_l1));
    t.rows.push_back(std::move(cells));
  }
  return t;
}

Table grid_table(const std::string& label_header, const std::vector<GridRow>& rows, const std::vector<Source>& sources,
                 const Grid& grid) {
  std::vector<std::vector<std::string>> lead;
  for (const GridRow& r : rows) lead.push_back({r.label, r.spec});
  return grid_table({label_header, "spec"}, lead, sources, grid);
}

AccuracyGrid accuracy_grid(std::ostream& report, const std::vector<GridRow>& rows, const ExperimentContext& ctx,
                           int full_L, int fast_L, int d, const std::string& label_header) {
  AccuracyGrid g = accuracy_grid(rows, ctx, full_L, fast_L, d);
  report << g.src.line() << grid_table(label_header, rows, g.src.sources, g.grid).markdown() << "\n";
  return g;
}

std::vector<Summary> summaries(const std::vector<DumpLayer>& dump, const std::vector<std::string>& specs,
                               const EngineSetting& engine) {
  std::vector<Summary> out;
  for (const auto& s : specs) out.push_back(summarise(evaluate(dump, *make_method(s, engine), s)));
  return out;
}

Sweep2 sweep_bc(const std::vector<DumpLayer>& dump, const std::string& spec, const std::string& b_grid,
                const std::string& c_grid, const ExperimentContext& ctx) {
  Sweep2 s;
  s.b = eval::parse_grid_axis("b=" + b_grid).values;
  s.c = eval::parse_grid_axis("c=" + c_grid).values;
  s.mean.assign(s.b.size(), std::vector<double>(s.c.size(), NAN));
  parallel_for(s.b.size() * s.c.size(), ctx.threads, [&](std::size_t i) {
    const std::size_t bi = i / s.c.size(), ci = i % s.c.size();
    MethodSpec m = parse_method_spec(spec);
    m.overrides.emplace_back("b", s.b[bi]);
    m.overrides.emplace_back("c", s.c[ci]);
    s.mean[bi][ci] = summarise(evaluate(dump, *make_method(m, ctx.engine), spec)).mean.o_cossim;
  });
  return s;
}

void write_sweep_csv(const Sweep2& s, const std::string& spec, std::size_t heads, const fs::path& path) {
  Table t{{"b", "c", "target", "metric", "mean", "heads", "method"}, {}};
  for (std::size_t bi = 0; bi < s.b.size(); ++bi)
    for (std::size_t ci = 0; ci < s.c.size(); ++ci)
      t.rows.push_back({s.b[bi], s.c[ci], "O", "cossim", fmt_sim(s.mean[bi][ci]), std::to_string(heads), spec});
  write_text(path, t.csv());
}

std::size_t head_count(const std::vector<DumpLayer>& dump) {
  std::size_t n = 0;
  for (const auto& l : dump) n += l.heads.size();
  return n;
}

std::vector<std::size_t> pareto_outputs(const ExperimentContext& ctx, const std::string& name, const Table& table,
                                        const std::string& title) {
  const fs::path csv = ctx.out_dir / (name + ".csv");
  write_text(csv, table.csv());
  const fs::path png = ctx.out_dir / (name + ".png");
  draw(ctx, {"pareto", csv.string(), "-o", png.string(), "--x", table.header[1], "--y", table.header[2], "--label",
             table.header[0], "--logy", "--title", title}, png);
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

std::string pareto_front_text(const Table& table, const std::vector<std::size_t>& front, const std::string& bits_unit) {
  std::string text;
  for (std::size_t i : front)
    text += " " + table.rows[i][0] + " (" + table.rows[i][1] + bits_unit + ", " + table.rows[i][2] + ");";
  return text;
}

double kv_bits(const std::string& canonical) { return ref::reference_registry().traits(parse_method_spec(canonical)).kv_bits; }

std::pair<std::vector<std::string>, std::vector<std::string>> method_rows(
    const std::function<bool(const MethodEntry&)>& keep) {
  std::vector<std::string> names, canon;
  for (const auto& e : ref::reference_registry().entries()) {
    if (!e.in_default_lists || !keep(e)) continue;
    std::vector<std::string> specs{e.name};
    for (const auto& p : e.presets)
      if (p.alias_of.empty()) specs.push_back(e.name + "@" + p.name);  // an old spelling is its preset's row
    for (const auto& spec : specs) {
      const std::string c = ref::reference_registry().canonical(parse_method_spec(spec));
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

void add_synthetic_head(DumpLayer& layer, int head, RowMatrixXd q, RowMatrixXd k, RowMatrixXd v) {
  static const std::unique_ptr<Method> reference = ref::reference_registry().create("fp64");
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.cols()));
  layer.reference.push_back({reference->attention(q, k, v, scale, {})});
  layer.heads.push_back(head);
  layer.q_paths.push_back("synthetic");
  layer.q.push_back({std::move(q)});
  layer.k.push_back({std::move(k)});
  layer.v.push_back({std::move(v)});
}

std::vector<DumpLayer> synthetic_outlier_dump(int heads, int L, int d, std::uint64_t seed) {
  ref::Normals n(seed);
  DumpLayer l;
  for (int h = 0; h < heads; ++h) {
    RowMatrixXd q(L, d), k(L, d), v(L, d);
    for (auto [m, sigma, outliers] : {std::tuple{&q, 1.0, false}, std::tuple{&k, 4.0, true}, std::tuple{&v, 2.0, false}}) {
      std::vector<double> bias(d);
      for (int c = 0; c < d; ++c) bias[c] = sigma * n() * (outliers && c % 16 == 0 ? 4.0 : 1.0);
      for (int t = 0; t < L; ++t)
        for (int c = 0; c < d; ++c) (*m)(t, c) = bias[c] + n();
    }
    add_synthetic_head(l, h, std::move(q), std::move(k), std::move(v));
  }
  return {l};
}

NeedleHead needle_head(Eigen::Index keys, Eigen::Index d, Eigen::Index rows) {
  std::mt19937_64 g(4096 + static_cast<std::uint64_t>(keys));
  std::normal_distribution<double> n(0, 0.5);
  NeedleHead h;
  h.q = RowMatrixXd::Zero(rows, d), h.k = RowMatrixXd::Zero(keys, d), h.v = RowMatrixXd::Ones(keys, d);
  h.q.col(1).setConstant(1);
  double mass = 0;
  for (Eigen::Index j = 0; j < keys; ++j) h.k(j, 1) = n(g), mass += std::exp(h.k(j, 1));
  h.needle = keys / 3;
  h.k(h.needle, 1) = 0;
  h.q.col(0).setConstant(1);
  h.k(h.needle, 0) = std::log(mass / 3);  // weight about 1/4
  h.v(h.needle, 0) = 2;
  return h;
}

}  // namespace qattn::experiments
