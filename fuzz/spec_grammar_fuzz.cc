// Fuzz target: the method-spec and sweep-grid grammars, and every method they build. The input is split at its
// first newline: the part before is a method spec (parse_method_spec, Registry::create, canonical), the part after
// a --grid axis (parse_grid_axis). A spec that builds a method is then run on small fixed inputs, softmax and
// attention, so parameter combinations the validation lets through are executed too. The acceptable failures are
// qattn::SpecError (spec and grid errors) and qattn::InputError (input errors); anything else (a crash, a sanitizer
// report, another exception escaping) is a finding. It links the libraries only (qattn::eval has the grid grammar).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "qattn/error.h"
#include "qattn/eval/grid.h"
#include "qattn/reference/registry.h"

namespace {

qattn::RowMatrixXd fixed(Eigen::Index rows, Eigen::Index cols, double phase) {
  qattn::RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = std::sin(0.7 * static_cast<double>(i) + phase) * 2.0;
  return m;
}

void run_spec(std::string_view spec) {
  const qattn::Registry& reg = qattn::ref::reference_registry();
  try {
    const qattn::MethodSpec parsed = qattn::parse_method_spec(spec);
    (void)reg.canonical(parsed);
    const auto method = reg.create(parsed);
    static const qattn::RowMatrixXd q = fixed(5, 8, 0.1), k = fixed(6, 8, 0.2), v = fixed(6, 4, 0.3);
    static const qattn::RowMatrixXd logits = fixed(3, 7, 0.4);
    try {
      (void)method->softmax_rows(logits);
    } catch (const qattn::SpecError&) {  // attention pipelines have no softmax form
    }
    qattn::AttentionMask causal;
    causal.causal = true;
    (void)method->attention(q, k, v, 0.35, causal);
  } catch (const qattn::SpecError&) {
  } catch (const qattn::InputError&) {
  }
}

void run_grid(const std::string& text) {
  try {
    (void)qattn::eval::parse_grid_axis(text);
  } catch (const qattn::SpecError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nl = input.find('\n');
  run_spec(input.substr(0, nl));
  if (nl != std::string_view::npos) run_grid(std::string(input.substr(nl + 1)));
  return 0;
}
