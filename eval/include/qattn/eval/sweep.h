// One method over a grid of its parameters (`qattn sweep`, docs/scale-out.md for its shards): every grid point
// evaluated on every head of a dump and summarised (mean and worst over heads) into the table render_sweep writes.
// The points run as one streamed evaluation (docs/streaming.md); the rows come out in grid order, so the table does
// not depend on the thread count. The CLI parses its options into a SweepRequest and calls run_sweep, or sweep_shard
// (qattn/eval/shard.h) for one shard's part file.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qattn/eval/evaluate.h"
#include "qattn/eval/grid.h"
#include "qattn/eval/report.h"
#include "qattn/method.h"

namespace qattn::eval {

// The largest grid a sweep takes unless told otherwise, and the most it can be told: about 3 GB of spec strings.
inline constexpr long long kDefaultMaxSweepPoints = 100000;
inline constexpr long long kMaxSweepPointsLimit = 10000000;

struct SweepRequest {
  std::string spec;               // the method the grid is applied to ("index@paper")
  std::vector<std::string> grids; // the axes, "KEY=..." as parse_grid_axis reads them; the last one varies fastest
  std::string tensors;            // the dump: a directory, or one .npz / .safetensors file
  std::string target = "O";       // O | P
  std::string metric = "cossim";  // as sweep_metric reads it
  std::string format = "csv";     // csv | md
  std::string order = "point-major";  // sweep_shard: how the (point, head) units are numbered (or "head-major")
  int threads = 0;                    // workers over (head, block) items; 0: every core (resolve_threads)
  long long max_points = kDefaultMaxSweepPoints;
  // Builds a point's method (the engine's make_method); called once per point, on the calling thread.
  std::function<std::unique_ptr<Method>(const MethodSpec&)> build;
  // Called once before the points run, with the points, the heads and the threads resolved; then as EvalOptions'.
  std::function<void(std::size_t points, std::size_t heads, int threads)> started;
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// The axes of `grids`: parse_grid_axis' SpecError for a bad one, SpecError "key 'K' given twice", or "the grid has
// more than N points ..." when the product of the axes' sizes passes max_points, checked before any point is built
// (three axes of 100000 values would otherwise fill memory with spec strings).
std::vector<GridAxis> sweep_axes(const std::vector<std::string>& grids, long long max_points);

// The grid's points (the axes' values in order, last axis fastest) with each point's spec and canonical spec, every
// point checked by the registry before anything runs: sweep_axes' SpecError, or the registry's for a bad value.
struct SweepGrid {
  std::vector<GridAxis> axes;
  std::vector<std::vector<std::string>> points;
  std::vector<MethodSpec> specs;
  std::vector<std::string> canonical;  // each point's spec, every parameter spelled out: its row's method
};
SweepGrid sweep_grid(const SweepRequest& request);

// The SweepTable of `request` without its rows: the axes' keys, target and metric (the header a part carries).
SweepTable sweep_header(const SweepRequest& request, const std::vector<GridAxis>& axes);

// Every point of `grid.specs` evaluated over `dump` as one streamed evaluation: each point is a method of
// evaluate_methods, eight points per (head, block) item (they share the block's reference rows; a head holds the
// prepared calls of eight points at a time). sink(i, per-head results of point i, labelled request.spec) is called
// once per point, in point order.
void evaluate_sweep_points(const std::vector<DumpLayer>& dump, const SweepRequest& request,
                           const std::vector<MethodSpec>& specs, const std::vector<std::string>& canonical,
                           const std::function<void(std::size_t, std::vector<HeadResult>)>& sink);

// The whole sweep: the table render_sweep writes in request.format. InputError / SpecError as sweep_grid, load_dump
// and the points' methods raise them.
std::string run_sweep(const SweepRequest& request);

}  // namespace qattn::eval
