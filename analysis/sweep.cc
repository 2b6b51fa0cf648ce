// qattn sweep: one method over a grid of its parameters, every grid point evaluated on every head of a dump and
// aggregated (mean and worst over heads) into a CSV that `qattn plot` reads. Grid points run on a pool of threads;
// each point has its own Method object, the dump is shared read-only, and the rows come out in grid order, so the
// output does not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <mutex>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "commands.h"
#include "data_paths.h"
#include "evaluate.h"
#include "qattn/error.h"
#include "qattn/eval/grid.h"
#include "qattn/reference/registry.h"
#include "shard.h"
#include "engine_setting.h"
#include "evaluate.h"

namespace qattn::cli {
namespace {

using eval::GridAxis;

struct SweepOptions {
  std::string spec, tensors = default_tensors(), metric = "cossim", target = "O", out, format = "csv";
  std::vector<std::string> grids;
  int threads = 0;
  long long max_points = kDefaultMaxSweepPoints;
  std::string shard;
  std::string order = "point-major";  // how --shard numbers the (grid point, head) units
  EngineSetting engine;
};

// Every grid point (the axes' values in order, last axis fastest) and its spec, validated before anything runs: a
// bad value fails the command with nothing written. The grid's size is checked before it is built: three axes of
// 100000 values would otherwise fill memory with spec strings before the first point runs.
std::pair<std::vector<std::vector<std::string>>, std::vector<MethodSpec>> grid_points(const SweepOptions& o,
                                                                                      const std::vector<GridAxis>& axes) {
  long long n_points = 1;
  for (const GridAxis& axis : axes)
    if (__builtin_mul_overflow(n_points, static_cast<long long>(axis.values.size()), &n_points) || n_points > o.max_points)
      throw CLI::ValidationError("--grid", "the grid has more than " + std::to_string(o.max_points) +
                                               " points (the product of its axes); --max-points raises the cap");
  const MethodSpec base = parse_method_spec(o.spec);
  std::vector<std::vector<std::string>> points{{}};
  for (const GridAxis& axis : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& p : points)
      for (const auto& v : axis.values) {
        next.push_back(p);
        next.back().push_back(v);
      }
    points = std::move(next);
  }
  std::vector<MethodSpec> specs;
  for (const auto& p : points) {
    MethodSpec s = base;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      std::erase_if(s.overrides, [&](const auto& kv) { return kv.first == axes[a].key; });
      s.overrides.emplace_back(axes[a].key, p[a]);
    }
    ref::reference_registry().create(s);  // throws SpecError naming the key and value
    specs.push_back(s);
  }
  return {points, specs};
}

// Every point evaluated over the dump as one streamed evaluation (docs/streaming.md): each point is a method of
// evaluate_methods, threaded over (head, block of query rows) items, eight points per item (they share the block's
// reference rows; a head holds the prepared calls of eight points at a time), with progress on stderr.
// sink(i, per-head results of point i) is called once per point, in point order.
void evaluate_points(const std::vector<DumpLayer>& dump, const std::vector<MethodSpec>& specs,
                     const std::vector<std::string>& canonical, const SweepOptions& o,
                     const std::function<void(std::size_t, std::vector<HeadResult>)>& sink) {
  if (specs.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  std::size_t heads = 0;
  for (const DumpLayer& l : dump) heads += l.heads.size();
  EvalOptions options;
  options.threads = resolve_threads(o.threads);
  options.methods_per_item = 8;
  if (specs.size() * heads >= 1000 || isatty(STDERR_FILENO))
    std::cerr << "qattn sweep: " << specs.size() << " points x " << heads << " heads = " << specs.size() * heads
              << " head evaluations on " << options.threads << " thread" << (options.threads == 1 ? "" : "s") << "\n";
  std::mutex progress_mutex;
  double last_report = 0;
  options.progress = [&](std::size_t d, std::size_t total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(progress_mutex);
    if (elapsed - last_report > 2.0 || (d == total && elapsed > 2.0)) {
      last_report = elapsed;
      const double eta = elapsed / static_cast<double>(d) * static_cast<double>(total - d);
      std::cerr << "qattn sweep: [" << d << "/" << total << " blocks and calls] " << static_cast<int>(elapsed) << " s"
                << (d < total ? ", about " + std::to_string(static_cast<int>(eta)) + " s left" : std::string()) << "\n";
    }
  };
  std::vector<std::unique_ptr<Method>> built;
  std::vector<EvalMethod> methods;
  for (const MethodSpec& spec : specs) {
    built.push_back(make_method(spec, o.engine));
    // Each point is labelled by its canonical spec, so an error names the point; its results carry --method's text.
    methods.push_back({built.back().get(), canonical[methods.size()], ref::reference_registry().traits(spec)});
  }
  std::vector<HeadResult> all = evaluate_methods(dump, methods, options);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<HeadResult> mine(std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(i * heads)),
                                 std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>((i + 1) * heads)));
    for (HeadResult& r : mine) r.method = o.spec;
    sink(i, std::move(mine));
  }
}

