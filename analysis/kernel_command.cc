// qattn kernel: a flash kernel as a description (docs/kernels-as-data.md). `show` prints a kernel's description as
// the file a user edits and runs with --method file:PATH; `check` derives its contracts and exits 1 when one is
// violated.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "qattn/error.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/registry.h"

namespace qattn::cli {
namespace {

// NAME as a method spec; a path to a file (one that exists, or one ending in .json) is file:PATH.
ref::FlashKernel kernel_named(const std::string& name) {
  std::string spec = name;
  if (name.rfind("file:", 0) != 0 && (name.ends_with(".json") || std::filesystem::is_regular_file(name)))
    spec = "file:" + name;
  const std::unique_ptr<Method> m = ref::reference_registry().create(spec);
  std::optional<ref::FlashKernel> k = ref::kernel_of(*m);
  if (!k)
    throw SpecError("method '" + name + "' is not a flash kernel (the kernels: sage1, sage2 and fa3-fp8 with any "
                    "preset and parameters, and file:PATH)");
  return *k;
}

struct CheckOptions {
  std::string name, format = "md", out;
  long long keys = 8192;
  double tolerance = 0.05;
};

std::string check_report(const ref::FlashKernel& k, const std::vector<ref::KernelContract>& contracts,
                         const CheckOptions& o) {
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

}  // namespace

void add_kernel(CLI::App& app) {
  auto* sub = app.add_subcommand("kernel", "A flash kernel as a description (docs/kernels-as-data.md): show prints it "
                                           "as a file to edit and run with --method file:PATH; check derives its "
                                           "contracts");
  sub->require_subcommand(1);
  auto show_name = std::make_shared<std::string>();
  auto show_out = std::make_shared<std::string>();
  auto* show = sub->add_subcommand("show", "Print a kernel's description (JSON): a method spec (fa3-fp8, "
                                           "sage2@8b, sage1:acc=fp32) or a description file");
  show->add_option("name", *show_name, "Method spec, file:PATH or PATH")->required();
  show->add_option("--out", *show_out, "Write here (atomically) instead of stdout");
  show->callback([show_name, show_out] { emit(ref::kernel_to_json(kernel_named(*show_name)), *show_out); });

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
  check->callback([o] {
    check_format_option(o->format, {"md", "json"});
    const ref::FlashKernel k = kernel_named(o->name);
    const auto contracts = ref::kernel_contracts(k, {o->keys, o->tolerance});
    emit(check_report(k, contracts, *o), o->out);
    for (const auto& c : contracts)
      if (c.violated) throw ExitCode{1};
  });
}

}  // namespace qattn::cli
