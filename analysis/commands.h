// The qattn subcommands. Each returns a process exit code: 0 success, 2 usage error, 3 bad input.
#pragma once

#include <CLI/CLI.hpp>

namespace qattn::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitBadInput = 3;

// Adds every subcommand to `app`; the returned callback runs the one that was selected.
void add_info(CLI::App& app);
void add_methods(CLI::App& app);
void add_softmax(CLI::App& app);
void add_attention(CLI::App& app);
void add_compare(CLI::App& app);
void add_analyze(CLI::App& app);
void add_bench(CLI::App& app);
void add_sweep(CLI::App& app);
void add_reproduce(CLI::App& app);
void add_plot(CLI::App& app);

// Thrown by a subcommand that has already reported its failure (e.g. a child process did): main exits with `code`.
struct ExitCode {
  int code;
};

// Writes text to stdout, or atomically to path when it is not empty.
void emit(const std::string& text, const std::string& path);

}  // namespace qattn::cli
