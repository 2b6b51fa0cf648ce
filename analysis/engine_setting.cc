#include "engine_setting.h"

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>

#include "qattn/error.h"
#include "qattn/reference/registry.h"

namespace qattn::cli {

void add_engine_options(CLI::App* sub, EngineSetting& setting) {
  sub->add_option_function<std::string>(
         "--engine", [&setting](const std::string& name) { setting.engine = parse_engine(name); },
         "auto: the fused kernels where they support the method (bit-exact to its reference model), else the "
         "reference model; fast: the fused kernels or an error; reference: the reference model (default auto)")
      ->check(CLI::IsMember({"auto", "fast", "reference"}));
  sub->add_flag_callback("--verbose", [&setting] { setting.verbose = true; },
                         "say on stderr which path (fused kernels or reference model) runs each method");
}

std::unique_ptr<Method> make_method(const MethodSpec& spec, const EngineSetting& engine, int threads, bool probs,
                                    bool o_float32) {
  EngineOptions options;
  options.o_float32 = o_float32;
  options.engine = engine.engine;
  options.threads = threads;
  options.probs = probs;
  BuiltMethod built = build_method(spec, options);
  if (engine.verbose) {
    static std::mutex mutex;
    static std::set<std::string> said;
    const std::string canonical = ref::reference_registry().canonical(spec);
    std::lock_guard<std::mutex> lock(mutex);
    if (said.insert(canonical).second) std::cerr << "qattn: " << canonical << ": " << built.path << "\n";
  }
  return std::move(built.method);
}

std::unique_ptr<Method> make_method(const std::string& spec, const EngineSetting& engine, int threads, bool probs) {
  return make_method(parse_method_spec(spec), engine, threads, probs);
}

void check_isa_environment() {
  const char* forced = std::getenv("QATTN_ISA");
  if (!forced || !*forced) return;
  try {
    default_isa();
  } catch (const std::exception& e) {
    throw SpecError(e.what());
  }
}

}  // namespace qattn::cli
