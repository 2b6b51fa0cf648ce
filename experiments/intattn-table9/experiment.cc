// Experiment intattn-table9: IntAttention Table 9's "no NaN/Inf events", as a stress test of every registered method
// and preset on extreme inputs. See README.md; `qattn reproduce intattn-table9` runs it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/error.h"
#include "qattn/parallel.h"
#include "qattn/reference/random.h"
#include "qattn/reference/registry.h"

namespace qattn::experiments {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The methods the claim is about: IndexSoftmax alone and inside the IntAttention pipeline (every preset of each).
const std::vector<std::string> kClaimMethods = {"index", "intattention"};

// A family of extreme inputs: logits rows for the softmax forms, Q/K/V and a mask for attention.
struct Family {
  std::string name, what;
  RowMatrixXd logits;
  RowMatrixXd q, k, v;
  AttentionMask mask;
};

std::vector<Family> families(int row_length, int L) {
  ref::Normals n(9);
  const int d = 64;
  auto normal = [&](int rows, int cols, double sigma) {
    RowMatrixXd m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = sigma * n();
    return m;
  };
  std::vector<Family> f(5);
  // Huge spread: logits N(0, 1e4^2); Q, K with entries N(0, 300^2), so q.k / 8 has sigma ~ 1e5 (beyond fp16).
  f[0] = {"spread", "logits N(0, 1e4^2); Q, K N(0, 300^2) (logits ~1e5)", normal(4, row_length, 1e4),
          normal(L, d, 300), normal(L, d, 300), normal(L, d, 1)};
  // Ties: every logit equal within a row (rows at 0, 1e4, -1e4, 1e30); Q = 1, K = 1 (every key ties).
  f[1] = {"ties", "all-equal rows at 0, +-1e4, 1e30; every key identical", RowMatrixXd::Zero(4, row_length),
          RowMatrixXd::Ones(L, d), RowMatrixXd::Ones(L, d), normal(L, d, 1)};
  f[1].logits.row(1).setConstant(1e4);
  f[1].logits.row(2).setConstant(-1e4);
  f[1].logits.row(3).setConstant(1e30);
  // -inf masks: half of each row masked, one fully masked row; causal + padding with fully masked query rows.
  f[2] = {"masks", "half the keys -inf, a fully masked row; causal + padding, fully masked queries", normal(4, row_length, 3),
          normal(L, d, 1), normal(L, d, 1), normal(L, d, 1)};
  for (Eigen::Index j = 0; j < row_length; j += 2) f[2].logits.col(j).setConstant(-kInf);
  f[2].logits.row(3).setConstant(-kInf);
  f[2].mask.causal = true;
  f[2].mask.valid = RowMatrixXb::Constant(L, L, true);
  f[2].mask.valid.leftCols(L / 2).setConstant(false);  // with causal, the first L/2 query rows see nothing
  // One-hot: one logit 1e4 above the rest (rows also at 80, the fp32 exp range edge); one key aligned with each query.
  f[3] = {"one-hot", "one logit 1e4 (or 80) above zeros; one key 100 q per query", RowMatrixXd::Zero(4, row_length),
          normal(L, d, 1), normal(L, d, 1), normal(L, d, 1)};
  for (Eigen::Index i = 0; i < 4; ++i) f[3].logits(i, (i * 977) % row_length) = i % 2 ? 80.0 : 1e4;
  f[3].k.topRows(1) = 100 * f[3].q.colwise().sum().normalized();
  // Extreme magnitudes: logits +-1e300 (finite), Q, K of 1e-30 (scales near underflow) and 1e150.
  f[4] = {"extreme", "logits +-1e300; Q 1e-30, K 1e150 (finite products)", normal(4, row_length, 1),
          normal(L, d, 1e-30), normal(L, d, 1e150), normal(L, d, 1)};
  for (Eigen::Index j = 0; j < row_length; ++j) f[4].logits(0, j) = j % 2 ? 1e300 : -1e300;
  f[4].logits.row(1) *= 1e300;
  return f;
}

struct Outcome {
  bool refused = false;
  std::string why;        // the refusal's field and reason
  std::size_t events = 0; // non-finite entries in P or O
  double worst_l1 = 0;    // worst row's sum |P - P_fp64| (softmax forms) over rows both computed
};

std::size_t non_finite(const RowMatrixXd& m) {
  std::size_t n = 0;
  for (Eigen::Index i = 0; i < m.size(); ++i) n += !std::isfinite(m.data()[i]);
  return n;
}

Outcome run_family(const Method& method, const MethodEntry& entry, const Family& f, const Method& reference) {
  Outcome o;
  try {
    if (entry.has_softmax_form()) {
      const RowMatrixXd p = method.softmax_rows(f.logits), r = reference.softmax_rows(f.logits);
      o.events = non_finite(p);
      for (Eigen::Index i = 0; i < p.rows(); ++i)
        if (p.row(i).allFinite() && r.row(i).allFinite()) o.worst_l1 = std::max(o.worst_l1, (p.row(i) - r.row(i)).cwiseAbs().sum());
    } else {
      const AttentionResult a = method.attention(f.q, f.k, f.v, 0.125, f.mask);
      o.events = non_finite(a.o) + non_finite(a.p);
    }
  } catch (const InputError& e) {
    o.refused = true;
    o.why = e.field() + ": " + e.reason();
  }
  return o;
}

}  // namespace

