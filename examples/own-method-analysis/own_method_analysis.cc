// A researcher's new softmax variant, analysed with qattn's evaluation layer beside the registry's methods.
//
// TopKSoftmax keeps the k largest logits of each row and renormalises over them (a sparse-attention softmax). It is
// a qattn::Method like the built-in ones, so the evaluation layer runs it over a dump next to fp32 and index@paper,
// against the same fp64 reference, with the same metrics, threads and fixed summation order, and writes it into the
// same report, shard parts and sweep table as `qattn analyze`, `qattn analyze --shard` and `qattn sweep` write:
//
//   own_method_analysis DUMP_DIR [OUT_DIR]
//
// prints one line per method (mean over heads of O CosSim, P CosSim and the KL of P, docs/metrics.md) and exits 0
// only if the checks at the end hold: k = L_k is the exact softmax to 1e-12, and the error grows as k shrinks. With
// OUT_DIR it also writes there
//   report.md, report.csv   the analysis report (eval::render_report), as `qattn analyze` writes it;
//   part-K-of-3.json        the same analysis in three shards (eval::analyze_shard): `qattn merge part-*.json`
//                           writes report.md again, byte for byte;
//   topk-sweep.csv          top-k's mean and worst O CosSim over k (eval::render_sweep), as `qattn sweep` writes
//                           one: `qattn plot lines topk-sweep.csv -o topk.png --x k` draws it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>

#include "qattn/engine.h"
#include "qattn/eval/analysis.h"
#include "qattn/eval/report.h"
#include "qattn/eval/shard.h"

namespace {

class TopKSoftmax final : public qattn::Method {
 public:
  explicit TopKSoftmax(int k) : k_(k) {}

 protected:
  // Per row: the k largest finite logits (ties by position) keep e^(x - max), the rest 0; then divide by the sum.
  qattn::RowMatrixXd softmax_rows_impl(const qattn::MatrixView& logits) const override {
    qattn::RowMatrixXd p = qattn::RowMatrixXd::Zero(logits.rows(), logits.cols());
    std::vector<Eigen::Index> order(static_cast<std::size_t>(logits.cols()));
    for (Eigen::Index i = 0; i < logits.rows(); ++i) {
      for (Eigen::Index j = 0; j < logits.cols(); ++j) order[static_cast<std::size_t>(j)] = j;
      const auto kept = order.begin() + std::min<std::ptrdiff_t>(k_, logits.cols());
      std::partial_sort(order.begin(), kept, order.end(), [&](Eigen::Index a, Eigen::Index b) {
        return logits(i, a) > logits(i, b) || (logits(i, a) == logits(i, b) && a < b);
      });
      const double max = logits(i, order.front());
      if (std::isinf(max)) continue;  // every key masked: P = 0
      double sum = 0;
      for (auto it = order.begin(); it != kept; ++it)
        if (!std::isinf(logits(i, *it))) sum += p(i, *it) = std::exp(logits(i, *it) - max);
      p.row(i) /= sum;
    }
    return p;
  }

  // Inside attention: float64 logits scale q k^T with the mask, this softmax, float64 P V.
  qattn::AttentionResult attention_impl(const qattn::MatrixView& q, const qattn::MatrixView& k,
                                        const qattn::MatrixView& v, double scale,
                                        const qattn::AttentionMask& mask) const override {
    qattn::RowMatrixXd s = (q * k.transpose()) * scale;
    mask.apply_to_logits(s);
    qattn::AttentionResult r;
    r.p = softmax_rows(s);
    r.o = r.p * v;
    return r;
  }

 private:
  int k_;
};

}  // namespace

