// `qattn kernel check --search` (cli/kernel_search.h).
#include "kernel_search.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "qattn/choice.h"
#include "qattn/error.h"
#include "qattn/parallel.h"
#include "qattn/reference/random.h"
#include "qattn/tensor_io.h"
#include "removed_directory.h"

namespace qattn::cli {
namespace fs = std::filesystem;

namespace {

// The families in the order a search without --family draws them, under the names --family takes.
constexpr Choice<SearchFamily> kFamilies[] = {{"max-jump", SearchFamily::max_jump},
                                              {"diffuse", SearchFamily::diffuse},
                                              {"first-causal", SearchFamily::first_causal},
                                              {"needle", SearchFamily::needle}};
constexpr Eigen::Index kQueries = 64;    // L_q of the families without a causal mask
constexpr int kPerturbations = 4;        // inputs per round of the refinement, whatever the thread count
constexpr double kNoise = 0.5;           // the other channels of Q and K: N(0, 1/4) each

double f32(double x) { return static_cast<double>(static_cast<float>(x)); }

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

// Uniform in [lo, hi].
double uniform(ref::Normals& g, double lo, double hi) { return lo + (hi - lo) * g.uniform(); }
// log-uniform integer in [lo, hi].
Eigen::Index log_uniform(ref::Normals& g, Eigen::Index lo, Eigen::Index hi) {
  if (hi <= lo) return lo;
  const double x = std::exp(uniform(g, std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi) + 1)));
  return std::clamp(static_cast<Eigen::Index>(x), lo, hi);
}

// The key lengths a family draws from: [lo, hi].
std::pair<Eigen::Index, Eigen::Index> key_range(SearchFamily f, const SearchOptions& o) {
  const Eigen::Index b = o.key_block;
  switch (f) {
    case SearchFamily::max_jump: return {std::min(b + 1, o.max_keys), o.max_keys};
    case SearchFamily::diffuse: return {std::min(b, o.max_keys), o.max_keys};
    case SearchFamily::first_causal: return {16, std::min<Eigen::Index>(512, o.max_keys)};
    case SearchFamily::needle: return {std::min(2 * b, o.max_keys), o.max_keys};
  }
  return {16, o.max_keys};
}

// max-jump's key length: nb blocks less r keys (r one of 0, 1, B/2, B - 1: a last block full, nearly full, half, of
// one key), at least B + 1 and at most max_keys.
Eigen::Index jump_keys(ref::Normals& g, const SearchOptions& o) {
  const Eigen::Index b = o.key_block, blocks = std::max<Eigen::Index>(2, o.max_keys / b);
  const Eigen::Index nb = 2 + static_cast<Eigen::Index>(g.uniform() * static_cast<double>(blocks - 1));
  const Eigen::Index cut[] = {0, 1, b / 2, b - 1};
  const Eigen::Index lk = std::min(nb, blocks) * b - cut[static_cast<int>(g.uniform() * 4) & 3];
  return std::clamp(lk, std::min(b + 1, o.max_keys), o.max_keys);
}

// diffuse's and needle's shape: one key `margin` above keys of logit spread `spread` (search_input), drawn in this
// order: L_k log-uniform in [lo, hi], the spread uniform in [0, max_spread], the margin log L_k + uniform in
// [below, above], at least 0 (at log L_k, the one key weighs as much as L_k keys at logit 0).
void draw_one_above(ref::Normals& g, Eigen::Index lo, Eigen::Index hi, double max_spread, double below, double above,
                    SearchInput& in) {
  in.lk = log_uniform(g, lo, hi);
  in.spread = uniform(g, 0, max_spread);
  in.margin = std::max(0.0, std::log(static_cast<double>(in.lk)) + uniform(g, below, above));
}

SearchInput draw(SearchFamily f, std::uint64_t seed, const SearchOptions& o) {
  ref::Normals g(seed ^ 0x5eedc0ffee123457ULL);
  SearchInput in;
  in.family = f;
  in.seed = seed;
  in.block = o.key_block;
  const auto [lo, hi] = key_range(f, o);
  switch (f) {
    case SearchFamily::max_jump:
      in.lk = jump_keys(g, o);
      in.jumps = std::min<int>(1 + static_cast<int>(g.uniform() * 4), static_cast<int>((in.lk - 1) / in.block));
      in.step = uniform(g, 0.25, 12);
      in.descending = g.uniform() < 0.5;
      break;
    case SearchFamily::diffuse:
      draw_one_above(g, lo, hi, 1, -4, 4, in);
      break;
    case SearchFamily::first_causal:
      in.lk = log_uniform(g, lo, hi);
      in.spread = uniform(g, 0.25, 8);
      in.causal = true;
      break;
    case SearchFamily::needle:
      draw_one_above(g, lo, hi, 1.5, -6, 2, in);
      break;
  }
  in.lq = in.causal ? in.lk : kQueries;
  return in;
}

