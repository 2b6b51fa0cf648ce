// The commands' shared helpers (commands.h); each command lives in its own file (cli/*_command.cc).
#include "commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn::cli {
namespace fs = std::filesystem;


void check_format_option(const std::string& f, std::initializer_list<const char*> valid) {
  for (const char* v : valid)
    if (f == v) return;
  std::string list;
  for (const char* v : valid) list += std::string(list.empty() ? "" : "|") + v;
  throw CLI::ValidationError("--format", "'" + f + "' is not one of " + list);
}

void emit(const std::string& text, const std::string& path) {
  if (path.empty()) {
    std::cout << text << std::flush;
    return;
  }
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

int flush_stdout() {
  std::cout.flush();
  errno = 0;
  int err = std::fflush(stdout) != 0 ? errno : 0;
  if (!err && (std::cout.fail() || std::ferror(stdout))) {
    // an earlier write failed and its errno is gone; one more byte tells why (ENOSPC for > /dev/full)
    errno = 0;
    err = std::fputc('\n', stdout) == EOF || std::fflush(stdout) != 0 ? errno : 0;
    if (!err) err = EIO;
  }
  return err;
}

std::vector<std::byte> encode_output(const std::string& path, const std::vector<NamedTensor>& tensors) {
  const std::string ext = fs::path(path).extension().string();
  if (ext != ".npy" && ext != ".npz" && ext != ".safetensors" && tensors.size() == 1) return encode_npy(tensors.front().tensor);
  return encode_tensor_file(path, tensors);
}

std::unique_ptr<PendingFile> prepare_output(const std::string& path, const std::string& name, DType dtype,
                                            std::vector<std::int64_t> shape, std::span<const std::span<const std::byte>> pieces) {
  Tensor t{dtype, std::move(shape), {}};
  std::size_t bytes = 0;
  for (const auto& piece : pieces) bytes += piece.size();
  if (bytes != static_cast<std::size_t>(t.element_count()) * dtype_size(dtype))
    throw std::logic_error("prepare_output: " + std::to_string(bytes) + " bytes for shape " + t.shape_string());
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".npz" || ext == ".safetensors") {
    t.bytes.reserve(bytes);
    for (const auto& piece : pieces) t.bytes.insert(t.bytes.end(), piece.begin(), piece.end());
    std::vector<NamedTensor> one;
    one.push_back({name, std::move(t)});
    return std::make_unique<PendingFile>(path, encode_tensor_file(path, one));
  }
  const std::vector<std::byte> header = encode_npy_header(t);
  std::vector<std::span<const std::byte>> parts{header};
  parts.insert(parts.end(), pieces.begin(), pieces.end());
  return std::make_unique<PendingFile>(path, std::span<const std::span<const std::byte>>(parts));
}

std::function<void(std::size_t, std::size_t)> stderr_progress(std::string command, std::string items) {
  struct Progress {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    bool terminal = isatty(STDERR_FILENO);
    std::mutex lock;
    double printed = 0;
  };
  return [state = std::make_shared<Progress>(), command = std::move(command), items = std::move(items)](
             std::size_t done, std::size_t total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - state->start).count();
    const std::lock_guard<std::mutex> hold(state->lock);
    if ((state->terminal || elapsed > 2.0) && (elapsed - state->printed >= 1.0 || done == total)) {
      state->printed = elapsed;
      std::cerr << command << ": " << done << "/" << total << " " << items << " done (" << static_cast<int>(elapsed)
                << " s)\n";
    }
  };
}

namespace {

// What a path names on disk, after following symbolic links.
struct FileIdentity {
  bool exists = false, directory = false, special = false;  // special: device, FIFO or socket
  dev_t dev = 0;
  ino_t ino = 0;
  fs::path canonical;
};

FileIdentity identify(const std::string& path) {
  FileIdentity id;
  const fs::path target = resolve_output_path(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    id.exists = true;
    id.directory = S_ISDIR(st.st_mode);
    id.special = !S_ISREG(st.st_mode) && !id.directory;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
  }
  std::error_code ec;
  id.canonical = fs::weakly_canonical(fs::absolute(target, ec), ec);
  if (ec) id.canonical = fs::absolute(target, ec).lexically_normal();
  return id;
}

bool same_file(const FileIdentity& a, const FileIdentity& b) {
  if (a.exists && b.exists) return a.dev == b.dev && a.ino == b.ino;
  return a.canonical == b.canonical;
}

}  // namespace