// The partial result of `sweep --shard K/N`. The units are the (grid point, head) pairs, numbered point-major (point
// i, head j is unit i H + j for the H heads of the dump in (layer, head) order: when N divides the number of points
// every shard owns whole points) or head-major (unit j P + i for P points: when N divides the number of heads every
// shard owns whole heads and runs every point on them, reading each head once). A shard reads only the heads its
// block touches (whole layers where a point's method looks across heads). Its rows are the per-head metrics of each
// (point, head) it owns; `qattn merge` summarises each point over all its heads, whichever order numbered them.
std::string sweep_partial(const SweepOptions& o, Shard shard, const std::vector<std::vector<std::string>>& points,
                          const std::vector<MethodSpec>& specs, const std::vector<std::string>& canonical,
                          const SweepTable& table) {
  const DumpListing listing = list_dump(o.tensors, DumpTarget::attention);
  const std::size_t n_heads = listing.units.size();
  const auto [begin, end] = shard_block(specs.size() * n_heads, shard);
  std::map<std::size_t, std::set<std::pair<int, int>>> owned;  // point -> its heads this shard owns
  std::set<std::pair<int, int>> heads_read;
  std::set<int> layers_read;
  bool whole_layers = false;
  const bool head_major = o.order == "head-major";
  for (std::size_t u = begin; u < end; ++u) {
    const std::size_t point = head_major ? u % specs.size() : u / n_heads, head = head_major ? u / specs.size() : u % n_heads;
    owned[point].insert(listing.units[head]);
    heads_read.insert(listing.units[head]);
    layers_read.insert(listing.units[head].first);
  }
  for (const auto& [point, heads] : owned)
    whole_layers = whole_layers || !ref::reference_registry().traits(specs[point]).heads_independent;
  Provenance prov;
  DumpFilter filter;
  filter.keep = [&](int layer, int head) {
    return whole_layers ? layers_read.count(layer) > 0 : heads_read.count({layer, head}) > 0;
  };
  filter.listing = &listing;
  filter.files_read = &prov.inputs;
  std::vector<DumpLayer> dump;
  if (begin < end) dump = load_dump(o.tensors, DumpTarget::attention, SoftmaxReference::fp64, &filter, false);
  std::vector<std::size_t> my_points;
  std::vector<MethodSpec> my_specs;
  for (const auto& [point, heads] : owned) my_points.push_back(point), my_specs.push_back(specs[point]);
  std::vector<std::vector<HeadResult>> results(my_specs.size());
  std::vector<std::string> my_canonical;
  for (std::size_t point : my_points) my_canonical.push_back(canonical[point]);
  evaluate_points(dump, my_specs, my_canonical, o, [&](std::size_t i, std::vector<HeadResult> r) { results[i] = std::move(r); });
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < my_points.size(); ++i)
    for (const HeadResult& r : results[i])
      if (owned[my_points[i]].count({r.layer, r.head}))
        rows.push_back({{"point", my_points[i]},
                        {"values", points[my_points[i]]},
                        {"method", canonical[my_points[i]]},
                        {"head", head_result_json(r)}});
  nlohmann::json header = sweep_header_json(table);
  header["heads"] = n_heads;
  header["rows"] = rows;
  prov.command = "sweep";
  prov.options = {{"method", o.spec}, {"grid", o.grids}, {"tensors", o.tensors}, {"metric", o.metric},
                  {"target", o.target}, {"order", o.order}};
  prov.dump = {{"source", o.tensors}, {"files", listing.files}};
  prov.units = specs.size() * n_heads;
  prov.heads = listing.units;
  prov.points = specs.size();
  prov.shard = shard;
  nlohmann::json doc = partial_document(prov, header);
  doc["format"] = o.format;
  return doc.dump(1) + "\n";
}

