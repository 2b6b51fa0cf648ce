#include "engine_setting.h"

#include <cstdlib>

#include "qattn/error.h"

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
