// The specs that build every method of the reference registry, for tests that run each one: the bare name of each
// entry, or, for an entry its defaults do not build (in_default_lists false: the kernel-file method), the name with
// each description of tests/fixtures/kernels/ as its bare value.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "qattn/reference/registry.h"

namespace qattn::test {

inline std::vector<std::string> bare_specs(const MethodEntry& e) {
  if (e.in_default_lists) return {e.name};
  std::vector<std::string> specs;
  for (const auto& f : std::filesystem::directory_iterator(std::filesystem::path(QATTN_FIXTURES) / "kernels"))
    specs.push_back(e.name + ":" + f.path().string());
  std::sort(specs.begin(), specs.end());
  return specs;
}

}  // namespace qattn::test
