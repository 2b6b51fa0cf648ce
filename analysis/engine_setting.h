// --engine and --verbose of the commands that run methods (attention, analyze, sweep, reproduce): each command's
// options hold an EngineSetting, which is passed to every method it builds (qattn/engine.h).
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

// Adds --engine auto|fast|reference and --verbose to a subcommand, parsed into `setting` (which must outlive the
// parse: a member of the subcommand's options).
void add_engine_options(CLI::App* sub, EngineSetting& setting);

// The method `spec` names, on `engine`. `threads`, `probs` and `o_float32` as in EngineOptions. Thread-safe.
std::unique_ptr<Method> make_method(const MethodSpec& spec, const EngineSetting& engine, int threads = 1,
                                    bool probs = true, bool o_float32 = false);
std::unique_ptr<Method> make_method(const std::string& spec, const EngineSetting& engine, int threads = 1,
                                    bool probs = true);

// Exit 2 with the valid values when QATTN_ISA names an ISA that is unknown or that this build or CPU cannot run;
// called once before any command runs, so every command honours the variable.
void check_isa_environment();

}  // namespace qattn::cli
