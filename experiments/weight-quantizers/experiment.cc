// Experiment weight-quantizers: RTN, GPTQ and AWQ on the real Q/K/V projections. See README.md; `qattn reproduce
// weight-quantizers` runs it.
#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/error.h"
#include "qattn/reference/weight_quant.h"

namespace qattn::experiments {
namespace fs = std::filesystem;

// weight-quantizers: RTN, GPTQ and AWQ on the real Q/K/V projection weights, measured on held-out windows by the
// layer-output error and by the attention error the quantized projections cause.
std::string run_weight_quantizers(const ExperimentContext& ctx) {
  const fs::path dir = ctx.tensors;
  const std::vector<DumpLayer> dump = load_dump(dir);
  std::ostringstream r;
  Table t{{"layer", "bits", "quantizer", "W_q err", "W_k err", "W_v err", "fp32 O CosSim", "intattention O CosSim"}, {}};
  std::vector<std::string> failures;
  int layers_done = 0, comparisons = 0;
  for (const DumpLayer& dl : dump) {
    const std::optional<LayerProjections> proj = load_projections(dir, dl.layer);
    if (!proj) continue;
    const std::int64_t windows = proj->windows, T = proj->tokens;
    const Eigen::Index dm = proj->x.cols();
    const auto& w = proj->w;
    const Eigen::Index heads = static_cast<Eigen::Index>(dl.heads.size()), hd = w[0].cols() / heads;
    // Calibration on the first half of the windows, evaluation on the rest (in-sample when there is one window).
    const std::int64_t n_cal = std::max<std::int64_t>(1, windows / 2);
    const RowMatrixXd x_cal = proj->x.topRows(n_cal * T);
    const RowMatrixXd x_eval = windows > 1 ? RowMatrixXd(proj->x.bottomRows((windows - n_cal) * T)) : proj->x;
    // The reference: fp64 attention of the unquantized projections, per evaluation window and head.
    DumpLayer exact = project_layer(dl, x_eval, T, w, proj->b);
    compute_reference(exact);
    const auto fp32 = make_method("fp32", ctx.engine), intatt = make_method("intattention@upstream-neon", ctx.engine);
    auto attention_row = [&](const std::string& bits, const std::string& name, const std::array<RowMatrixXd, 3>& wq,
                             const std::array<double, 3>& err) {
      DumpLayer l = project_layer(dl, x_eval, T, wq, proj->b);
      l.reference = exact.reference;
      const std::vector<DumpLayer> one = {l};
      t.rows.push_back({std::to_string(dl.layer), bits, name, fmt_err(err[0]), fmt_err(err[1]), fmt_err(err[2]),
                        fmt_sim(summarise(evaluate(one, *fp32, "fp32")).mean.o_cossim),
                        fmt_sim(summarise(evaluate(one, *intatt, "intattention")).mean.o_cossim)});
    };
    attention_row("fp32", "none", w, {0, 0, 0});
    for (int b : {4, 3}) {
      const char* names[3] = {"rtn", "gptq", "awq"};
      std::array<std::array<RowMatrixXd, 3>, 3> wq;  // [quantizer][projection]
      std::array<std::array<double, 3>, 3> err{};
      parallel_for(9, ctx.threads, [&](std::size_t i) {
        const std::size_t qi = i / 3, p = i % 3;
        const auto quantizer = ref::weight_registry().create(std::string(names[qi]) + ":bits=" + std::to_string(b) + ",group=128");
        wq[qi][p] = quantizer->apply(w[p], x_cal);
        err[qi][p] = ref::relative_output_error(x_eval, w[p], wq[qi][p]);
      });
      for (int qi = 0; qi < 3; ++qi) attention_row(std::to_string(b), names[qi], wq[qi], err[qi]);
      for (int qi = 1; qi < 3; ++qi)
        for (int p = 0; p < 3; ++p) {
          ++comparisons;
          if (!(err[qi][p] < err[0][p]))
            failures.push_back(std::string(names[qi]) + " on layer " + std::to_string(dl.layer) + " W_" + "qkv"[p] +
                               " at " + std::to_string(b) + " bits: " + fmt_err(err[qi][p]) + " vs RTN " + fmt_err(err[0][p]));
        }
    }
    ++layers_done;
    r << "layer " << dl.layer << ": X " << windows << " windows x " << T << " tokens x d_model " << dm << "; calibration "
      << (windows > 1 ? "windows 0-" + std::to_string(n_cal - 1) + ", evaluation windows " + std::to_string(n_cal) +
                            "-" + std::to_string(windows - 1)
                      : std::string("and evaluation on the one window (in-sample)"))
      << "; " << heads << " heads of d = " << hd << "\n";
  }
  if (layers_done == 0)
    throw InputError(dir.string(), "files", "no layer{L}_attn_input.npy with layer{L}_w{q,k,v}.npy and b{q,k,v}.npy");
  std::ostringstream head;
  head << "weight-quantizers: RTN, GPTQ and AWQ (asymmetric, group 128 along the input, per output column) on the "
          "Q/K/V projections; err = |X W^ - X W|_F / |X W|_F on the evaluation windows; attention O CosSim vs fp64 "
          "attention of the unquantized projections (mean over heads)\n";
  r << "\n" << t.markdown() << "\n";
  r << "verdict: GPTQ and AWQ beat RTN on the layer-output error in " << comparisons - failures.size() << " of "
    << comparisons << " (layer, projection, bits) cases: " << (failures.empty() ? "HOLDS" : "DOES NOT HOLD everywhere")
    << "\n";
  for (const auto& f : failures) r << "  not better: " << f << "\n";
  return head.str() + r.str();
}

}  // namespace qattn::experiments