// A neighbour of `in`: its continuous parameters times exp(N(0, 1/4)) within the family's ranges, its key length too
// (but max-jump's, which sits on a block boundary), a fresh seed for the noise.
SearchInput perturb(const SearchInput& in, std::uint64_t seed, const SearchOptions& o) {
  ref::Normals g(seed ^ 0x9e3779b97f4a7c15ULL);
  SearchInput n = in;
  n.seed = seed;
  const auto scaled = [&](double x, double lo, double hi) { return std::clamp(x * std::exp(0.25 * g()), lo, hi); };
  n.step = scaled(in.step, 0.25, 12);
  n.spread = scaled(in.spread, 0, 8);
  n.margin = scaled(in.margin, 0, 24);
  if (in.family != SearchFamily::max_jump) {
    const auto [lo, hi] = key_range(in.family, o);
    n.lk = std::clamp(static_cast<Eigen::Index>(std::llround(static_cast<double>(in.lk) * std::exp(0.25 * g()))), lo, hi);
    if (n.causal) n.lq = n.lk;
  }
  return n;
}

}  // namespace

const char* family_name(SearchFamily f) { return name_of(kFamilies, f); }

std::optional<SearchFamily> family_named(const std::string& name) { return value_named(kFamilies, name); }

std::string SearchInput::describe() const {
  switch (family) {
    case SearchFamily::max_jump:
      return std::to_string(jumps) + " jump" + (jumps > 1 ? "s" : "") + " of " + number(step) + " at " +
             (descending ? "the first " : "the last ") + "block boundaries (block " + std::to_string(block) + ")";
    case SearchFamily::diffuse:
      return "spread " + number(spread) + ", one key " + number(margin) + " above";
    case SearchFamily::first_causal:
      return "causal, logit spread " + number(spread);
    case SearchFamily::needle:
      return "needle " + number(margin) + " above spread " + number(spread) + ", its V 8x";
  }
  return "";
}

eval::DumpLayer search_input(const SearchInput& in, Eigen::Index d) {
  ref::Normals g(in.seed);
  RowMatrixXd q(in.lq, d), k(in.lk, d), v(in.lk, d);
  for (Eigen::Index j = 0; j < in.lk; ++j)
    for (Eigen::Index c = 0; c < d; ++c) v(j, c) = f32(1 + g());
  if (in.family == SearchFamily::first_causal) {
    // logits scale q.k / sqrt(d) with q ~ N(0, 1), k ~ N(0, spread^2): standard deviation `spread`
    for (Eigen::Index i = 0; i < in.lq; ++i)
      for (Eigen::Index c = 0; c < d; ++c) q(i, c) = f32(g());
    for (Eigen::Index j = 0; j < in.lk; ++j)
      for (Eigen::Index c = 0; c < d; ++c) k(j, c) = f32(in.spread * g());
  } else {
    const double root_d = std::sqrt(static_cast<double>(d));
    for (Eigen::Index i = 0; i < in.lq; ++i) {
      q(i, 0) = f32(root_d);
      for (Eigen::Index c = 1; c < d; ++c) q(i, c) = f32(kNoise * g());
    }
    // the targets t_j in channel 0 of K: that channel's share of the logit is sqrt(d) t_j / sqrt(d) = t_j
    const Eigen::Index top = static_cast<Eigen::Index>(g.uniform() * static_cast<double>(in.lk));
    for (Eigen::Index j = 0; j < in.lk; ++j) {
      double t = 0;
      if (in.family == SearchFamily::max_jump) {
        // flat, then `jumps` steps up at the last boundaries (descending: down at the first ones)
        const Eigen::Index blocks = (in.lk + in.block - 1) / in.block, b = j / in.block;
        const Eigen::Index up = in.descending ? blocks - 1 - b : b;
        t = in.step * static_cast<double>(std::max<Eigen::Index>(0, up - (blocks - 1 - in.jumps)));
      } else {
        t = j == top ? in.margin : in.spread * g();
      }
      k(j, 0) = f32(t);
      for (Eigen::Index c = 1; c < d; ++c) k(j, c) = f32(kNoise * g());
    }
    if (in.family == SearchFamily::needle) v.row(top) *= 8;  // exact: a power of 2
  }
  eval::DumpLayer l;
  l.layer = 0;
  l.causal = in.causal;
  l.heads = {0};
  l.q_paths = {"layer0_head0_q.npy"};
  l.q = {{q}};
  l.k = {{k}};
  l.v = {{v}};
  eval::compute_reference(l);
  return l;
}

