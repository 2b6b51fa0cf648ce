// One method over a grid of its parameters (qattn/eval/sweep.h).
#include "qattn/eval/sweep.h"

#include <iterator>
#include <utility>

#include "qattn/error.h"
#include "qattn/parallel.h"
#include "qattn/reference/registry.h"

namespace qattn::eval {

std::vector<GridAxis> sweep_axes(const std::vector<std::string>& grids, long long max_points) {
  std::vector<GridAxis> axes;
  for (const std::string& g : grids) axes.push_back(parse_grid_axis(g));
  for (std::size_t a = 0; a < axes.size(); ++a)
    for (std::size_t b = 0; b < a; ++b)
      if (axes[a].key == axes[b].key) throw SpecError("key '" + axes[a].key + "' given twice");
  long long n_points = 1;
  for (const GridAxis& axis : axes)
    if (__builtin_mul_overflow(n_points, static_cast<long long>(axis.values.size()), &n_points) || n_points > max_points)
      throw SpecError("the grid has more than " + std::to_string(max_points) +
                      " points (the product of its axes); --max-points raises the cap");
  return axes;
}

SweepGrid sweep_grid(const SweepRequest& request) {
  SweepGrid grid;
  grid.axes = sweep_axes(request.grids, request.max_points);
  const MethodSpec base = parse_method_spec(request.spec);
  grid.points = {{}};
  for (const GridAxis& axis : grid.axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& p : grid.points)
      for (const auto& v : axis.values) {
        next.push_back(p);
        next.back().push_back(v);
      }
    grid.points = std::move(next);
  }
  for (const auto& p : grid.points) {
    MethodSpec s = base;
    for (std::size_t a = 0; a < grid.axes.size(); ++a) {
      std::erase_if(s.overrides, [&](const auto& kv) { return kv.first == grid.axes[a].key; });
      s.overrides.emplace_back(grid.axes[a].key, p[a]);
    }
    ref::reference_registry().create(s);  // throws SpecError naming the key and value
    grid.specs.push_back(s);
    grid.canonical.push_back(ref::reference_registry().canonical(s));
  }
  return grid;
}

SweepTable sweep_header(const SweepRequest& request, const std::vector<GridAxis>& axes) {
  SweepTable table;
  table.target = request.target;
  table.metric = request.metric;
  for (const GridAxis& a : axes) table.keys.push_back(a.key);
  return table;
}

void evaluate_sweep_points(const std::vector<DumpLayer>& dump, const SweepRequest& request,
                           const std::vector<MethodSpec>& specs, const std::vector<std::string>& canonical,
                           const std::function<void(std::size_t, std::vector<HeadResult>)>& sink) {
  if (specs.empty()) return;
  std::size_t heads = 0;
  for (const DumpLayer& l : dump) heads += l.heads.size();
  EvalOptions options;
  options.threads = resolve_threads(request.threads);
  options.methods_per_item = 8;
  options.progress = request.progress;
  if (request.started) request.started(specs.size(), heads, options.threads);
  std::vector<std::unique_ptr<Method>> built;
  std::vector<EvalMethod> methods;
  for (const MethodSpec& spec : specs) {
    built.push_back(request.build ? request.build(spec) : ref::reference_registry().create(spec));
    // Each point is labelled by its canonical spec, so an error names the point; its results carry the request's.
    methods.push_back({built.back().get(), canonical[methods.size()], ref::reference_registry().traits(spec)});
  }
  std::vector<HeadResult> all = evaluate_methods(dump, methods, options);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<HeadResult> mine(std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(i * heads)),
                                 std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>((i + 1) * heads)));
    for (HeadResult& r : mine) r.method = request.spec;
    sink(i, std::move(mine));
  }
}

std::string run_sweep(const SweepRequest& request) {
  const Metric metric = sweep_metric(request.target, request.metric);
  const SweepGrid grid = sweep_grid(request);
  SweepTable table = sweep_header(request, grid.axes);
  const std::vector<DumpLayer> dump =
      load_dump(request.tensors, DumpTarget::attention, SoftmaxReference::fp64, nullptr, false);
  std::vector<Summary> summaries(grid.specs.size());
  evaluate_sweep_points(dump, request, grid.specs, grid.canonical,
                        [&](std::size_t i, std::vector<HeadResult> r) { summaries[i] = summarise(r); });
  for (const DumpLayer& l : dump) table.heads += l.heads.size();
  for (std::size_t i = 0; i < grid.specs.size(); ++i)
    table.rows.push_back({grid.points[i], grid.canonical[i], summaries[i].mean[metric], summaries[i].worst[metric]});
  return render_sweep(table, request.format);
}

}  // namespace qattn::eval