std::string run_intattn_table9(const ExperimentContext& ctx) {
  const std::vector<Family> fams = families(ctx.fast ? 1024 : 8192, ctx.fast ? 64 : 256);
  const auto [names, specs] = method_rows([](const MethodEntry&) { return true; });
  const auto reference = ref::reference_registry().create("fp64");
  std::vector<Outcome> out(specs.size() * fams.size());
  parallel_for(out.size(), ctx.threads, [&](std::size_t i) {
    const std::string& spec = specs[i / fams.size()];
    const MethodEntry& entry = *ref::reference_registry().find(parse_method_spec(spec).name);
    out[i] = run_family(*make_method(spec, ctx.engine), entry, fams[i % fams.size()], *reference);
  });
  std::ostringstream r;
  r << "intattn-table9: NaN/Inf events of every method and preset on extreme inputs (" << specs.size()
    << " configurations)\n"
    << "paper (Table 9, OpenWebText, 8K context): FP16 and IndexSoftmax, 0 NaN/Inf events each; max token loss 26.61 "
       "vs 26.50\n"
    << "here: softmax forms on 4 rows of " << (ctx.fast ? 1024 : 8192) << " logits per family; pipelines on attention "
    << "with L = " << (ctx.fast ? 64 : 256) << ", d = 64, scale 1/8\n";
  for (const Family& f : fams) r << "  " << f.name << ": " << f.what << "\n";
  r << "cell: non-finite entries of P (and O) / worst row's sum |P - P_fp64| (softmax forms); 'refused' = an "
       "InputError naming the field (listed below)\n\n";
  Table t{{"method"}, {}};
  for (const Family& f : fams) t.header.push_back(f.name);
  std::vector<std::string> refusals, with_events;
  bool index_clean = true;
  for (std::size_t s = 0; s < specs.size(); ++s) {
    std::vector<std::string> row = {names[s]};
    const std::string name = parse_method_spec(specs[s]).name;
    const bool integer_softmax = std::find(kClaimMethods.begin(), kClaimMethods.end(), name) != kClaimMethods.end();
    for (std::size_t fi = 0; fi < fams.size(); ++fi) {
      const Outcome& o = out[s * fams.size() + fi];
      if (o.refused) {
        row.push_back("refused");
        refusals.push_back(names[s] + ", " + fams[fi].name + ": " + o.why);
        continue;
      }
      const bool softmax = ref::reference_registry().find(name)->has_softmax_form();
      row.push_back(std::to_string(o.events) + (softmax ? " / " + fmt_err(o.worst_l1) : ""));
      if (o.events) with_events.push_back(names[s] + " (" + fams[fi].name + ")");
      if (integer_softmax && o.events) index_clean = false;
    }
    t.rows.push_back(row);
  }
  r << t.markdown() << "\nrefusals:\n";
  for (const auto& x : refusals) r << "  " << x << "\n";
  r << "configurations with NaN/Inf events: " << (with_events.empty() ? "none" : "") << "\n";
  for (const auto& x : with_events) r << "  " << x << "\n";
  r << "verdict: IndexSoftmax (index, intattention, every preset) has no NaN/Inf event: "
    << (index_clean ? "REPRODUCED" : "NOT REPRODUCED")
    << "; the paper's FP16 baseline is clean only on text whose logits stay below 65504 (see the fp16 row)\n";
  return r.str();
}

}  // namespace qattn::experiments
