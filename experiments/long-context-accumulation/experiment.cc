// Experiment long-context-accumulation: a needle among 4K ... 128K diffuse keys through fa3-fp8's FP8 P V, one
// wgmma accumulator over the key loop against promotion to float32 every N keys (vLLM's fix of FA3-FP8's long-context
// accuracy). See README.md; `qattn reproduce long-context-accumulation` runs it.
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "experiment.h"
#include "qattn/parallel.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/registry.h"

namespace qattn::experiments {
namespace {

ref::FlashKernel fa3_promoted(int promote_keys) {
  const auto m = ref::reference_registry().create("fa3-fp8:out=fp32,kv-block=64");
  ref::FlashKernel k = *ref::kernel_of(*m);
  k.pv.promote_keys = promote_keys;
  return k;
}

}  // namespace

std::string run_long_context_accumulation(const ExperimentContext& ctx) {
  const std::vector<int> lengths = ctx.fast ? std::vector<int>{4096, 16384} : std::vector<int>{4096, 16384, 65536, 131072};
  const std::vector<int> intervals = {0, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  constexpr double kTolerance = 0.10;  // of the needle's weight
  const Eigen::Index d = 64, rows = 4;
  std::vector<double> err(lengths.size() * intervals.size()), weight(lengths.size());
  std::vector<RowMatrixXd> qs(lengths.size()), ks(lengths.size()), vs(lengths.size());
  for (std::size_t a = 0; a < lengths.size(); ++a) {
    NeedleHead h = needle_head(lengths[a], d, rows);
    qs[a] = std::move(h.q), ks[a] = std::move(h.k), vs[a] = std::move(h.v);
  }
  std::vector<RowMatrixXd> exact(lengths.size());
  parallel_for(lengths.size(), ctx.threads, [&](std::size_t a) {
    const AttentionResult e = ref::float_attention(qs[a], ks[a], vs[a], 1.0, ref::FloatPrecision::fp64);
    exact[a] = e.o;
    weight[a] = e.p(0, lengths[a] / 3);
  });
  parallel_for(err.size(), ctx.threads, [&](std::size_t i) {
    const std::size_t a = i / intervals.size();
    const RowMatrixXd o = ref::flash_attention(qs[a], ks[a], vs[a], 1.0, {}, fa3_promoted(intervals[i % intervals.size()])).o;
    err[i] = std::abs(o(0, 0) - exact[a](0, 0)) / weight[a];
  });
  std::ostringstream r;
  r << "long-context-accumulation: a needle among diffuse keys through fa3-fp8's P V, promotion to float32 every N "
       "keys (vLLM, \"The State of FP8 KV-Cache and Attention Quantization in vLLM\", 2026-04-22)\n\n";
  Table t{{"keys", "needle weight"}, {}};
  for (int iv : intervals) t.header.push_back(iv == 0 ? "none" : std::to_string(iv));
  t.header.push_back("largest N within " + fixed(100 * kTolerance, 0) + " %");
  for (std::size_t a = 0; a < lengths.size(); ++a) {
    std::vector<std::string> row{std::to_string(lengths[a]), fixed(weight[a], 4)};
    std::string best = "none meets it";
    for (std::size_t b = 0; b < intervals.size(); ++b) {
      row.push_back(fmt_err(err[a * intervals.size() + b]));
      if (err[a * intervals.size() + b] <= kTolerance && intervals[b] > 0)
        best = std::to_string(intervals[b]) + " keys";  // intervals ascend after "none": the last that meets it
    }
    if (err[a * intervals.size()] <= kTolerance) best = "none needed";
    row.push_back(best);
    t.rows.push_back(row);
  }
  r << "Error of O's needle channel (O_0 = 1 + w exactly) relative to the needle's weight w, fa3-fp8's parts with key "
       "blocks of 64 (last first) and P V on the H100 FP8 wgmma: one accumulator (none) or a fresh one promoted "
       "to float32 every N keys; 4 identical queries, d = 64, diffuse logits N(0, 1/4), the needle at L/3 with "
       "weight about 1/4:\n\n"
    << t.markdown() << "\n";
  const double none_long = err[(lengths.size() - 1) * intervals.size()];
  const double every64_long = err[(lengths.size() - 1) * intervals.size() + 1];
  r << "Verdicts:\n- One accumulator over " << lengths.back() << " keys: the needle's weight is off by "
    << fixed(100 * none_long, 1) << " %; promoted every 64 keys: " << fixed(100 * every64_long, 2) << " %.\n"
    << "- The largest N (the fewest promotions) within " << fixed(100 * kTolerance, 0) << " %:";
  for (std::size_t a = 0; a < lengths.size(); ++a) r << (a ? "," : "") << " " << t.rows[a].back() << " at " << lengths[a];
  r << ".\n";
  return r.str();
}

}  // namespace qattn::experiments
