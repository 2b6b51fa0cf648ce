// Which implementation runs a method spec: the fused integer kernels (qattn/int_attention.h, docs/kernels.md) or the
// reference model (reference/). The library's entry point for running a method; the CLI's attention, analyze, sweep
// and reproduce all build their methods here.
//
// The fused kernels run a spec only where they compute the same bits as its reference model (the ladder of
// docs/kernels.md, tested in tests/kernels/engine_test.cc):
//   intattention   every IndexSoftmax parameter and preset, cint-eval f64 and f32, u8 and s8 P, padding and causal
//                  masks; one Q and one V scale per call (q-group=0, v-group=tensor)
//   quant-only     softmax=lanes16 only (the fused float softmax is exp_f32_poly with the 16-lane sum; the default
//                  softmax=ref uses std::exp), and only when no float32 logit can overflow (|fl32(A)| alpha is
//                  bounded by fl32(127^2 d) alpha; beyond it the reference model names the entry it refuses)
// Every other spec runs on its reference model.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "qattn/int_attention.h"
#include "qattn/method.h"

namespace qattn {

enum class Engine {
  automatic,  // the fused kernels where they support the spec, else the reference model
  fast,       // the fused kernels; a spec they do not support is a SpecError naming why
  reference,  // the reference model always
};

std::string_view engine_name(Engine engine);  // "auto", "fast", "reference"
// Parses "auto", "fast" or "reference"; SpecError listing them otherwise.
Engine parse_engine(std::string_view name);

struct EngineOptions {
  Engine engine = Engine::automatic;
  std::optional<Isa> isa;  // unset: default_isa() (QATTN_ISA, else the best this build and CPU run)
  int threads = 1;         // threads of one fused call (rows are independent: every count gives the same bits)
  bool probs = true;       // false: attention() leaves P empty, so memory stays O(min(B_r, L_q) L_k) per thread
  bool o_float32 = false;  // true: the fused path returns O in AttentionResult::o_f32 and leaves o empty (the
                           // reference path fills o as always); a caller that writes float32 O skips two copies
};

struct BuiltMethod {
  std::unique_ptr<Method> method;
  bool fast = false;
  // One line for --verbose: "fused kernels (ISA: qk, softmax, pv)" or "reference model (why not fused)".
  std::string path;
};

// Builds the method `spec` names from the reference registry, on the engine `options` selects. Throws SpecError for
// a bad spec, for Engine::fast with a spec the fused kernels do not support (naming the reason), and for an ISA
// that is not available (listing those that are).
BuiltMethod build_method(const MethodSpec& spec, const EngineOptions& options = {});
inline BuiltMethod build_method(std::string_view spec, const EngineOptions& options = {}) {
  return build_method(parse_method_spec(spec), options);
}

// What a front end's --engine and --verbose select, passed to every method it builds: the CLI's commands, an
// experiment's context (experiments/common/experiment.h).
struct EngineSetting {
  Engine engine = Engine::automatic;
  bool verbose = false;  // one line per distinct canonical spec on stderr, once per process: which path runs it
};

// The method `spec` names, on `setting.engine`; `threads`, `probs` and `o_float32` as in EngineOptions. Thread-safe.
std::unique_ptr<Method> make_method(const MethodSpec& spec, const EngineSetting& setting, int threads = 1,
                                    bool probs = true, bool o_float32 = false);
std::unique_ptr<Method> make_method(const std::string& spec, const EngineSetting& setting, int threads = 1,
                                    bool probs = true);

}  // namespace qattn
