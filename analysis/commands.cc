#include "commands.h"
#include "data_paths.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <future>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "qattn/error.h"
#include "qattn/metrics.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/weight_quant.h"
#include "qattn/tensor_io.h"
#include "engine_setting.h"
#include "evaluate.h"
#include "qattn/eval/analysis.h"
#include "qattn/eval/panel_metrics.h"
#include "shard.h"
#include "evaluate.h"

namespace qattn::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const Registry& registry() { return ref::reference_registry(); }

}  // namespace

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

namespace {

// ---- info ------------------------------------------------------------------------------------------------
void run_info(const std::vector<std::string>& files, const std::string& format) {
  Table t{{"file", "tensor", "dtype", "shape", "min", "max", "mean", "std", "nan", "inf"}, {}};
  json j = json::array();
  // Read everything first: a bad file must fail the command before anything is printed.
  std::vector<std::pair<std::string, std::vector<NamedTensor>>> all;
  for (const auto& f : files) all.emplace_back(f, read_tensor_file(f));
  for (const auto& [file, tensors] : all) {
    for (const auto& nt : tensors) {
      const Eigen::ArrayXd v = nt.tensor.to_double();
      std::int64_t nan = 0, inf = 0, finite = 0;
      double mn = INFINITY, mx = -INFINITY, sum = 0;
      for (double x : v) {
        if (std::isnan(x)) ++nan;
        else if (std::isinf(x)) ++inf;
        else {
          ++finite;
          mn = std::min(mn, x);
          mx = std::max(mx, x);
          sum += x;
        }
      }
      const double mean = finite ? sum / finite : NAN;
      double var = 0;
      for (double x : v)
        if (std::isfinite(x)) var += (x - mean) * (x - mean);
      const double sd = finite ? std::sqrt(var / finite) : NAN;
      t.rows.push_back({file, nt.name, std::string(dtype_name(nt.tensor.dtype)), nt.tensor.shape_string(),
                        fmt_err(finite ? mn : NAN), fmt_err(finite ? mx : NAN), fmt_err(mean), fmt_err(sd),
                        std::to_string(nan), std::to_string(inf)});
      j.push_back({{"file", file}, {"tensor", nt.name}, {"dtype", dtype_name(nt.tensor.dtype)},
                   {"shape", nt.tensor.shape}, {"min", mn}, {"max", mx}, {"mean", mean}, {"std", sd},
                   {"nan", nan}, {"inf", inf}});
    }
  }
  std::cout << (format == "json" ? j.dump(2) + "\n" : format == "csv" ? t.csv() : t.markdown());
}

// ---- methods ---------------------------------------------------------------------------------------------
std::string type_name(const ParamInfo& p) {
  switch (p.type) {
    case ParamType::integer: return "integer";
    case ParamType::real: return "real";
    case ParamType::boolean: return "bool";
    case ParamType::text: return "text";
    case ParamType::choice: {
      std::string s;
      for (const auto& c : p.choices) s += (s.empty() ? "" : "|") + c;
      return s;
    }
  }
  return "";
}

// Markdown blocks for the docs, each between markers that scripts/doc_blocks.py finds in README.md,
// docs/dumping.md and docs/non-finite.md (and a CLI test checks there): the method table, the list of methods with
// a softmax form, and the non-finite policy per method.
void print_methods_markdown() {
  const auto begin = [](const char* block) { std::cout << "<!-- begin: qattn methods --format md, " << block << " -->\n"; };
  const auto end = [](const char* block) { std::cout << "<!-- end: " << block << " -->\n"; };
  begin("table");
  std::cout << "| method | kind | what it is | presets | doc |\n|---|---|---|---|---|\n";
  for (const auto& e : registry().entries()) {
    std::string presets;
    for (const auto& p : e.presets)
      presets += (presets.empty() ? "" : ", ") + ("`@" + p.name + "`") +
                 (p.alias_of.empty() ? "" : " (old spelling of `@" + p.alias_of + "`)");
    std::cout << "| `" << e.name << "` | " << method_kind_name(e.kind) << " | " << e.summary << " | "
              << (presets.empty() ? "-" : presets) << " | " << e.doc << " |\n";
  }
  end("table");
  std::cout << "\n";
  begin("softmax models");
  std::string names;
  for (const auto& e : registry().entries())
    if (e.has_softmax_form()) names += (names.empty() ? "`" : ", `") + e.name + "`";
  std::cout << names << "\n";
  end("softmax models");
  std::cout << "\n";
  begin("non-finite");
  std::cout << "| method | overflow rule | NaN (Q, K, V, logits) | +inf | −inf | finite inputs whose logits overflow the "
               "method's format |\n|---|---|---|---|---|---|\n";
  for (const auto& e : registry().entries())
    std::cout << "| `" << e.name << "` | " << (e.overflow == OverflowRule::refuse ? "refuse" : "propagate")
              << " | refused | refused | "
              << (e.has_softmax_form() ? "logits: masked (P = 0); Q, K, V: refused"
                                       : "Q, K, V: refused (no logits input; masks are −inf logits inside)")
              << " | " << e.overflow_note << " |\n";
  end("non-finite");
}

// The parts of a flash-kernel method's description (at `spec`) that no measured vector validates; nullopt for a
// method that is not a flash kernel, or that takes no spec without a value (file).
std::optional<std::vector<std::string>> unvalidated_parts(const std::string& spec) {
  try {
    const std::unique_ptr<Method> m = registry().create(spec);
    if (const std::optional<ref::FlashKernel> k = ref::kernel_of(*m)) return ref::kernel_unvalidated_parts(*k);
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : "; ") + p;
  return s;
}

void run_methods(const std::string& format) {
  if (format == "md") return print_methods_markdown();
  if (format == "json") {
    json j = json::array();
    auto entries = registry().entries();
    for (const auto& e : ref::kv_registry().params().entries()) entries.push_back(e), entries.back().summary = "[--kv] " + e.summary;
    for (const auto& e : ref::weight_registry().params().entries())
      entries.push_back(e), entries.back().summary = "[--weights] " + e.summary;
    for (const auto& e : entries) {
      json params = json::array();
      for (const auto& p : e.params)
        params.push_back({{"key", p.key}, {"type", type_name(p)}, {"default", p.default_value}, {"doc", p.doc}});
      json presets = json::object();
      for (const auto& pr : e.presets)
        presets[pr.name] = pr.alias_of.empty() ? json{{"values", pr.values}, {"doc", pr.doc}} : json{{"alias_of", pr.alias_of}};
      json entry = {{"name", e.name}, {"summary", e.summary}, {"params", params}, {"presets", presets}};
      if (e.make) {  // the attention/softmax methods (the quantizers share the entry type but not the policy)
        entry["overflow"] = {{"rule", e.overflow == OverflowRule::refuse ? "refuse" : "propagate"},
                             {"note", e.overflow_note}};
        entry["kind"] = method_kind_name(e.kind);
        entry["doc"] = e.doc;
        entry["reference"] = e.reference;
        entry["in_default_lists"] = e.in_default_lists;
        if (!e.positional_key.empty()) entry["positional_key"] = e.positional_key;
        if (const auto parts = unvalidated_parts(e.name)) {
          entry["not_validated"] = *parts;
          for (const auto& pr : e.presets)
            if (pr.alias_of.empty())
              if (const auto pp = unvalidated_parts(e.name + "@" + pr.name)) presets[pr.name]["not_validated"] = *pp;
          entry["presets"] = presets;
        }
      }
      j.push_back(entry);
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  auto entries = registry().entries();
  const std::size_t n_methods = entries.size();
  for (const auto& e : ref::kv_registry().params().entries()) entries.push_back(e);
  const std::size_t n_kv = entries.size();
  for (const auto& e : ref::weight_registry().params().entries()) entries.push_back(e);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (i == n_methods) std::cout << "\nKV-cache quantizers (qattn analyze --kv SPEC, applied to K and V before the method):\n";
    if (i == n_kv)
      std::cout << "\nWeight quantizers (qattn analyze --weights SPEC: Q, K, V from the dump's attention input and "
                   "quantized projections):\n";
    std::cout << e.name << "\n    " << e.summary << "\n";
    if (i < n_methods) std::cout << "    " << method_kind_name(e.kind) << "; " << e.doc << "\n";
    if (i < n_methods)
      std::cout << "    overflow: " << (e.overflow == OverflowRule::refuse ? "refuse" : "propagate") << " ("
                << e.overflow_note << "; docs/non-finite.md)\n";
    const auto parts = i < n_methods ? unvalidated_parts(e.name) : std::nullopt;
    if (parts && !parts->empty()) std::cout << "    not validated by measured vectors: " << joined(*parts) << "\n";
    if (e.params.empty()) std::cout << "    parameters: none\n";
    for (const auto& p : e.params)
      std::cout << "    " << p.key << "=" << p.default_value << "  [" << type_name(p) << "]  " << p.doc << "\n";
    for (const auto& pr : e.presets) {
      if (!pr.alias_of.empty()) {
        std::cout << "    @" << pr.name << ": now @" << pr.alias_of << " (the old spelling, kept for this release)\n";
        continue;
      }
      std::cout << "    @" << pr.name << ":";
      for (const auto& [k, v] : pr.values) std::cout << " " << k << "=" << v;
      std::cout << "  " << pr.doc << "\n";
      if (!parts) continue;
      if (const auto pp = unvalidated_parts(e.name + "@" + pr.name); pp && *pp != *parts)
        std::cout << "      not validated by measured vectors: " << (pp->empty() ? "(every part validated)" : joined(*pp)) << "\n";
    }
  }
}

// ---- softmax ---------------------------------------------------------------------------------------------
}  // namespace

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

namespace {

struct SoftmaxOptions {
  std::string in, name, spec, out;
  std::optional<std::int64_t> cint;
  std::optional<double> alpha;
  bool raw = false;
};

void run_softmax(const SoftmaxOptions& o) {
  const auto method = registry().create(o.spec);  // a bad spec fails before any file is touched
  if (o.cint && o.alpha) throw CLI::ValidationError("--cint/--alpha", "give one of them, not both");
  if (o.alpha && !(*o.alpha > 0 && std::isfinite(*o.alpha))) throw CLI::ValidationError("--alpha", "must be finite and > 0");
  if (o.cint && (*o.cint < 1 || *o.cint > INT32_MAX)) throw CLI::ValidationError("--cint", "must be in [1, 2^31 - 1]");
  require_tensor_extension("--out", o.out);
  require_distinct_files({{"--in", o.in}}, {{"--out", o.out}});
  const Tensor logits = pick_tensor(o.in, o.name);
  require_finite_tensor(logits, o.in, o.name.empty() ? "logits" : o.name, /*masked_ok=*/true);
  if (logits.shape.empty() || logits.shape.back() == 0)
    throw InputError(o.in, "shape", "softmax needs at least one axis of non-zero length, got " + logits.shape_string());
  const RowMatrixXd rows = logits.as_rows();
  RowMatrixXd p;
  std::optional<Tensor> raw;
  if (dtype_is_float(logits.dtype)) {
    if (o.cint || o.alpha)
      throw CLI::ValidationError("--cint/--alpha", "apply to integer logits only; " + o.in + " holds " +
                                                      std::string(dtype_name(logits.dtype)));
    p = with_source(o.in, o.spec, [&] { return method->softmax_rows(rows); });
  } else {
    if (!o.cint && !o.alpha)
      throw CLI::ValidationError("--cint/--alpha", o.in + " holds integer logits (" + std::string(dtype_name(logits.dtype)) +
                                                      "): give their clip --cint N or their scale --alpha A");
    RowMatrixXi32 values(rows.rows(), rows.cols());
    for (Eigen::Index i = 0; i < rows.size(); ++i) {
      const double v = rows.data()[i];
      if (v < INT32_MIN || v > INT32_MAX)
        throw InputError(o.in, "values", "integer logit " + std::to_string(v) + " does not fit int32");
      values.data()[i] = static_cast<std::int32_t>(v);
    }
    const IntegerLogits il{values, o.cint, o.alpha};
    IntegerSoftmaxResult r = with_source(o.in, o.spec, [&] { return method->softmax_integer(il); });
    p = std::move(r.probabilities);
    raw = std::move(r.raw);
  }
  if (o.raw) {
    if (!raw) throw CLI::ValidationError("--raw", "method '" + o.spec + "' produces no integer P here; drop --raw");
    raw->shape = logits.shape;
    return write_file_atomic(o.out, encode_output(o.out, {{"p", std::move(*raw)}}));
  }
  write_file_atomic(o.out, encode_output(o.out, {{"p", Tensor::from_double(DType::f64, logits.shape,
                                                                           std::span(p.data(), static_cast<std::size_t>(p.size())))}}));
}

// ---- compare ---------------------------------------------------------------------------------------------

// The metrics of A against B, in chunks of whole rows of the last axis (about 2^16 values each, fixed by the shape)
// on `threads` workers, each chunk's partial sums folded in chunk order (qattn/eval/panel_metrics.h): the same
// figures for every thread count; the median is exact. KL (D(A || B) per row) where both are probability rows.
void run_compare(const std::string& a, const std::string& b, const std::string& name, const std::string& format,
                 int threads) {
  const Tensor ta = pick_tensor(a, name), tb = pick_tensor(b, name);
  if (ta.shape != tb.shape)
    throw InputError(b, "shape", tb.shape_string() + " differs from " + ta.shape_string() + " of " + a);
  const Eigen::ArrayXd va = ta.to_double(), vb = tb.to_double();
  const Eigen::Index cols = ta.shape.empty() || ta.shape.back() == 0 ? 1 : ta.shape.back();
  const Eigen::Index rows = va.size() / cols;
  bool probabilities = false;
  if (!ta.shape.empty()) {
    const RowMatrixXd ra = ta.as_rows(), rb = tb.as_rows();
    probabilities = looks_like_probability_rows(ra) && looks_like_probability_rows(rb);
  }
  const Eigen::Index chunk_rows = std::max<Eigen::Index>(1, (Eigen::Index{1} << 16) / cols);
  const std::size_t chunks = static_cast<std::size_t>((rows + chunk_rows - 1) / chunk_rows);
  std::vector<eval::PanelStats> panels(chunks);
  std::vector<eval::MetricFold> medians;
  for (std::size_t c = 0; c < chunks; ++c) medians.emplace_back(true);
  parallel_for(chunks, resolve_threads(threads), [&](std::size_t c) {
                 const Eigen::Index r0 = static_cast<Eigen::Index>(c) * chunk_rows, n = std::min(chunk_rows, rows - r0);
                 const double* pa = va.data() + r0 * cols;
                 const double* pb = vb.data() + r0 * cols;
                 panels[c] = eval::panel_stats(pa, pb, static_cast<std::size_t>(n * cols));
                 if (probabilities) eval::add_panel_kl(panels[c], pa, pb, n, cols);
                 medians[c].add_errors(pa, pb, static_cast<std::size_t>(n * cols));
               });
  eval::MetricFold fold(true);
  for (std::size_t c = 0; c < chunks; ++c) {
    fold.add(panels[c]);
    fold.merge_errors(medians[c]);
  }
  const ErrorStats s = fold.stats();
  json j = stats_json(s);
  std::optional<KlStats> kl;
  if (probabilities) kl = fold.kl();
  if (kl) j["kl_a_b"] = {{"mean", exact_number(kl->mean)}, {"max", exact_number(kl->max)}};
  if (format == "json") {
    std::cout << j.dump(2) << "\n";
    return;
  }
  Table t{{"metric", "value"}, {}};
  t.rows = {{"elements", std::to_string(s.count)},  {"non-finite", std::to_string(s.nonfinite)},
            {"CosSim", fmt_sim(s.cossim)},          {"1 - CosSim", fmt_err(s.one_minus_cossim)},
            {"relative L1", fmt_err(s.rel_l1)},
            {"RMSE", fmt_err(s.rmse)},              {"max |A-B|", fmt_err(s.max_abs)},
            {"bias mean(A-B)", fmt_err(s.bias)},    {"median |A-B|", fmt_err(s.median_abs)},
            {"exact matches", std::to_string(s.zero_errors)}};
  if (kl) {
    t.rows.push_back({"KL D(A||B) mean over rows", fmt_err(kl->mean)});
    t.rows.push_back({"KL D(A||B) max over rows", fmt_err(kl->max)});
  }
  std::cout << "A = " << a << ", B = " << b << " (B is the reference)\n\n" << t.markdown() << "\n";
  Table h{{"|A-B| in", "count"}, {}};
  for (auto it = s.log2_histogram.rbegin(); it != s.log2_histogram.rend(); ++it)
    h.rows.push_back({"[2^" + std::to_string(it->first) + ", 2^" + std::to_string(it->first + 1) + ")",
                      std::to_string(it->second)});
  if (!h.rows.empty()) std::cout << h.markdown();
}





// The option checks of `qattn analyze` that CLI11 cannot express: CLI::ValidationError naming the option.
void check_analyze_options(const AnalyzeOptions& o) {
  check_format_option(o.format, {"md", "csv", "latex", "json"});
  require_threads(o.threads);
  if (o.block_rows < 0 || o.block_rows % 64 != 0 || o.block_rows > (1 << 20))
    throw CLI::ValidationError("--block-rows", "must be a multiple of 64 in [64, 1048576], or 0 (chosen from L_k); got " +
                                                   std::to_string(o.block_rows));
  SoftmaxReference reference;
  try {
    reference = parse_softmax_reference(o.reference);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--reference", e.what());
  }
  const int given = !o.q.empty() + !o.k.empty() + !o.v.empty();
  if (given != 0 && given != 3) throw CLI::ValidationError("--q/--k/--v", "give all three or none");
  if (given && o.softmax_only)
    throw CLI::ValidationError("--softmax-only", "analyses logits; give --logits or --tensors, not --q/--k/--v");
  if (reference == SoftmaxReference::exact && !o.softmax_only && o.logits.empty())
    throw CLI::ValidationError("--reference", "exact applies to softmax-only analysis (--softmax-only or --logits); "
                                              "attention is compared with fp64");
}

// What `qattn analyze` runs, resolved and validated from its options before any tensor is read: the evaluation
// layer's plan (qattn/eval/analysis.h) and the run's settings beside it.
struct AnalyzePlan {
  eval::AnalysisPlan eval;
  std::string tensors;  // the source named in the report
  int threads = 0;
  Eigen::Index block_rows = 0;
  bool whole_calls = false;
};

// The methods on the engine --engine selects (make_method), the KV and weight quantizers.
AnalyzePlan plan_analyze(const AnalyzeOptions& o) {
  AnalyzePlan plan;
  plan.eval =
      eval::plan_analysis(o.specs, o.kv, o.weights, o.softmax_only || !o.logits.empty(), parse_softmax_reference(o.reference),
                          !o.q.empty(), [&o](const MethodSpec& spec) { return make_method(spec, o.engine); });
  plan.tensors = !o.q.empty() ? o.q : !o.logits.empty() ? o.logits : o.tensors;
  plan.threads = o.threads;
  plan.block_rows = static_cast<Eigen::Index>(o.block_rows);
  plan.whole_calls = o.whole_calls;
  return plan;
}

// The run's evaluation options: threads, block rows, --whole-calls, and progress on stderr.
EvalOptions eval_options(const AnalyzePlan& plan) {
  EvalOptions options;
  options.threads = resolve_threads(plan.threads);
  options.block_rows = plan.block_rows;
  options.whole_calls = plan.whole_calls;
  options.progress = stderr_progress("qattn analyze", "blocks and calls");
  return options;
}

// The partial result of `analyze --shard K/N` (eval::analyze_shard, docs/scale-out.md).
std::string analyze_partial(const AnalyzeOptions& o, const AnalyzePlan& plan) {
  if (!o.q.empty() || !o.logits.empty())
    throw CLI::ValidationError("--shard", "splits a dump's (layer, head) pairs: give --tensors, not --q/--k/--v or --logits");
  const Shard shard = shard_option(o.shard);
  return analyze_shard(o.tensors, plan.eval, shard, eval_options(plan), o.format);
}

// --summary and --columns LIST as the evaluation layer's report options (LIST as eval::split_columns splits it).
eval::ReportOptions table_options(bool summary, const std::optional<std::string>& columns) {
  eval::ReportOptions options;
  options.summary = summary;
  if (columns) options.columns = eval::split_columns(*columns);
  return options;
}

// The report of `qattn analyze` showing what `table` chooses (docs/metrics.md, "The analysis table"). The choices
// are checked against the plan before any tensor is read.
std::string analyze_table(const AnalyzeOptions& o, const eval::ReportOptions& table) {
  check_analyze_options(o);
  const bool chosen = table.summary || !table.columns.empty();
  const std::string option = table.summary ? "--summary" : "--columns";
  if (chosen && o.format == "json")
    throw CLI::ValidationError(option, "chooses what a table shows (md, csv, latex); the JSON report keeps every row "
                                       "and metric");
  if (chosen && !o.shard.empty())
    throw CLI::ValidationError(option, "chooses what a rendered table shows; a --shard part holds every row and "
                                       "metric");
  const bool explicit_files = !o.q.empty() || !o.logits.empty();
  require_distinct_files({{"--tensors", explicit_files ? "" : o.tensors}, {"--q", o.q}, {"--k", o.k}, {"--v", o.v},
                          {"--logits", o.logits}},
                         {{"--out", o.out}});
  const AnalyzePlan plan = plan_analyze(o);
  try {
    check_report_options(report_view(plan.eval, plan.tensors, 0), table, o.format);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--columns", e.what());
  }
  if (!o.shard.empty()) return analyze_partial(o, plan);
  std::vector<DumpLayer> dump =
      !o.q.empty()        ? load_explicit(o.q, o.k, o.v, /*with_reference=*/false)
      : !o.logits.empty() ? load_explicit_logits(o.logits, plan.eval.reference)
                          : load_dump(o.tensors, plan.eval.softmax ? DumpTarget::softmax : DumpTarget::attention,
                                      plan.eval.reference,
                                      nullptr, /*with_reference=*/false);
  if (plan.eval.wq) quantize_projections(dump, o.tensors, *plan.eval.wq);
  std::size_t n_heads = 0;
  for (const DumpLayer& l : dump) n_heads += l.heads.size();
  return render_report(report_view(plan.eval, plan.tensors, n_heads),
                       eval::evaluate_plan(dump, plan.eval, eval_options(plan)),
                       o.format, table);
}

}  // namespace

std::string analyze_report(const AnalyzeOptions& o) { return analyze_table(o, {}); }

void add_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "Print dtype, shape, min/max/mean/std and NaN/Inf counts of tensor files");
  auto files = std::make_shared<std::vector<std::string>>();
  auto format = std::make_shared<std::string>("md");
  sub->add_option("files", *files, "Tensor files (.npy, .npz, .safetensors)")->required();
  sub->add_option("--format", *format, "md|csv|json")->capture_default_str();
  sub->callback([=] {
    check_format_option(*format, {"md", "csv", "json"});
    run_info(*files, *format);
  });
}

