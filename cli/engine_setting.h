// --engine and --verbose of the commands that run methods (attention, analyze, sweep, reproduce): each command's
// options hold an EngineSetting (qattn/engine.h), which is passed to every method it builds (make_method).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "qattn/engine.h"

namespace qattn::cli {

// Adds --engine auto|fast|reference and --verbose to a subcommand, parsed into `setting` (which must outlive the
// parse: a member of the subcommand's options).
void add_engine_options(CLI::App* sub, EngineSetting& setting);

// Exit 2 with the valid values when QATTN_ISA names an ISA that is unknown or that this build or CPU cannot run;
// called once before any command runs, so every command honours the variable.
void check_isa_environment();

}  // namespace qattn::cli
