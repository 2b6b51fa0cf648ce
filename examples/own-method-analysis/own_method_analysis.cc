// A researcher's new softmax variant, analysed with qattn's evaluation layer beside the registry's methods.
//
// TopKSoftmax keeps the k largest logits of each row and renormalises over them (a sparse-attention softmax). It is
// a qattn::Method like the built-in ones, so qattn::eval::evaluate_methods runs it over a dump next to fp32 and
// index@paper, against the same fp64 reference, with the same metrics, threads and fixed summation order.
//
//   own_method_analysis DUMP_DIR
//
// prints one line per method (mean over heads of O CosSim, P CosSim and the KL of P, docs/metrics.md) and exits 0
// only if the checks at the end hold: k = L_k is the exact softmax to 1e-12, and the error grows as k shrinks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "qattn/eval/evaluate.h"
#include "qattn/reference/registry.h"

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

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DUMP_DIR (layer{L}_head{H}_{q,k,v}.npy)\n", argv[0]);
    return 2;
  }
  try {
    // The dump without a whole-head reference: evaluate_methods computes it block by block.
    const std::vector<qattn::eval::DumpLayer> dump =
        qattn::eval::load_dump(argv[1], qattn::eval::DumpTarget::attention, qattn::eval::SoftmaxReference::fp64,
                               nullptr, false);
    const int lk = static_cast<int>(dump.front().k.front().front().rows());
    const qattn::Registry& registry = qattn::ref::reference_registry();
    std::vector<std::unique_ptr<qattn::Method>> own;
    std::vector<qattn::eval::EvalMethod> methods;
    for (const std::string spec : {"fp32", "index@paper"}) {
      own.push_back(registry.create(spec));
      methods.push_back({own.back().get(), spec, registry.traits(qattn::parse_method_spec(spec))});
    }
    // The user's methods: MethodTraits{} (nothing declared) runs them on whole calls, compared block by block.
    const std::vector<int> ks = {lk, 32, 8, 2};
    for (const int k : ks) {
      own.push_back(std::make_unique<TopKSoftmax>(k));
      methods.push_back({own.back().get(), "topk:k=" + std::to_string(k), qattn::MethodTraits{}});
    }
    qattn::eval::EvalOptions options;
    options.threads = 0;  // every core
    const std::vector<qattn::eval::HeadResult> results = qattn::eval::evaluate_methods(dump, methods, options);
    std::printf("%-16s %14s %14s %12s\n", "method", "O CosSim", "P CosSim", "P KL");
    std::vector<qattn::eval::Summary> summaries;
    const std::size_t heads = results.size() / methods.size();
    for (std::size_t m = 0; m < methods.size(); ++m) {
      const std::vector<qattn::eval::HeadResult> mine(results.begin() + static_cast<std::ptrdiff_t>(m * heads),
                                                      results.begin() + static_cast<std::ptrdiff_t>((m + 1) * heads));
      summaries.push_back(qattn::eval::summarise(mine));
      const qattn::eval::Metrics& mean = summaries.back().mean;
      std::printf("%-16s %14.10f %14.10f %12.3e\n", methods[m].label.c_str(), mean.o_cossim, mean.p_cossim, mean.p_kl);
    }
    // The checks: top-k with k = L_k keeps every key (the exact softmax up to rounding); fewer keys lose more.
    const std::size_t first_topk = 2;
    bool ok = std::abs(1 - summaries[first_topk].mean.o_cossim) < 1e-12 && summaries[first_topk].mean.p_kl < 1e-12;
    for (std::size_t i = first_topk + 1; i < summaries.size(); ++i)
      ok = ok && summaries[i].mean.p_kl > summaries[i - 1].mean.p_kl;
    std::printf(ok ? "ok: top-k at k = L_k is the exact softmax, and its KL grows as k shrinks\n"
                   : "FAILED: the top-k checks do not hold\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "own_method_analysis: %s\n", e.what());
    return 3;
  }
}
