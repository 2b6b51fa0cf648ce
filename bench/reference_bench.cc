// Throughput of the reference paths: every registered method's row softmax and attention at L in {128, 1024, 4096},
// d = 128, one thread, plus the exact 50-digit softmax. A program, not a test: run it with repetitions and read the
// medians, e.g.
//   build-release/bench/qattn_bench_reference --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// The context block printed first gives the CPU, its caches and the thread count; the benchmark names give L and d.
#include <benchmark/benchmark.h>

#include <random>

#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"

namespace {

qattn::RowMatrixXd random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double sigma) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0.0, sigma);
  qattn::RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = n(g);
  return m;
}

void softmax_rows(benchmark::State& state, std::string spec) {
  const auto L = state.range(0);
  const auto method = qattn::ref::reference_registry().create(spec);
  const qattn::RowMatrixXd logits = random_matrix(16, L, 1, 4.0);
  for (auto _ : state) benchmark::DoNotOptimize(method->softmax_rows(logits));
  state.SetItemsProcessed(state.iterations() * logits.size());
  state.counters["L"] = static_cast<double>(L);
}

void attention(benchmark::State& state, std::string spec) {
  const auto L = state.range(0), d = state.range(1);
  const auto method = qattn::ref::reference_registry().create(spec);
  const qattn::RowMatrixXd q = random_matrix(L, d, 2, 1.0), k = random_matrix(L, d, 3, 1.0), v = random_matrix(L, d, 4, 1.0);
  for (auto _ : state) benchmark::DoNotOptimize(method->attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(d)), {}));
  state.counters["L"] = static_cast<double>(L);
  state.counters["d"] = static_cast<double>(d);
  state.counters["threads"] = 1;
}

void softmax_exact(benchmark::State& state) {
  const auto L = state.range(0);
  const qattn::RowMatrixXd row = random_matrix(1, L, 5, 4.0);
  for (auto _ : state)
    benchmark::DoNotOptimize(qattn::ref::softmax_exact(std::span<const double>(row.data(), static_cast<std::size_t>(L))));
  state.SetItemsProcessed(state.iterations() * L);
}

}  // namespace

int main(int argc, char** argv) {
  for (const auto& e : qattn::ref::reference_registry().entries()) {
    benchmark::RegisterBenchmark(("softmax_rows/" + e.name).c_str(), softmax_rows, e.name)->Arg(128)->Arg(1024)->Arg(4096);
    benchmark::RegisterBenchmark(("attention/" + e.name).c_str(), attention, e.name)
        ->Args({128, 128})->Args({1024, 128})->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("softmax_exact/cpp_bin_float_50", softmax_exact)->Arg(128)->Arg(1024);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
