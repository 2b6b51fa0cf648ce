// The qattn subcommands. Each returns a process exit code: 0 success, 2 usage error, 3 bad input.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <functional>
#include <memory>

#include "data_paths.h"
#include "engine_setting.h"
#include "evaluate.h"
#include <nlohmann/json.hpp>
#include "qattn/parallel.h"  // kMaxThreads, resolve_threads
#include "qattn/tensor_io.h"
#include <string>
#include <utility>
#include <vector>

namespace qattn::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitBadInput = 3;

// The CPU as benchmarks print it: "AMD EPYC (family 25, model 17)" on x86, "implementer 0x41, part 0xd0b" on Arm.
std::string cpu_model();

// Each adds one subcommand to `app`, with its options and the callback CLI11 runs when it is selected.
void add_info(CLI::App& app);
void add_methods(CLI::App& app);
void add_softmax(CLI::App& app);
void add_attention(CLI::App& app);
void add_compare(CLI::App& app);
void add_analyze(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_eval(CLI::App& app);
void add_sweep(CLI::App& app);
void add_reproduce(CLI::App& app);
void add_plot(CLI::App& app);
void add_mma(CLI::App& app);        // cli/mma.cc
void add_mma_check(CLI::App& app);
void add_kernel(CLI::App& app);     // cli/kernel_command.cc

// The options of `qattn analyze`, and its report (the table in `format`, eval::render_report) as text. Throws
// CLI::ValidationError for options that do not fit together, SpecError for a bad spec and InputError for a bad dump.
struct AnalyzeOptions {
  std::string tensors = default_tensors();
  std::string q, k, v, logits;
  std::vector<std::string> specs;
  std::string format = "md", out, reference = "fp64", kv, weights;
  bool softmax_only = false;
  std::string shard;  // "K/N": write the partial result of shard K of N (docs/scale-out.md)
  int threads = 0;    // workers over (head, block) items; 0: every core
  long long block_rows = 0;  // query rows per streamed block (multiple of 64); 0: chosen from L_k
  bool whole_calls = false;  // every method on whole calls, none streamed (a check: the tables are the same)
  EngineSetting engine;      // --engine, --verbose
};
std::string analyze_report(const AnalyzeOptions& o);

// Thrown by a subcommand that has already reported its failure (e.g. a child process did): main exits with `code`.
struct ExitCode {
  int code;
};

// Refuses (CLI::ValidationError naming --format) a format not in `valid`.
void check_format_option(const std::string& format, std::initializer_list<const char*> valid);

// Progress on stderr, "COMMAND: done/total ITEMS done (N s)", at a terminal or once a run passes 2 s, at most once a
// second and at the end; safe to call from several threads.
std::function<void(std::size_t done, std::size_t total)> stderr_progress(std::string command, std::string items);

// Writes text to stdout, or atomically to path when it is not empty.
void emit(const std::string& text, const std::string& path);

// Refuses (CLI::ValidationError, exit 2) an output that is the same file as an input or as another output: each
// pair is (option, path); paths are compared after following symbolic links, and by device and inode where the
// files exist. Character devices and FIFOs (e.g. /dev/null) may be given more than once.
void require_distinct_files(const std::vector<std::pair<std::string, std::string>>& inputs,
                            const std::vector<std::pair<std::string, std::string>>& outputs);

// One tensor of a file: the only one, or the one called `name` (InputError naming the file otherwise).
qattn::Tensor pick_tensor(const std::string& path, const std::string& name);

// The tensor file format an output path's extension names (.npy, .npz, .safetensors); CLI::ValidationError (exit 2)
// naming `option` otherwise, before any work is done.
void require_tensor_extension(const std::string& option, const std::string& path);

// Checks that a numeric option lies in [lo, hi]; CLI::ValidationError naming the option otherwise.
void require_range(const std::string& option, long long value, long long lo, long long hi);

// --threads of a command that runs work, every command's the same: `what` the workers are, then ", at most 1024; 0
// (default): every core" and `note`. The command passes the value to require_threads before it runs anything, and
// resolves 0 with resolve_threads (qattn/parallel.h), as Python's threads= does.
CLI::Option* add_threads_option(CLI::App* sub, int& threads, const std::string& what, const std::string& note = "");
// threads within [0, kMaxThreads]; CLI::ValidationError naming --threads otherwise (exit 2).
void require_threads(int threads);

// A transform for integer options: the value must be decimal digits after an optional sign, within 64 bits;
// otherwise CLI::ValidationError (exit 2) quoting what was given. Left to CLI11, "" reads as 0 (for --threads: every
// core), 99999999999999999999 as 2^63 - 1 and "010" as octal 8. The value goes on without '+' and leading zeros.
CLI::Validator decimal_integer();

// Puts decimal_integer() on every --threads and --block-rows option of every subcommand of `app`.
void require_decimal_counts(CLI::App& app);

// Flushes stdout; 0, or the errno of the failure when anything written to it was lost (e.g. > /dev/full).
int flush_stdout();

// The bytes of an output tensor file: the format its extension names, or .npy for a device or FIFO.
std::vector<std::byte> encode_output(const std::string& path, const std::vector<qattn::NamedTensor>& tensors);
// The same file for one tensor of `dtype` and `shape` whose bytes (C order) are `pieces` one after another, prepared
// and not yet in place. Where it is .npy the pieces are written as they are after the header, so a large output is
// never joined into one copy first; nothing needs to outlive the call (the bytes are in the temporary, or for a
// device in the PendingFile, when it returns).
std::unique_ptr<qattn::PendingFile> prepare_output(const std::string& path, const std::string& name, qattn::DType dtype,
                                                   std::vector<std::int64_t> shape,
                                                   std::span<const std::span<const std::byte>> pieces);

}  // namespace qattn::cli
