// Experiment long-context: the P error of every softmax model on synthetic rows from L = 128 to 16K. See README.md;
// `qattn reproduce long-context` runs it.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/error.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"

namespace qattn::experiments {
namespace {
namespace fs = std::filesystem;

// The real rows' spread: the standard deviation of every logits row of the dump (layer*_head*_logits.npy), and the
// number of files read.
std::pair<std::vector<double>, std::size_t> real_row_spreads(const std::string& tensors) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(tensors, ec))
    if (e.path().filename().string().ends_with("_logits.npy")) files.push_back(e.path());
  if (ec) throw InputError(tensors, "--tensors", ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(tensors, "files", "no layer{L}_head{H}_logits.npy to take the row spread from");
  std::vector<double> sigmas;
  for (const auto& f : files)
    for (const RowMatrixXd& m : split_batch(read_npy(f), f))
      for (Eigen::Index i = 0; i < m.rows(); ++i) {
        const double mean = m.row(i).mean();
        sigmas.push_back(std::sqrt((m.row(i).array() - mean).square().mean()));
      }
  return {sigmas, files.size()};
}

// `rows` rows of length L: logits_j = sigma z_j, z_j standard normal (Box-Muller on the caller's mt19937_64 stream,
// so every platform draws the same numbers), sigma resampled per row from `sigmas`. The mean is irrelevant to softmax.
RowMatrixXd synthetic_rows(int rows, int L, const std::vector<double>& sigmas, std::mt19937_64& g) {
  const auto uniform = [&] { return (static_cast<double>(g() >> 11) + 0.5) * 0x1p-53; };
  RowMatrixXd logits(rows, L);
  for (int i = 0; i < rows; ++i) {
    const double sigma = sigmas[static_cast<std::size_t>(uniform() * sigmas.size()) % sigmas.size()];
    for (int j = 0; j < L; j += 2) {
      const double r = std::sqrt(-2 * std::log(uniform())), a = 2 * M_PI * uniform();
      logits(i, j) = sigma * r * std::cos(a);
      if (j + 1 < L) logits(i, j + 1) = sigma * r * std::sin(a);
    }
  }
  return logits;
}

// One softmax model's results over the lengths: its relative L1 at each length it ran, and why it stopped, if it did.
struct ModelRun {
  std::vector<double> rel;
  std::vector<int> lengths;
  std::string refused;
};

// The closing line of one model: how its error grew, and where it was refused.
std::string growth_line(const std::string& spec, const ModelRun& m) {
  std::ostringstream r;
  bool monotone = true;
  for (std::size_t k = 1; k < m.rel.size(); ++k) monotone = monotone && m.rel[k] >= m.rel[k - 1];
  r << spec << ": ";
  if (m.rel.size() > 1)
    r << "rel L1 x" << fixed(m.rel.back() / m.rel.front(), 2) << " from L = " << m.lengths.front() << " to "
      << m.lengths.back() << (monotone ? ", growing at every step" : ", not monotone in L");
  if (!m.refused.empty()) r << (m.rel.size() > 1 ? "; " : "") << m.refused;
  r << "\n";
  return r.str();
}

}  // namespace

// long-context: softmax models on synthetic rows from L = 128 to 16K whose spread matches the real logits.
std::string run_long_context(const ExperimentContext& ctx) {
  const auto [sigmas, n_files] = real_row_spreads(ctx.tensors);
  std::vector<double> sorted = sigmas;
  std::sort(sorted.begin(), sorted.end());
  const auto pct = [&](double q) { return sorted[static_cast<std::size_t>(q * (sorted.size() - 1))]; };
  // The softmax models of the registry at their defaults and presets, each under its first name.
  const auto [names, canon] = method_rows([](const MethodEntry& e) { return e.kind == MethodKind::softmax_model; });
  std::vector<std::string> specs;
  for (const std::string& n : names) specs.push_back(n.substr(0, n.find(" = ")));
  const int rows = ctx.fast ? 8 : 32;
  const std::vector<int> lengths = ctx.fast ? std::vector<int>{128, 1024, 8192} : std::vector<int>{128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  const auto reference = ref::reference_registry().create("fp64");
  std::vector<std::unique_ptr<Method>> methods;
  for (const auto& spec : canon) methods.push_back(make_method(spec, ctx.engine));
  std::mt19937_64 g(20261122);
  Table t{{"L"}, {}};
  for (const auto& spec : specs) t.header.push_back(spec + " rel L1");
  Table csv{{"L", "method", "p_cossim", "p_rel_l1", "p_rmse", "p_max_abs"}, {}};
  std::vector<ModelRun> runs(specs.size());
  for (const int L : lengths) {
    const RowMatrixXd logits = synthetic_rows(rows, L, sigmas, g);
    const RowMatrixXd p_ref = reference->softmax_rows(logits);
    std::vector<std::string> row = {std::to_string(L)};
    for (std::size_t m = 0; m < specs.size(); ++m) {
      RowMatrixXd p;
      try {
        p = methods[m]->softmax_rows(logits);
      } catch (const InputError& e) {  // a model with no result for such rows (e.g. tflite-int8's output shift)
        row.push_back("refused");
        if (runs[m].refused.empty()) runs[m].refused = "refused from L = " + std::to_string(L) + ": " + e.what();
        continue;
      }
      const ErrorStats e = compare(std::span<const double>(p.data(), p.size()), std::span<const double>(p_ref.data(), p_ref.size()));
      runs[m].rel.push_back(e.rel_l1);
      runs[m].lengths.push_back(L);
      row.push_back(fmt_err(e.rel_l1));
      csv.rows.push_back({std::to_string(L), specs[m], fmt_sim(e.cossim), fmt_err(e.rel_l1), fmt_err(e.rmse), fmt_err(e.max_abs)});
    }
    t.rows.push_back(row);
  }
  const fs::path csv_path = ctx.out_dir / "long-context.csv";
  write_text(csv_path, csv.csv());
  const fs::path png = ctx.out_dir / "long-context.png";
  draw(ctx, {"lines", csv_path.string(), "-o", png.string(), "--x", "L", "--y", "p_rel_l1", "--series", "method",
             "--logx", "--logy", "--title", "P relative L1 vs L, synthetic rows with USE-Lite's spread"}, png);
  std::ostringstream r;
  r << "long-context: P error of each softmax model vs the fp64 softmax, " << rows << " synthetic rows per L\n"
    << "rows: logits = sigma z, z ~ N(0, 1) i.i.d., sigma drawn from the " << sigmas.size() << " real rows' standard "
    << "deviations (" << n_files << " logits files; sigma percentiles 10/50/90: " << fixed(pct(0.1), 3) << " / "
    << fixed(pct(0.5), 3) << " / " << fixed(pct(0.9), 3) << ")\n\n"
    << t.markdown() << "\n";
  for (std::size_t m = 0; m < specs.size(); ++m) r << growth_line(specs[m], runs[m]);
  return r.str();
}

}  // namespace qattn::experiments
