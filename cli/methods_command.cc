// `qattn methods`: the registry's methods, parameters and presets, as markdown or JSON.
#include "commands.h"

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/weight_quant.h"

namespace qattn::cli {
using nlohmann::json;

namespace {

const Registry& registry() { return ref::reference_registry(); }

std::string type_name(const ParamInfo& p) {
  switch (p.type) {
    case ParamType::integer: return "integer";
    case ParamType::real: return "real";
    case ParamType::boolean: return "bool";
    case ParamType::text: return "text";
    case ParamType::choice: {
      std::string s;
      for (const auto& c : p.choices) s += (s.empty() ? "" : "|") + c;
      return s;
    }
  }
  return "";
}

// Markdown blocks for the docs, each between markers that scripts/doc_blocks.py finds in README.md,
// docs/dumping.md and docs/non-finite.md (and a CLI test checks there): the method table, the list of methods with
// a softmax form, and the non-finite policy per method.
void print_methods_markdown() {
  const auto begin = [](const char* block) { std::cout << "<!-- begin: qattn methods --format md, " << block << " -->\n"; };
  const auto end = [](const char* block) { std::cout << "<!-- end: " << block << " -->\n"; };
  begin("table");
  std::cout << "| method | kind | what it is | presets | doc |\n|---|---|---|---|---|\n";
  for (const auto& e : registry().entries()) {
    std::string presets;
    for (const auto& p : e.presets)
      presets += (presets.empty() ? "" : ", ") + ("`@" + p.name + "`") +
                 (p.alias_of.empty() ? "" : " (old spelling of `@" + p.alias_of + "`)");
    std::cout << "| `" << e.name << "` | " << method_kind_name(e.kind) << " | " << e.summary << " | "
              << (presets.empty() ? "-" : presets) << " | " << e.doc << " |\n";
  }
  end("table");
  std::cout << "\n";
  begin("softmax models");
  std::string names;
  for (const auto& e : registry().entries())
    if (e.has_softmax_form()) names += (names.empty() ? "`" : ", `") + e.name + "`";
  std::cout << names << "\n";
  end("softmax models");
  std::cout << "\n";
  begin("non-finite");
  std::cout << "| method | overflow rule | NaN (Q, K, V, logits) | +inf | −inf | finite inputs whose logits overflow the "
               "method's format |\n|---|---|---|---|---|---|\n";
  for (const auto& e : registry().entries())
    std::cout << "| `" << e.name << "` | " << (e.overflow == OverflowRule::refuse ? "refuse" : "propagate")
              << " | refused | refused | "
              << (e.has_softmax_form() ? "logits: masked (P = 0); Q, K, V: refused"
                                       : "Q, K, V: refused (no logits input; masks are −inf logits inside)")
              << " | " << e.overflow_note << " |\n";
  end("non-finite");
}

// The parts of a flash-kernel method's description (at `spec`) that no measured vector validates; nullopt for a
// method that is not a flash kernel, or that takes no spec without a value (file).
std::optional<std::vector<std::string>> unvalidated_parts(const std::string& spec) {
  try {
    const std::unique_ptr<Method> m = registry().create(spec);
    if (const std::optional<ref::FlashKernel> k = ref::kernel_of(*m)) return ref::kernel_unvalidated_parts(*k);
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : "; ") + p;
  return s;
}

void run_methods(const std::string& format) {
  if (format == "md") return print_methods_markdown();
  if (format == "json") {
    json j = json::array();
    auto entries = registry().entries();
    for (const auto& e : ref::kv_registry().params().entries()) entries.push_back(e), entries.back().summary = "[--kv] " + e.summary;
    for (const auto& e : ref::weight_registry().params().entries())
      entries.push_back(e), entries.back().summary = "[--weights] " + e.summary;
    for (const auto& e : entries) {
      json params = json::array();
      for (const auto& p : e.params)
        params.push_back({{"key", p.key}, {"type", type_name(p)}, {"default", p.default_value}, {"doc", p.doc}});
      json presets = json::object();
      for (const auto& pr : e.presets)
        presets[pr.name] = pr.alias_of.empty() ? json{{"values", pr.values}, {"doc", pr.doc}} : json{{"alias_of", pr.alias_of}};
      json entry = {{"name", e.name}, {"summary", e.summary}, {"params", params}, {"presets", presets}};
      if (e.make) {  // the attention/softmax methods (the quantizers share the entry type but not the policy)
        entry["overflow"] = {{"rule", e.overflow == OverflowRule::refuse ? "refuse" : "propagate"},
                             {"note", e.overflow_note}};
        entry["kind"] = method_kind_name(e.kind);
        entry["doc"] = e.doc;
        entry["reference"] = e.reference;
        entry["in_default_lists"] = e.in_default_lists;
        if (!e.positional_key.empty()) entry["positional_key"] = e.positional_key;
        if (const auto parts = unvalidated_parts(e.name)) {
          entry["not_validated"] = *parts;
          for (const auto& pr : e.presets)
            if (pr.alias_of.empty())
              if (const auto pp = unvalidated_parts(e.name + "@" + pr.name)) presets[pr.name]["not_validated"] = *pp;
          entry["presets"] = presets;
        }
      }
      j.push_back(entry);
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  auto entries = registry().entries();
  const std::size_t n_methods = entries.size();
  for (const auto& e : ref::kv_registry().params().entries()) entries.push_back(e);
  const std::size_t n_kv = entries.size();
  for (const auto& e : ref::weight_registry().params().entries()) entries.push_back(e);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (i == n_methods) std::cout << "\nKV-cache quantizers (qattn analyze --kv SPEC, applied to K and V before the method):\n";
    if (i == n_kv)
      std::cout << "\nWeight quantizers (qattn analyze --weights SPEC: Q, K, V from the dump's attention input and "
                   "quantized projections):\n";
    std::cout << e.name << "\n    " << e.summary << "\n";
    if (i < n_methods) std::cout << "    " << method_kind_name(e.kind) << "; " << e.doc << "\n";
    if (i < n_methods)
      std::cout << "    overflow: " << (e.overflow == OverflowRule::refuse ? "refuse" : "propagate") << " ("
                << e.overflow_note << "; docs/non-finite.md)\n";
    const auto parts = i < n_methods ? unvalidated_parts(e.name) : std::nullopt;
    if (parts && !parts->empty()) std::cout << "    not validated by measured vectors: " << joined(*parts) << "\n";
    if (e.params.empty()) std::cout << "    parameters: none\n";
    for (const auto& p : e.params)
      std::cout << "    " << p.key << "=" << p.default_value << "  [" << type_name(p) << "]  " << p.doc << "\n";
    for (const auto& pr : e.presets) {
      if (!pr.alias_of.empty()) {
        std::cout << "    @" << pr.name << ": now @" << pr.alias_of << " (the old spelling, kept for this release)\n";
        continue;
      }
      std::cout << "    @" << pr.name << ":";
      for (const auto& [k, v] : pr.values) std::cout << " " << k << "=" << v;
      std::cout << "  " << pr.doc << "\n";
      if (!parts) continue;
      if (const auto pp = unvalidated_parts(e.name + "@" + pr.name); pp && *pp != *parts)
        std::cout << "      not validated by measured vectors: " << (pp->empty() ? "(every part validated)" : joined(*pp)) << "\n";
    }
  }
}

}  // namespace

void add_methods(CLI::App& app) {
  auto* sub = app.add_subcommand("methods", "List the registered methods with their parameters, defaults and presets");
  auto format = std::make_shared<std::string>("text");
  sub->add_option("--format", *format, "text|json|md (md: the method table and the softmax-model list of the docs)")
      ->capture_default_str();
  sub->callback([=] {
    check_format_option(*format, {"text", "json", "md"});
    run_methods(*format);
  });
}

}  // namespace qattn::cli