void add_methods(CLI::App& app) {
  auto* sub = app.add_subcommand("methods", "List the registered methods with their parameters, defaults and presets");
  auto format = std::make_shared<std::string>("text");
  sub->add_option("--format", *format, "text|json|md (md: the method table and the softmax-model list of the docs)")
      ->capture_default_str();
  sub->callback([=] {
    check_format_option(*format, {"text", "json", "md"});
    run_methods(*format);
  });
}

void add_softmax(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "softmax", "Row-wise softmax over the last axis with one method; writes float64 probabilities or, with --raw, "
                 "the method's integer P");
  auto o = std::make_shared<SoftmaxOptions>();
  sub->add_option("--in", o->in, "Logits file: float logits, or integer logits (INT32 Q K^T) with --cint or --alpha")
      ->required();
  sub->add_option("--name", o->name, "Tensor name inside a multi-tensor file");
  sub->add_option("--method", o->spec, "Method spec name[@preset][:key=value,...] (see `qattn methods`)")->required();
  sub->add_option("--cint", o->cint, "Integer clip threshold of integer logits, used as given");
  sub->add_option("--alpha", o->alpha, "Scale of integer logits (real = alpha * integer); the method derives c_int");
  sub->add_flag("--raw", o->raw, "Write the integer P (uint8/int8) instead of float64 probabilities");
  sub->add_option("--out", o->out, "Output .npy")->required();
  sub->callback([=] { run_softmax(*o); });
}


