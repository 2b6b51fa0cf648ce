// `qattn kernel check --search`: inputs that make a flash kernel's output worst against the fp64 reference, drawn
// from four families of head that random Gaussian inputs rarely produce, within a budget of evaluations; the worst
// one written as a dump that `qattn analyze` reads back to the same number (docs/kernels-as-data.md, "Searching for
// bad inputs").
//
// Every input is one head: queries q_i = sqrt(d) e_0 + noise, keys k_j = t_j e_0 + noise, so that at the logit scale
// 1/sqrt(d) the logit of key j is t_j plus a small term from the other channels; each family sets the targets t_j:
//   max-jump      t_j flat, then `step` higher at each of the last `jumps` (1 to 4) boundaries of the kernel's own
//                 keys.block (descending: the first ones, lower): the running max grows just as a block starts (the
//                 rescale, its threshold, P~'s offset against its format)
//   diffuse       t_j ~ N(0, spread^2), one key `margin` above, margin = ln L_k + U(-4, 4): mass spread over many
//                 small P~ about as large as the top key's (the format's flush)
//   first-causal  Gaussian Q and K under the causal mask, L_q = L_k: the first rows see one key, then a few
//   needle        one key `margin` = ln L_k + U(-6, 2) above N(0, spread^2) keys, its V row 8 times the others: a
//                 weight that one accumulator has to carry over many keys
// V is 1 + N(0, 1) in every family: with a zero mean the keys a kernel drops would take nothing from O on average
// (and a flushed diffuse mass would pass unseen, the row sum being exact). Every value is a float32 (the dump holds float32), so the kernel reads what the dump holds. Draws come from
// ref::Normals (std::mt19937_64, Box-Muller), the same on every machine. Two thirds of the budget go to random draws,
// the families in turn; the rest perturbs the worst input found so far (its continuous parameters scaled by
// exp(N(0, 1/4)), a fresh draw of the noise) and keeps a change that makes the error larger.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qattn/eval/evaluate.h"

namespace qattn::cli {

enum class SearchFamily { max_jump, diffuse, first_causal, needle };
const char* family_name(SearchFamily f);
std::optional<SearchFamily> family_named(const std::string& name);  // nullopt for a name that is none

struct SearchOptions {
  int budget = 48;                  // evaluations, >= 1
  std::uint64_t seed = 0;
  Eigen::Index max_keys = 4096;     // the longest L_k drawn, >= 64
  Eigen::Index head_dim = 128;      // d of Q, K and V
  Eigen::Index key_block = 128;     // the kernel's keys.block: where max-jump puts its jumps
  eval::Metric metric = eval::Metric::o_rel_l1;  // O_rel_l1, O_one_minus_cossim or O_rmse: larger is worse
  std::vector<SearchFamily> families;  // drawn in turn; empty: all four
  int threads = 1;                  // workers over the inputs of a round (<= 0: every core)
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// One input's parameters; with its seed they give the tensors again (search_input).
struct SearchInput {
  SearchFamily family = SearchFamily::max_jump;
  Eigen::Index lq = 64, lk = 128;
  Eigen::Index block = 128;  // max-jump: the key block the jumps sit on
  int jumps = 1;             // max-jump: how many of the last block boundaries the logits step up at
  bool causal = false, descending = false;
  double step = 0, spread = 0, margin = 0;
  std::uint64_t seed = 0;
  std::string describe() const;  // the parameters in words, for the report
};

struct SearchCase {
  SearchInput input;
  eval::Metrics metrics;
  double error = 0;  // metrics[options.metric]
};

struct SearchResult {
  std::vector<SearchCase> worst;  // per family that was drawn, in SearchFamily order
  std::size_t worst_at = 0;       // index into worst of the largest error
  int evaluations = 0;
};

// The head of one input (one layer, one head, batch 1, scale 1/sqrt(d)), its fp64 reference computed.
eval::DumpLayer search_input(const SearchInput& in, Eigen::Index head_dim);

// The search (above) of the method `make` creates (one per worker thread), labelled `label` in error messages. A
// non-finite output counts as the worst error there is (+inf). InputError from the method propagates (a kernel that
// refuses an input, naming it). The result does not depend on o.threads.
SearchResult search_worst_inputs(const std::function<std::unique_ptr<Method>()>& make, const std::string& label,
                                 const SearchOptions& o);

// The input as a dump directory `dir`: layer0_head0_{q,k,v}.npy (float32) and manifest.json (its scale and causal
// mask). `dir` must not exist; the files go to a staging directory beside it, renamed into place when all are
// written, so a failure leaves nothing. InputError naming --dump otherwise.
void write_search_dump(const SearchInput& in, Eigen::Index head_dim, const std::filesystem::path& dir);

}  // namespace qattn::cli
