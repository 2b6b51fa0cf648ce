// qattn kernel: a flash kernel as a description (docs/kernels-as-data.md). `show` prints a kernel's description as
// the file a user edits and runs with --method file:PATH; `check` derives its contracts and exits 1 when one is
// violated.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kernel_search.h"
#include "qattn/error.h"
#include "qattn/reference/flash_kernel.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/registry.h"

namespace qattn::cli {
namespace {

// NAME as a method spec; a path to a file (one that exists, or one ending in .json) is file:PATH.
std::string kernel_spec(const std::string& name) {
  if (name.rfind("file:", 0) != 0 && (name.ends_with(".json") || std::filesystem::is_regular_file(name)))
    return "file:" + name;
  return name;
}

ref::FlashKernel kernel_named(const std::string& name) {
  const std::unique_ptr<Method> m = ref::reference_registry().create(kernel_spec(name));
  std::optional<ref::FlashKernel> k = ref::kernel_of(*m);
  if (!k)
    throw SpecError("method '" + name + "' is not a flash kernel (the kernels: sage1, sage2, sage3, fa3-fp8, fa4-fp8 "
                    "and turbo in prefill, with any preset and parameters, and file:PATH; turbo's decode cache is an "
                    "input of the call, not a part of a description)");
  return *k;
}

struct CheckOptions {
  std::string name, format = "md", out;
  long long keys = 8192;
  double tolerance = 0.05;
  // --search
  bool search = false;
  int budget = 48, threads = 0;
  std::uint64_t seed = 0;
  long long max_keys = 4096, head_dim = 128;
  std::string metric = "O_rel_l1", dump;
  std::vector<std::string> families;
  std::optional<double> fail_above;
};

constexpr eval::Metric kSearchMetrics[] = {eval::Metric::o_rel_l1, eval::Metric::o_one_minus_cossim,
                                           eval::Metric::o_rmse};

eval::Metric search_metric(const std::string& name) {
  std::string names;
  for (eval::Metric m : kSearchMetrics) {
    for (const eval::MetricInfo& i : eval::kMetrics)
      if (i.metric == m) {
        if (name == i.name) return m;
        names += std::string(names.empty() ? "" : ", ") + i.name;
      }
  }
  throw CLI::ValidationError("--metric", "'" + name + "' is not one the search maximises: " + names);
}

// The search's section of the report (after the contracts), md or a JSON object.
std::string search_report(const SearchResult& r, const SearchOptions& so, const CheckOptions& o) {
  const SearchCase& w = r.worst[r.worst_at];
  if (o.format == "json") {
    nlohmann::ordered_json j;
    j["evaluations"] = r.evaluations;
    j["seed"] = so.seed;
    j["head_dim"] = so.head_dim;
    j["max_keys"] = so.max_keys;
    j["metric"] = o.metric;
    j["families"] = nlohmann::ordered_json::array();
    // a non-finite value as the text "inf" or "nan", as analyze's JSON writes one (JSON has no such numbers)
    const auto value = [](double x) {
      return std::isfinite(x) ? nlohmann::ordered_json(x)
                              : nlohmann::ordered_json(std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
    };
    for (const SearchCase& c : r.worst)
      j["families"].push_back({{"family", family_name(c.input.family)}, {"error", value(c.error)},
                               {"O_cossim", value(c.metrics.o_cossim)}, {"L_q", c.input.lq}, {"L_k", c.input.lk},
                               {"causal", c.input.causal}, {"input", c.input.describe()}});
    j["worst"] = family_name(w.input.family);
    j["dump"] = o.dump.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(o.dump);
    return j.dump(2);
  }
  std::string s = "\nsearch: " + std::to_string(r.evaluations) + " inputs (seed " + std::to_string(so.seed) + ", d " +
                  std::to_string(so.head_dim) + ", L_k up to " + std::to_string(so.max_keys) + "), the worst " +
                  o.metric + " against the fp64 reference per family\n\n| family | " + o.metric +
                  " | O_cossim | L_q | L_k | input |\n|---|---|---|---|---|---|\n";
  char buf[64];
  for (const SearchCase& c : r.worst) {
    std::snprintf(buf, sizeof buf, "%.6g | %.8f", c.error, c.metrics.o_cossim);
    s += std::string("| ") + family_name(c.input.family) + " | " + buf + " | " + std::to_string(c.input.lq) + " | " +
         std::to_string(c.input.lk) + " | " + c.input.describe() + " |\n";
  }
  std::snprintf(buf, sizeof buf, "%.6g", w.error);
  s += std::string("\nworst: ") + family_name(w.input.family) + ", " + o.metric + " " + buf;
  s += o.dump.empty() ? " (--dump DIR writes it)\n"
                      : "; written to " + o.dump + " (qattn analyze --tensors " + o.dump + " --method " +
                            kernel_spec(o.name) + ")\n";
  return s;
}

std::string check_report(const ref::FlashKernel& k, const std::vector<ref::KernelContract>& contracts,
                         const CheckOptions& o, const std::string& search_json) {
  std::size_t violated = 0;
  for (const auto& c : contracts) violated += c.violated;
  if (o.format == "json") {
    nlohmann::ordered_json j;
    j["kernel"] = k.name;
    j["violated"] = violated;
    j["contracts"] = nlohmann::ordered_json::array();
    for (const auto& c : contracts)
      j["contracts"].push_back({{"contract", c.name}, {"bound", c.bound}, {"limit", c.limit},
                                {"verdict", c.violated ? "violated" : "holds"}, {"fix", c.fix}});
    if (!search_json.empty()) j["search"] = nlohmann::ordered_json::parse(search_json);
    return j.dump(2) + "\n";
  }
  std::string s = "kernel " + k.name + ": " + std::to_string(contracts.size()) + " contracts, " +
                  std::to_string(violated) + " violated (docs/kernels-as-data.md, Contracts)\n\n"
                  "| contract | bound | limit | verdict |\n|---|---|---|---|\n";
  for (const auto& c : contracts)
    s += "| " + c.name + " | " + c.bound + " | " + c.limit + " | " + (c.violated ? "**violated**" : "holds") + " |\n";
  for (const auto& c : contracts)
    if (c.violated) s += "\nviolated: " + c.name + ": change " + c.fix + "\n";
  return s;
}

// --search: the worst inputs of the families asked for, reported; `failed` when the worst passes --fail-above.
std::string run_search(const ref::FlashKernel& k, const CheckOptions& o, bool& failed) {
  SearchOptions so;
  so.metric = search_metric(o.metric);
  for (const std::string& name : o.families) {
    const std::optional<SearchFamily> f = family_named(name);
    if (!f) throw CLI::ValidationError("--family", "'" + name + "' is not a family: max-jump, diffuse, first-causal, needle");
    if (std::find(so.families.begin(), so.families.end(), *f) == so.families.end()) so.families.push_back(*f);
  }
  so.budget = o.budget;
  so.seed = o.seed;
  so.max_keys = o.max_keys;
  so.head_dim = o.head_dim;
  so.threads = o.threads;
  so.key_block = k.keys.block > 0 ? k.keys.block : ref::fa3_fp8_key_block(so.head_dim);
  const bool jumps =
      so.families.empty() || std::find(so.families.begin(), so.families.end(), SearchFamily::max_jump) != so.families.end();
  if (jumps && o.max_keys <= so.key_block)
    throw CLI::ValidationError("--max-keys", std::to_string(o.max_keys) + ": max-jump needs keys past the kernel's "
                                             "key block (" + std::to_string(so.key_block) +
                                             "); raise it, or choose other --family values");
  so.progress = stderr_progress("qattn kernel check --search", "inputs");
  const std::string spec = kernel_spec(o.name);
  const SearchResult r = search_worst_inputs([&] { return ref::reference_registry().create(spec); }, o.name, so);
  const SearchCase& w = r.worst[r.worst_at];
  failed = o.fail_above && !(w.error <= *o.fail_above);
  if (!o.dump.empty()) write_search_dump(w.input, so.head_dim, o.dump);
  return search_report(r, so, o);
}

void run_kernel_check(const CheckOptions& o, const CLI::App& check) {
  check_format_option(o.format, {"md", "json"});
  if (!o.search)
    for (const char* flag : {"--budget", "--seed", "--max-keys", "--d", "--family", "--metric", "--dump", "--fail-above",
                             "--threads"})
      if (check.count(flag) > 0) throw CLI::ValidationError(flag, "applies to --search only");
  require_threads(o.threads);
  const ref::FlashKernel k = kernel_named(o.name);
  const auto contracts = ref::kernel_contracts(k, {o.keys, o.tolerance});
  bool search_failed = false;
  const std::string search = o.search ? run_search(k, o, search_failed) : "";
  std::string report = check_report(k, contracts, o, o.format == "json" ? search : "");
  if (o.format != "json") report += search;
  emit(report, o.out);
  for (const auto& c : contracts)
    if (c.violated) throw ExitCode{1};
  if (search_failed) throw ExitCode{1};
}

void add_kernel_show(CLI::App* sub) {
  auto show_name = std::make_shared<std::string>();
  auto show_out = std::make_shared<std::string>();
  auto* show = sub->add_subcommand("show", "Print a kernel's description (JSON): a method spec (fa3-fp8, "
                                           "sage2@paper-8b, sage1:acc=fp32) or a description file");
  show->add_option("name", *show_name, "Method spec, file:PATH or PATH")->required();
  show->add_option("--out", *show_out, "Write here (atomically) instead of stdout");
  show->callback([show_name, show_out] { emit(ref::kernel_to_json(kernel_named(*show_name)), *show_out); });
}

void add_kernel_check(CLI::App* sub) {
  auto o = std::make_shared<CheckOptions>();
  auto* check = sub->add_subcommand("check", "Derive a kernel's contracts (the ranges each stage reaches against "
                                             "its format) and print each with its verdict; exit 1 when one is "
                                             "violated");
  check->add_option("name", o->name, "Method spec, file:PATH or PATH")->required();
  check->add_option("--keys", o->keys, "Row length of the diffuse-mass contract (default 8192)")
      ->check(CLI::Range(2LL, 1LL << 40));
  check->add_option("--tolerance", o->tolerance,
                    "Largest share of a row's mass the diffuse-mass contract lets P's format flush (default 0.05)")
      ->check(CLI::Range(0.0, 1.0));
  check->add_option("--format", o->format, "md (default) or json");
  check->add_option("--out", o->out, "Write here (atomically) instead of stdout");
  check->add_flag("--search", o->search,
                  "Also search for inputs with the largest error against the fp64 reference: max-jump, diffuse, "
                  "first-causal and needle heads (docs/kernels-as-data.md, Searching for bad inputs)");
  check->add_option("--budget", o->budget, "--search: inputs evaluated (default 48)")->check(CLI::Range(1, 100000));
  check->add_option("--seed", o->seed, "--search: seed of the draws (default 0)");
  check->add_option("--max-keys", o->max_keys, "--search: the longest L_k drawn (default 4096)")
      ->check(CLI::Range(64LL, 1LL << 20));
  check->add_option("--d", o->head_dim, "--search: head dimension (default 128)")->check(CLI::Range(1LL, 1024LL));
  check->add_option("--family", o->families,
                    "--search: draw only these families (repeatable): max-jump, diffuse, first-causal, needle");
  check->add_option("--metric", o->metric, "--search: O_rel_l1 (default), O_one_minus_cossim or O_rmse");
  check->add_option("--dump", o->dump,
                    "--search: write the worst input here as a dump directory (it must not exist) for qattn analyze");
  check->add_option("--fail-above", o->fail_above, "--search: exit 1 when the worst error exceeds this")
      ->check(CLI::Range(0.0, std::numeric_limits<double>::max()));
  add_threads_option(check, o->threads, "--search: worker threads", ". The result does not depend on it");
  check->callback([o, check] { run_kernel_check(*o, *check); });
}

}  // namespace

void add_kernel(CLI::App& app) {
  auto* sub = app.add_subcommand("kernel", "A flash kernel as a description (docs/kernels-as-data.md): show prints it "
                                           "as a file to edit and run with --method file:PATH; check derives its "
                                           "contracts");
  sub->require_subcommand(1);
  add_kernel_show(sub);
  add_kernel_check(sub);
}

}  // namespace qattn::cli
