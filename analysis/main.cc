// qattn: one program, one subcommand per task. Run `qattn --help` or `qattn SUBCOMMAND --help`.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <exception>
#include <iostream>
#include <limits>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "commands.h"
#include "engine_setting.h"
#include "shard.h"
#include "qattn/error.h"

namespace {

// A command allocates a few large buffers (tensors of several MB), frees some, and allocates others of the same size.
// glibc serves such sizes with mmap and gives them back with munmap, raising its threshold only as it goes, so each
// new buffer starts on fresh pages, and first touches of fresh pages are the bulk of what reading and writing a
// tensor costs (on the VMs measured in docs/kernels.md, about 0.4 ms per MB, ten times a warm memset). Blocks up to
// 32 MiB (glibc's largest mmap threshold) come from the heap instead, and the heap is never trimmed before exit, so
// freed pages are reused. Peak memory is unchanged: only what is already held is kept. Larger blocks (P at large L)
// are still mapped and unmapped one by one.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qattn::cli;
  keep_freed_memory();
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
