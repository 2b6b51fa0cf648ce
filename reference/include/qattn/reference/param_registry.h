// A registry of parameterised objects other than attention methods (KV-cache quantizers, weight quantizers): the
// same spec syntax, parameters, presets and validation as the method registry (qattn/method.h), building a
// `Product` instead of a Method.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qattn/error.h"
#include "qattn/method.h"

namespace qattn::ref {

// Parameter declarations for registry entries: an integer in [lo, hi], and a choice among names.
inline ParamInfo int_param(std::string key, std::string def, std::string doc, double lo, double hi) {
  return ParamInfo{std::move(key), ParamType::integer, std::move(def), std::move(doc), {}, lo, hi};
}
inline ParamInfo choice_param(std::string key, std::string def, std::string doc, std::vector<std::string> choices) {
  return ParamInfo{std::move(key), ParamType::choice, std::move(def), std::move(doc), std::move(choices)};
}

template <class Product>
class ParamRegistry {
 public:
  struct Entry {
    MethodEntry info;  // name, summary, parameters and presets; info.make is unused
    std::function<std::unique_ptr<Product>(const ParamMap&)> make;
  };

  explicit ParamRegistry(std::string what) : what_(std::move(what)) {}

  void add(Entry e) {
    params_.add(e.info);
    entries_.push_back(std::move(e));
  }

  // Throws SpecError naming the valid entries for an unknown name, or the parameter error of Registry::resolve.
  std::unique_ptr<Product> create(std::string_view spec_text) const {
    const MethodSpec spec = parse_method_spec(spec_text);
    if (!params_.find(spec.name)) {
      std::string names;
      for (const Entry& e : entries_) names += (names.empty() ? "" : ", ") + e.info.name;
      throw SpecError("unknown " + what_ + " '" + spec.name + "' (valid: " + names + ")");
    }
    const ParamMap p = params_.resolve(spec);
    for (const Entry& e : entries_)
      if (e.info.name == spec.name) return e.make(p);
    throw std::logic_error("ParamRegistry: entry without a factory");
  }

  std::string canonical(std::string_view spec) const { return params_.canonical(parse_method_spec(spec)); }
  const Registry& params() const { return params_; }

 private:
  std::string what_;
  Registry params_;
  std::vector<Entry> entries_;
};

}  // namespace qattn::ref