void run_sweep(const SweepOptions& o) {
  std::vector<GridAxis> axes;
  for (const auto& g : o.grids) {
    try {
      axes.push_back(eval::parse_grid_axis(g));
    } catch (const SpecError& e) {  // the library's reason, under the option's name as before
      throw CLI::ValidationError("--grid", e.what());
    }
  }
  for (std::size_t a = 0; a < axes.size(); ++a)
    for (std::size_t b = 0; b < a; ++b)
      if (axes[a].key == axes[b].key) throw CLI::ValidationError("--grid", "key '" + axes[a].key + "' given twice");
  Metric metric;
  try {
    metric = sweep_metric(o.target, o.metric);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--metric", e.what());
  }
  require_threads(o.threads);
  require_range("--max-points", o.max_points, 1, kMaxSweepPointsLimit);
  require_distinct_files({{"--tensors", o.tensors}}, {{"--out", o.out}});
  const std::optional<Shard> shard = o.shard.empty() ? std::nullopt : std::optional<Shard>(shard_option(o.shard));
  const auto [points, specs] = grid_points(o, axes);
  std::vector<std::string> canonical;  // each point's spec, every parameter spelled out: its row's method
  for (const MethodSpec& spec : specs) canonical.push_back(ref::reference_registry().canonical(spec));
  SweepTable table;
  table.target = o.target;
  table.metric = o.metric;
  for (const auto& a : axes) table.keys.push_back(a.key);
  if (shard) return emit(sweep_partial(o, *shard, points, specs, canonical, table), o.out);
  const std::vector<DumpLayer> dump = load_dump(o.tensors, DumpTarget::attention, SoftmaxReference::fp64, nullptr, false);
  std::vector<Summary> summaries(specs.size());
  evaluate_points(dump, specs, canonical, o,
                  [&](std::size_t i, std::vector<HeadResult> r) { summaries[i] = summarise(r); });
  for (const DumpLayer& l : dump) table.heads += l.heads.size();
  for (std::size_t i = 0; i < specs.size(); ++i)
    table.rows.push_back({points[i], canonical[i], summaries[i].mean[metric], summaries[i].worst[metric]});
  emit(render_sweep(table, o.format), o.out);
}


}  // namespace

void add_sweep(CLI::App& app) {
  auto* sub = app.add_subcommand("sweep", "One method over a grid of its parameters, mean and worst over all heads, as CSV");
  auto o = std::make_shared<SweepOptions>();
  sub->add_option("--method", o->spec, "Method spec the grid is applied to (e.g. index@paper)")->required();
  sub->add_option("--grid", o->grids, "KEY=A:B (integers), KEY=A:STEP:B or KEY=V1,V2,...; repeatable, one axis each")
      ->required();
  sub->add_option("--tensors", o->tensors, "Dump: a directory of layer{L}_head{H}_{q,k,v}.npy, or one .npz/.safetensors file")
      ->capture_default_str();
  sub->add_option("--metric", o->metric, "cossim|one_minus_cossim|rel_l1|rmse (O and P), kl (P only)")->capture_default_str();
  sub->add_option("--target", o->target, "O (attention output) or P (probabilities)")
      ->check(CLI::IsMember({"O", "P"}))
      ->capture_default_str();
  add_threads_option(sub, o->threads, "worker threads over grid points", ", never more than the points");
  add_engine_options(sub, o->engine);
  sub->add_option("--max-points", o->max_points,
                  "refuse a grid of more points than this (the product of the axes; at most " +
                      std::to_string(kMaxSweepPointsLimit) + ")")
      ->capture_default_str();
  sub->add_option("--format", o->format, "csv|md")->check(CLI::IsMember({"csv", "md"}))->capture_default_str();
  sub->add_option("--out", o->out, "Write here (atomically) instead of stdout");
  sub->add_option("--shard", o->shard,
                  "K/N: evaluate only block K (0-based) of N of the grid points and write a partial result (JSON) for "
                  "`qattn merge` (docs/scale-out.md)");
  sub->add_option("--order", o->order,
                  "how --shard numbers the (grid point, head) units: point-major (N dividing the points gives whole "
                  "points) or head-major (N dividing the heads gives whole heads, each read once and run at every "
                  "point: the order for long-context dumps, docs/scale-out.md)")
      ->check(CLI::IsMember({"point-major", "head-major"}))
      ->capture_default_str();
  sub->callback([o] { run_sweep(*o); });
}

}  // namespace qattn::cli
