// Experiment fp8-accumulation-length: the error of FP8 attention's P·V as the key count grows, with one tensor-core
// accumulator over the whole key loop against a fresh one per key block promoted to float32 (two-level). See
// README.md; `qattn reproduce fp8-accumulation-length` runs it.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/parallel.h"
#include "qattn/reference/random.h"
#include "qattn/reference/registry.h"

namespace qattn::experiments {
namespace {

// One head: 64 queries, L keys, d = 128; Q and K ~ N(0, 1), V ~ 1 + N(0, 1/4) (a positive mean, as the channel bias
// of real V: every product adds the same sign, so truncation toward zero accumulates). Seeded per L.
std::vector<DumpLayer> long_head(int L, std::uint64_t seed) {
  constexpr int kQueries = 64, kDim = 128;
  ref::Normals n(seed);
  RowMatrixXd q(kQueries, kDim), k(L, kDim), v(L, kDim);
  for (Eigen::Index i = 0; i < q.size(); ++i) q.data()[i] = n();
  for (Eigen::Index i = 0; i < k.size(); ++i) k.data()[i] = n();
  for (Eigen::Index i = 0; i < v.size(); ++i) v.data()[i] = 1.0 + 0.5 * n();
  DumpLayer l;
  l.heads.push_back(0);
  l.q_paths.push_back("synthetic L = " + std::to_string(L));
  l.q.push_back({q});
  l.k.push_back({k});
  l.v.push_back({v});
  return {l};  // the fp64 reference is computed by the streamed evaluation
}

}  // namespace

std::string run_fp8_accumulation_length(const ExperimentContext& ctx) {
  const std::vector<int> lengths = ctx.fast ? std::vector<int>{1024, 4096} : std::vector<int>{1024, 4096, 16384, 65536, 131072};
  const std::vector<std::pair<std::string, std::string>> accs = {
      {"fp32", "sage2@paper-8b:acc=fp32"},
      {"two-level (wgmma per 128 keys)", "sage2@paper-8b:acc=wgmma"},
      {"single (one wgmma accumulator)", "sage2@paper-8b:acc=wgmma-single"},
  };
  std::vector<Summary> results(lengths.size() * accs.size());
  std::vector<std::unique_ptr<Method>> built;
  std::vector<EvalMethod> methods;
  for (const auto& a : accs) {
    built.push_back(make_method(a.second, ctx.engine));
    methods.push_back({built.back().get(), a.second, ref::reference_registry().traits(parse_method_spec(a.second))});
  }
  // One length at a time (its K and V are the largest tensors), through the streamed evaluation: the three
  // accumulators share each block's fp64 reference rows (sage2 streams: Method::prepare).
  EvalOptions options;
  options.threads = ctx.threads;
  for (std::size_t li = 0; li < lengths.size(); ++li) {
    const std::vector<DumpLayer> dump = long_head(lengths[li], 1000 + static_cast<std::uint64_t>(lengths[li]));
    const std::vector<HeadResult> all = evaluate_methods(dump, methods, options);
    for (std::size_t a = 0; a < accs.size(); ++a) results[li * accs.size() + a] = summarise({all[a]});
  }
  std::ostringstream r;
  r << "fp8-accumulation-length: O error of FP8 attention (sage2@paper-8b: INT8 Q/K, E4M3 P~ and V) vs the fp64 reference "
       "as the key count L grows, with the H100's FP8 wgmma accumulator used once per 128-key block (two-level, "
       "SageAttention2's Hopper kernel) or once over the whole key loop (single)\n"
    << "synthetic head: 64 queries, L keys, d = 128, Q and K ~ N(0, 1), V ~ 1 + N(0, 1/4), seed 1000 + L\n\n";
  Table t{{"L"}, {}};
  for (const auto& a : accs) t.header.push_back(a.first + " O rel L1");
  t.header.push_back("single / two-level");
  std::ofstream csv(ctx.out_dir / "fp8-accumulation-length.csv");
  csv << "L,fp32,two_level,single\n";
  for (std::size_t li = 0; li < lengths.size(); ++li) {
    std::vector<std::string> row{std::to_string(lengths[li])};
    csv << lengths[li];
    for (std::size_t a = 0; a < accs.size(); ++a) {
      row.push_back(fmt_err(results[li * accs.size() + a].mean.o_rel_l1));
      csv << "," << fmt_err(results[li * accs.size() + a].mean.o_rel_l1);
    }
    csv << "\n";
    row.push_back(fixed(results[li * accs.size() + 2].mean.o_rel_l1 / results[li * accs.size() + 1].mean.o_rel_l1, 1) + " x");
    t.rows.push_back(row);
  }
  r << t.markdown() << "\n";
  const double first = results[2].mean.o_rel_l1, last = results[(lengths.size() - 1) * accs.size() + 2].mean.o_rel_l1;
  const double first2 = results[1].mean.o_rel_l1, last2 = results[(lengths.size() - 1) * accs.size() + 1].mean.o_rel_l1;
  r << "single accumulator: rel L1 grows " << fixed(last / first, 1) << " x from L = " << lengths.front() << " to "
    << lengths.back() << "; two-level: " << fixed(last2 / first2, 2) << " x\n"
    << "the CSV is fp8-accumulation-length.csv in the output directory\n";
  return r.str();
}

}  // namespace qattn::experiments