void require_distinct_files(const std::vector<std::pair<std::string, std::string>>& inputs,
                            const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::vector<std::pair<std::string, FileIdentity>> seen;
  for (const auto& [opt, path] : outputs) {
    if (path.empty()) continue;
    const FileIdentity out = identify(path);
    if (out.special) continue;  // /dev/null, a FIFO: written in place, may be named twice
    for (const auto& [in_opt, in_path] : inputs) {
      if (in_path.empty()) continue;
      const FileIdentity in = identify(in_path);
      // An input directory (a dump) is read whole: an output may be a new file in it, never one already there.
      const bool clash = in.directory ? out.exists && same_file(identify(out.canonical.parent_path().string()), in)
                                      : same_file(in, out);
      if (clash)
        throw CLI::ValidationError(opt, "'" + path + "' is " + (in.directory ? "a file inside " : "the same file as ") +
                                            in_opt + " '" + in_path + "'; writing it would overwrite an input");
    }
    for (const auto& [prev_opt, prev] : seen)
      if (same_file(prev, out))
        throw CLI::ValidationError(opt, "'" + path + "' is the same file as " + prev_opt + "; give each output its own file");
    seen.emplace_back(opt, out);
  }
}

void require_tensor_extension(const std::string& option, const std::string& path) {
  if (identify(path).special) return;  // a device or FIFO gets .npy bytes (encode_output)
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".npy" || ext == ".npz" || ext == ".safetensors") {
    if (ext == ".npz" && !have_npz())
      throw CLI::ValidationError(option, "'" + path + "': .npz support was not built (libzip); use .npy or .safetensors");
    return;
  }
  throw CLI::ValidationError(option, "'" + path + "': the extension '" + ext +
                                         "' names no tensor format (use .npy, .npz or .safetensors)");
}

void require_range(const std::string& option, long long value, long long lo, long long hi) {
  if (value < lo || value > hi)
    throw CLI::ValidationError(option, std::to_string(value) + " is outside [" + std::to_string(lo) + ", " +
                                           std::to_string(hi) + "]");
}

CLI::Option* add_threads_option(CLI::App* sub, int& threads, const std::string& what, const std::string& note) {
  return sub
      ->add_option("--threads", threads,
                   what + ", at most " + std::to_string(kMaxThreads) + "; 0 (default): every core" + note)
      ->capture_default_str();
}

void require_threads(int threads) { require_range("--threads", threads, 0, kMaxThreads); }

CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const std::string given = value;
        std::size_t i = !value.empty() && (value[0] == '+' || value[0] == '-') ? 1 : 0;
        if (i == value.size() || value.find_first_not_of("0123456789", i) != std::string::npos)
          return "'" + given + "' is not a decimal integer";
        const bool negative = value[0] == '-';
        while (i + 1 < value.size() && value[i] == '0') ++i;  // leading zeros: not octal
        std::string digits = value.substr(i);
        const std::string limit = negative ? "9223372036854775808" : "9223372036854775807";
        if (digits.size() > limit.size() || (digits.size() == limit.size() && digits > limit))
          return given + " is outside the range of a 64-bit integer";
        value = (negative && digits != "0" ? "-" : "") + digits;
        return "";
      },
      "", "DECIMAL");
}

void require_decimal_counts(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for (const char* name : {"--threads", "--block-rows"})
      if (CLI::Option* option = sub->get_option_no_throw(name)) option->transform(decimal_integer());
}

Tensor pick_tensor(const std::string& path, const std::string& name) {
  std::vector<NamedTensor> ts = read_tensor_file(path);
  if (name.empty()) {
    if (ts.size() != 1)
      throw InputError(path, "tensor", "holds " + std::to_string(ts.size()) + " tensors; choose one with --name");
    return std::move(ts.front().tensor);
  }
  std::string names;
  for (auto& t : ts) {
    if (t.name == name) return std::move(t.tensor);
    names += (names.empty() ? "" : ", ") + t.name;
  }
  throw InputError(path, "tensor", "no tensor named '" + name + "' (present: " + names + ")");
}

}  // namespace qattn::cli