SearchResult search_worst_inputs(const std::function<std::unique_ptr<Method>()>& make, const std::string& label,
                                 const SearchOptions& o) {
  if (o.budget < 1) throw std::invalid_argument("search: budget must be >= 1");
  const int workers = parallel_workers(static_cast<std::size_t>(o.budget), o.threads);
  std::vector<std::unique_ptr<Method>> methods;
  for (int w = 0; w < workers; ++w) methods.push_back(make());
  std::size_t done = 0;
  // The inputs' errors, evaluated on the workers; each input's result depends on it alone.
  const auto evaluate = [&](const std::vector<SearchInput>& inputs) {
    std::vector<SearchCase> cases(inputs.size());
    parallel_for_workers(inputs.size(), o.threads, [&](std::size_t i, int worker) {
      const std::vector<eval::DumpLayer> dump{search_input(inputs[i], o.head_dim)};
      const eval::HeadResult r = eval::evaluate(dump, *methods[static_cast<std::size_t>(worker)], label).at(0);
      cases[i].input = inputs[i];
      cases[i].metrics = eval::metric_values(r);
      const double e = cases[i].metrics[o.metric];
      cases[i].error = std::isfinite(e) ? e : std::numeric_limits<double>::infinity();
    });
    done += inputs.size();
    if (o.progress) o.progress(done, static_cast<std::size_t>(o.budget));
    return cases;
  };
  const auto seed_of = [&](int i) { return o.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i) + 1; };

  SearchResult result;
  std::vector<int> family_at(std::size(kFamilies), -1);  // family -> index into result.worst
  const auto keep = [&](const SearchCase& c) {
    int& at = family_at[static_cast<std::size_t>(c.input.family)];
    if (at < 0) {
      at = static_cast<int>(result.worst.size());
      result.worst.push_back(c);
    } else if (c.error > result.worst[static_cast<std::size_t>(at)].error) {
      result.worst[static_cast<std::size_t>(at)] = c;
    }
  };
  const int random = std::max(1, o.budget - o.budget / 3);
  std::vector<SearchInput> inputs;
  std::vector<SearchFamily> families = o.families;
  if (families.empty())
    for (const Choice<SearchFamily>& f : kFamilies) families.push_back(f.value);
  for (int i = 0; i < random; ++i) inputs.push_back(draw(families[static_cast<std::size_t>(i) % families.size()], seed_of(i), o));
  for (const SearchCase& c : evaluate(inputs)) keep(c);
  const auto worst = [&] {
    std::size_t at = 0;
    for (std::size_t f = 1; f < result.worst.size(); ++f)
      if (result.worst[f].error > result.worst[at].error) at = f;
    return at;
  };
  for (int i = random; i < o.budget;) {
    const SearchCase best = result.worst[worst()];
    inputs.clear();
    for (int n = 0; n < kPerturbations && i < o.budget; ++n, ++i) inputs.push_back(perturb(best.input, seed_of(i), o));
    for (const SearchCase& c : evaluate(inputs)) keep(c);
  }
  std::sort(result.worst.begin(), result.worst.end(),
            [](const SearchCase& a, const SearchCase& b) { return a.input.family < b.input.family; });
  result.worst_at = worst();
  result.evaluations = o.budget;
  return result;
}

void write_search_dump(const SearchInput& in, Eigen::Index head_dim, const fs::path& dir) {
  std::error_code ec;
  fs::path target = fs::absolute(dir, ec).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "DIR/"
  if (fs::exists(fs::symlink_status(target, ec)))
    throw InputError(dir.string(), "--dump", "exists: the search writes a new directory");
  const fs::path parent = target.parent_path();
  if (!fs::is_directory(parent, ec)) throw InputError(dir.string(), "--dump", "its parent directory does not exist");
  std::string tmpl = (parent / ".qattn-search-XXXXXX").string();
  if (!mkdtemp(tmpl.data()))
    throw InputError(dir.string(), "--dump", "cannot create a staging directory in " + parent.string() + ": " +
                                                 std::strerror(errno));
  const fs::path staging = tmpl;
  const mode_t mask = umask(0);
  umask(mask);
  fs::permissions(staging, static_cast<fs::perms>(0777 & ~mask), ec);  // as mkdir would make it, not mkdtemp's 0700
  RemovedDirectory cleanup{staging};
  const eval::DumpLayer l = search_input(in, head_dim);
  const auto f32_tensor = [](const RowMatrixXd& x) {
    const std::vector<double> values(x.data(), x.data() + x.size());
    return Tensor::from_double(DType::f32, {x.rows(), x.cols()}, values);
  };
  write_npy(staging / "layer0_head0_q.npy", f32_tensor(l.q[0][0]));
  write_npy(staging / "layer0_head0_k.npy", f32_tensor(l.k[0][0]));
  write_npy(staging / "layer0_head0_v.npy", f32_tensor(l.v[0][0]));
  nlohmann::ordered_json m;
  m["source"] = "qattn kernel check --search: " + std::string(family_name(in.family)) + ", " + in.describe();
  m["causal"] = in.causal;
  const std::string text = m.dump(2) + "\n";
  write_file_atomic(staging / "manifest.json", std::as_bytes(std::span(text.data(), text.size())));
  fs::rename(staging, target, ec);
  if (ec) throw InputError(dir.string(), "--dump", "cannot move the dump into place: " + ec.message());
  cleanup.keep = true;
}

}  // namespace qattn::cli