void add_compare(CLI::App& app) {
  auto* sub = app.add_subcommand("compare", "All error metrics of tensor A against reference tensor B");
  auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("md");
  sub->add_option("A", *a, "Tensor under test")->required();
  sub->add_option("B", *b, "Reference tensor")->required();
  sub->add_option("--name", *name, "Tensor name inside multi-tensor files");
  sub->add_option("--format", *format, "md|json")->capture_default_str();
  auto threads = std::make_shared<int>(0);
  add_threads_option(sub, *threads, "worker threads", ". The figures do not depend on it");
  sub->callback([=] {
    check_format_option(*format, {"md", "json"});
    require_threads(*threads);
    run_compare(*a, *b, *name, *format, *threads);
  });
}

void add_analyze(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "analyze", "Error of each method vs a reference, per layer/head and aggregated: attention (O and P) from Q/K/V, "
                 "or the softmax alone from dumped logits (--softmax-only)");
  auto o = std::make_shared<AnalyzeOptions>();
  auto* opt_tensors = sub->add_option("--tensors", o->tensors,
                                      "Dump: a directory of layer{L}_head{H}_{q,k,v}.npy (and/or _logits.npy), or one "
                                      ".npz/.safetensors file holding tensors of those names")
                          ->capture_default_str();
  auto* opt_q = sub->add_option("--q", o->q, "Queries [..., L_q, d] of one head (with --k and --v, instead of --tensors)");
  auto* opt_k = sub->add_option("--k", o->k, "Keys [..., L_k, d]");
  auto* opt_v = sub->add_option("--v", o->v, "Values [..., L_k, d_v]");
  auto* opt_logits = sub->add_option("--logits", o->logits, "Logits [..., L_q, L_k] of one head: softmax-only analysis");
  for (auto* opt : {opt_q, opt_k, opt_v, opt_logits}) opt->excludes(opt_tensors);
  for (auto* opt : {opt_q, opt_k, opt_v}) opt->excludes(opt_logits);
  sub->add_option("--kv", o->kv,
                  "KV-cache quantizer spec applied to K and V before every method (see `qattn methods`), e.g. "
                  "turboquant:bits=3, kivi, flashq@mixed");
  sub->add_option("--weights", o->weights,
                  "Weight quantizer spec (rtn, gptq, awq; see `qattn methods`): Q, K, V recomputed from each layer's "
                  "attention input and quantized projection weights in the dump, e.g. gptq:bits=3");
  sub->add_flag("--softmax-only", o->softmax_only,
                "Evaluate the softmax models on the dump's layer{L}_head{H}_logits files instead of attention");
  sub->add_option("--reference", o->reference,
                  "fp64 (default) or exact: the 50-digit softmax rounded once to double (softmax-only analysis)")
      ->capture_default_str();
  sub->add_option("--method", o->specs,
                  "Method spec, repeatable (default: every registered method but fp64; the softmax models only with "
                  "--softmax-only, fp64 included with --reference exact)");
  sub->add_option("--format", o->format, "md|csv|latex|json (latex: a booktabs table)")->capture_default_str();
  auto summary = std::make_shared<bool>(false);
  auto columns = std::make_shared<std::optional<std::string>>();
  sub->add_flag("--summary", *summary,
                "Only each method's mean and worst rows, no per-head rows (md, csv, latex; the JSON report keeps "
                "every row)");
  sub->add_option("--columns", *columns,
                  "Comma-separated metric columns, shown in this order after layer, head and method: K_bits, V_bits "
                  "(with --kv), O_cossim, O_one_minus_cossim, O_rel_l1, O_rmse (attention), P_cossim, "
                  "P_one_minus_cossim, P_rel_l1, P_rmse, P_max_abs, P_bias, P_kl_mean (md, csv, latex; default: all)");
  sub->add_option("--out", o->out, "Write the table here instead of stdout");
  sub->add_option("--shard", o->shard,
                  "K/N: evaluate only block K (0-based) of N of the dump's (layer, head) pairs and write a partial "
                  "result (JSON) for `qattn merge` (docs/scale-out.md)");
  add_threads_option(sub, o->threads, "worker threads over (head, block of query rows) items",
                     ". The tables do not depend on it (docs/streaming.md)");
  sub->add_option("--block-rows", o->block_rows,
                  "query rows per streamed block, a multiple of 64; 0 (default): about 2^20 / L_k. The tables do not "
                  "depend on it (docs/streaming.md)")
      ->capture_default_str();
  sub->add_flag("--whole-calls", o->whole_calls,
                "run every method on whole attention calls, none in blocks (memory O(L_q L_k) per call): a check that "
                "streaming changes no figure (docs/streaming.md)");
  add_engine_options(sub, o->engine);
  sub->callback([=] { emit(analyze_table(*o, table_options(*summary, *columns)), o->out); });
}

}  // namespace qattn::cli