// Writes text to path; false (with a message) if it cannot.
bool write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) {
    std::fprintf(stderr, "own_method_analysis: cannot write %s\n", path.string().c_str());
    return false;
  }
  return true;
}

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s DUMP_DIR (layer{L}_head{H}_{q,k,v}.npy) [OUT_DIR]\n", argv[0]);
    return 2;
  }
  try {
    namespace eval = qattn::eval;
    const std::filesystem::path source = argv[1];
    // The dump without a whole-head reference: the evaluation computes it block by block.
    const std::vector<eval::DumpLayer> dump =
        eval::load_dump(source, eval::DumpTarget::attention, eval::SoftmaxReference::fp64, nullptr, false);
    const int lk = static_cast<int>(dump.front().k.front().front().rows());
    std::size_t n_heads = 0;
    for (const eval::DumpLayer& l : dump) n_heads += l.heads.size();

    // The plan: two of the registry's methods (each spec parsed and resolved once, on the default engine), then the
    // user's, each with the label its rows carry. MethodTraits{} (nothing declared) runs them on whole calls.
    eval::AnalysisPlan analysis =
        eval::plan_analysis({"fp32", "index@paper"}, "", "", false, eval::SoftmaxReference::fp64, false,
                            [](const qattn::MethodSpec& spec) { return qattn::build_method(spec).method; });
    const std::vector<int> ks = {lk, 32, 8, 2};
    for (const int k : ks) analysis.add_own("topk:k=" + std::to_string(k), std::make_unique<TopKSoftmax>(k));
    eval::EvalOptions options;
    options.threads = 0;  // every core
    const std::vector<eval::HeadResult> results = eval::evaluate_plan(dump, analysis, options);

    std::printf("%-16s %14s %14s %12s\n", "method", "O CosSim", "P CosSim", "P KL");
    std::vector<eval::Summary> summaries;
    for (const eval::PlannedMethod& m : analysis.methods) {
      std::vector<eval::HeadResult> mine;
      for (const eval::HeadResult& r : results)
        if (r.method == m.label) mine.push_back(r);
      summaries.push_back(eval::summarise(mine));
      const eval::Metrics& mean = summaries.back().mean;
      std::printf("%-16s %14.10f %14.10f %12.3e\n", m.label.c_str(), mean.o_cossim, mean.p_cossim, mean.p_kl);
    }
    // The checks: top-k with k = L_k keeps every key (the exact softmax up to rounding); fewer keys lose more.
    const std::size_t first_topk = 2;
    bool ok = std::abs(1 - summaries[first_topk].mean.o_cossim) < 1e-12 && summaries[first_topk].mean.p_kl < 1e-12;
    for (std::size_t i = first_topk + 1; i < summaries.size(); ++i)
      ok = ok && summaries[i].mean.p_kl > summaries[i - 1].mean.p_kl;
    std::printf(ok ? "ok: top-k at k = L_k is the exact softmax, and its KL grows as k shrinks\n"
                   : "FAILED: the top-k checks do not hold\n");
    if (!ok) return 1;
    if (argc == 2) return 0;

    const std::filesystem::path out = argv[2];
    std::filesystem::create_directories(out);
    // The report `qattn analyze --method fp32 --method index@paper` writes, with the top-k rows after them.
    const eval::ReportView view = eval::report_view(analysis, source.string(), n_heads);
    if (!write_text(out / "report.md", eval::render_report(view, results, "md")) ||
        !write_text(out / "report.csv", eval::render_report(view, results, "csv")))
      return 3;
    // Three shards, as three jobs of a cluster would run them (each reads only its own heads).
    for (std::size_t k = 0; k < 3; ++k)
      if (!write_text(out / ("part-" + std::to_string(k) + "-of-3.json"),
                      eval::analyze_shard(source, analysis, {k, 3}, options, "md")))
        return 3;
    // A sweep of k: one grid axis, top-k's mean and worst O CosSim over the heads at each point.
    eval::SweepTable sweep;
    sweep.keys = {"k"};
    sweep.heads = n_heads;
    const eval::Metric metric = eval::sweep_metric(sweep.target, sweep.metric);
    for (std::size_t i = 0; i < ks.size(); ++i) {
      const eval::Summary& s = summaries[first_topk + i];
      sweep.rows.push_back({{std::to_string(ks[i])}, analysis.methods[first_topk + i].label, s.mean[metric],
                            s.worst[metric]});
    }
    if (!write_text(out / "topk-sweep.csv", eval::render_sweep(sweep, "csv"))) return 3;
    std::printf("wrote report.md, report.csv, part-{0,1,2}-of-3.json and topk-sweep.csv to %s\n", out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "own_method_analysis: %s\n", e.what());
    return 3;
  }
}
