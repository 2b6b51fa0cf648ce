// qattn: one program, one subcommand per task. Run `qattn --help` or `qattn SUBCOMMAND --help`.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <exception>
#include <iostream>

#include "commands.h"
#include "engine_setting.h"
#include "shard.h"
#include "qattn/error.h"

int main(int argc, char** argv) {
  using namespace qattn::cli;
  CLI::App app{"qattn: quantized softmax and attention, measured against exact references"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  app.set_version_flag("--version", "qattn " QATTN_VERSION);
  add_info(app);
  add_methods(app);
  add_softmax(app);
  add_attention(app);
  add_compare(app);
  add_analyze(app);
  add_bench(app);
  add_sweep(app);
  add_reproduce(app);
  add_plot(app);
  add_merge(app);
  try {
    check_isa_environment();  // QATTN_ISA holds for every command: a bad value is exit 2 before any work
    app.parse(argc, argv);
  } catch (const ExitCode& e) {
    return e.code;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  } catch (const qattn::SpecError& e) {
    std::cerr << "qattn: " << e.what() << "\n";
    return kExitUsage;
  } catch (const qattn::InputError& e) {
    std::cerr << "qattn: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "qattn: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  // Output to stdout that did not arrive (a full disk, > /dev/full, a closed descriptor) is a failure, not success.
  if (const int err = flush_stdout()) {
    std::cerr << "qattn: error: standard output: write failed: " << std::strerror(err) << "\n";
    return kExitBadInput;
  }
  return kExitOk;
}
