// --engine and --verbose of the commands that run methods (attention, analyze, sweep, reproduce): one process-wide
// setting that every method those commands build goes through (qattn/engine.h).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "qattn/engine.h"

namespace qattn::cli {

struct EngineSetting {
  Engine engine = Engine::automatic;
  bool verbose = false;  // one line per distinct spec on stderr: which path runs it
};
EngineSetting& engine_setting();

// Adds --engine auto|fast|reference and --verbose to a subcommand.
void add_engine_options(CLI::App* sub);

// The method `spec` names, on the selected engine. `threads`, `probs` and `o_float32` as in EngineOptions.
// Thread-safe.
std::unique_ptr<Method> make_method(const MethodSpec& spec, int threads = 1, bool probs = true, bool o_float32 = false);
std::unique_ptr<Method> make_method(const std::string& spec, int threads = 1, bool probs = true);

// Exit 2 with the valid values when QATTN_ISA names an ISA that is unknown or that this build or CPU cannot run;
// called once before any command runs, so every command honours the variable.
void check_isa_environment();

}  // namespace qattn::cli
