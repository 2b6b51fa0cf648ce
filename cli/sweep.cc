// qattn sweep: one method over a grid of its parameters (qattn/eval/sweep.h, which runs it), every grid point
// evaluated on every head of a dump and aggregated (mean and worst over heads) into a CSV that `qattn plot` reads.
// This file parses the options, says on stderr how the run goes, and writes the table or the shard's part.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>

#include "commands.h"
#include "data_paths.h"
#include "engine_setting.h"
#include "evaluate.h"
#include "qattn/error.h"
#include "qattn/eval/sweep.h"
#include "shard.h"

namespace qattn::cli {
namespace {

struct SweepOptions {
  std::string spec, tensors = default_tensors(), metric = "cossim", target = "O", out, format = "csv";
  std::vector<std::string> grids;
  int threads = 0;
  long long max_points = eval::kDefaultMaxSweepPoints;
  std::string shard;
  std::string order = "point-major";  // how --shard numbers the (grid point, head) units
  EngineSetting engine;
};

// The header line and the progress lines on stderr: the header for a run of 1000 head evaluations or more, or on a
// terminal; progress every 2 s after the first 2.
void report_progress(eval::SweepRequest& request) {
  struct Clock {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::mutex lock;
    double last = 0;
  };
  auto clock = std::make_shared<Clock>();
  request.started = [clock](std::size_t points, std::size_t heads, int threads) {
    clock->start = std::chrono::steady_clock::now();
    if (points * heads >= 1000 || isatty(STDERR_FILENO))
      std::cerr << "qattn sweep: " << points << " points x " << heads << " heads = " << points * heads
                << " head evaluations on " << threads << " thread" << (threads == 1 ? "" : "s") << "\n";
  };
  request.progress = [clock](std::size_t d, std::size_t total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock->start).count();
    std::lock_guard<std::mutex> hold(clock->lock);
    if (elapsed - clock->last > 2.0 || (d == total && elapsed > 2.0)) {
      clock->last = elapsed;
      const double eta = elapsed / static_cast<double>(d) * static_cast<double>(total - d);
      std::cerr << "qattn sweep: [" << d << "/" << total << " blocks and calls] " << static_cast<int>(elapsed) << " s"
                << (d < total ? ", about " + std::to_string(static_cast<int>(eta)) + " s left" : std::string()) << "\n";
    }
  };
}

void run_sweep(const SweepOptions& o) {
  require_threads(o.threads);
  require_range("--max-points", o.max_points, 1, eval::kMaxSweepPointsLimit);
  try {
    eval::sweep_axes(o.grids, o.max_points);
  } catch (const SpecError& e) {  // the library's reason, under the option's name
    throw CLI::ValidationError("--grid", e.what());
  }
  try {
    eval::sweep_metric(o.target, o.metric);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--metric", e.what());
  }
  require_distinct_files({{"--tensors", o.tensors}}, {{"--out", o.out}});
  const std::optional<Shard> shard = o.shard.empty() ? std::nullopt : std::optional<Shard>(shard_option(o.shard));
  eval::SweepRequest request;
  request.spec = o.spec;
  request.grids = o.grids;
  request.tensors = o.tensors;
  request.target = o.target;
  request.metric = o.metric;
  request.format = o.format;
  request.order = o.order;
  request.threads = o.threads;
  request.max_points = o.max_points;
  request.build = [&o](const MethodSpec& spec) { return make_method(spec, o.engine); };
  report_progress(request);
  emit(shard ? eval::sweep_shard(request, *shard) : eval::run_sweep(request), o.out);
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
                      std::to_string(eval::kMaxSweepPointsLimit) + ")")
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
