// `qattn bench-eval`: the streamed evaluation (docs/streaming.md) measured as a user runs it. For each L it writes
// one Gaussian head (Q std 3, K and V std 1, float32, [L, d]) to a scratch directory, times the anchor (one float64
// Q K^T and one P V of the same shapes, Eigen, this thread: the two GEMMs every attention evaluation contains) and
// the fp64 reference's own two products on the same head (fp64_product.h, in 64-row blocks), then
// runs `qattn analyze` on the head as a child process per configuration and reports its wall time, its peak RSS
// (the child's own, from wait4) and the time as a multiple of the anchor, with the CPU printed. At the first L it also
// checks that other thread counts, block sizes and a 3-way shard + merge write the same bytes as the first run. Before
// any of it, the methods are resolved and a trial child runs on a 64-row head, so that what a child would refuse
// fails at once; a child that fails is reported with its exit status and the end of its own stderr.
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "engine_setting.h"
#include "qattn/error.h"
#include "qattn/eval/analyze.h"
#include "qattn/reference/fp64_product.h"
#include "qattn/tensor.h"
#include "qattn/tensor_io.h"
#include "evaluate.h"
#include "removed_directory.h"

namespace qattn::cli {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct BenchEvalOptions {
  std::vector<int> lengths{4096};
  int d = 128;
  std::vector<int> threads{1, 2};
  std::vector<std::string> specs;  // empty: the registry's default list as analyze has it
  int reps = 3;
  bool check = true;
  int anchor_max_l = 32768;  // above it the anchor (an [L, L] float64 S) is not timed
};

struct ChildRun {
  double seconds = 0;
  double peak_mb = 0;  // ru_maxrss of the child
};

// The last `lines` lines of a text file (within its last 4 KiB), each indented for a message.
std::string last_lines(const fs::path& p, std::size_t lines) {
  std::ifstream f(p, std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (!f || size <= 0) return "";
  f.seekg(std::max<std::streamoff>(0, size - 4096));
  std::vector<std::string> kept;
  for (std::string line; std::getline(f, line);) {
    kept.push_back(line);
    if (kept.size() > lines) kept.erase(kept.begin());
  }
  std::string out;
  for (const std::string& line : kept) out += "  " + line + "\n";
  return out;
}

// Runs this program with `args` (stdout to /dev/null, stderr to `log`), waits, and measures it. A child that fails:
// its command, exit status (or signal) and the last lines of its stderr go to stderr, then ExitCode (the child's
// 2 or 3, else 3).
ChildRun run_self(const std::vector<std::string>& args, const fs::path& log) {
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  std::vector<std::string> all = {self};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // fork, not posix_spawn: a vfork-style child records the parent's peak RSS as its own when it execs (the anchor's
  // [L, L] matrix); a forked child's own address space starts at the parent's current RSS, a few MB here.
  const std::string log_path = log.string();
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw InputError(self, "fork", std::string("cannot start: ") + std::strerror(errno));
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    const int err = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(null, 1);
    dup2(err >= 0 ? err : null, 2);
    execv(self.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  ChildRun r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.peak_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string line;
    for (const std::string& a : args) line += " " + a;
    const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                              : "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                                    strsignal(WTERMSIG(status)) + ")";
    const std::string said = last_lines(log, 5);
    std::cout << std::flush;
    std::cerr << "qattn: error: bench-eval: the child run `qattn" << line << "` " << how
              << (said.empty() ? ", saying nothing\n" : "; the end of its stderr:\n" + said);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    throw ExitCode{code == kExitUsage || code == kExitBadInput ? code : kExitBadInput};
  }
  return r;
}

// Writes dir/layer0_head0_{q,k,v}.npy: one Gaussian head [L, d] (Q std 3, K and V std 1, float32, seeded by L),
// and returns Q, K and V as float64.
std::array<RowMatrixXd, 3> write_head(const fs::path& dir, Eigen::Index L, int d) {
  fs::create_directories(dir);
  std::mt19937_64 g(20261126 + static_cast<unsigned>(L));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::array<RowMatrixXd, 3> m;
  for (int which = 0; which < 3; ++which) {
    std::vector<float> values(static_cast<std::size_t>(L * d));
    for (float& x : values) x = n(g) * (which == 0 ? 3.0f : 1.0f);
    m[which] = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(values.data(), L, d)
                   .cast<double>();
    write_npy(dir / (std::string("layer0_head0_") + "qkv"[which] + ".npy"),
              Tensor::from_double(DType::f32, {L, d}, std::span<const double>(m[which].data(), static_cast<std::size_t>(m[which].size()))));
  }
  return m;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The anchor: median seconds of S = Q K^T then O = S V in float64 (Eigen, one thread).
double anchor_seconds(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    RowMatrixXd s = q * k.transpose();
    const RowMatrixXd o = s * v;
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (!std::isfinite(o(0, 0))) std::cerr << "";  // keeps the product from being optimised away
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The same two products as the fp64 reference forms them in an evaluation (docs/softmax-reference.md §7): block by
// block of 64 query rows, S = q_block K^T then O = S V, one thread; median seconds over the whole head.
double reference_products_seconds(const RowMatrixXd& q, const RowMatrixXd& k, const RowMatrixXd& v, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    double sink = 0;
    for (Eigen::Index r0 = 0; r0 < q.rows(); r0 += 64) {
      const RowMatrixXd s = ref::product_abt(q.middleRows(r0, std::min<Eigen::Index>(64, q.rows() - r0)), k);
      sink += ref::product_ab(s, v)(0, 0);
    }
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (!std::isfinite(sink)) std::cerr << "";  // keeps the products from being optimised away
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A trial run on a 64-row head of the same d: what a child would refuse for the head's shape (fa3-fp8 past d = 256)
// fails here, in about a second, rather than after the first head is written and the anchor timed.
void trial_run(const fs::path& dir, int d, const std::vector<std::string>& methods) {
  const fs::path trial = dir / "trial";
  write_head(trial, 64, d);
  std::vector<std::string> args = {"analyze", "--tensors", trial.string(), "--format", "json", "--threads", "1",
                                   "--out", (dir / "trial.json").string()};
  args.insert(args.end(), methods.begin(), methods.end());
  run_self(args, dir / "stderr.txt");
}

void print_header(const BenchEvalOptions& o) {
  std::string specs;
  for (const auto& s : o.specs) specs += (specs.empty() ? "" : " ") + s;
  std::cout << "qattn bench-eval: " << cpu_model() << ", " << std::thread::hardware_concurrency()
            << " hardware threads, d = " << o.d << ", methods: "
            << (o.specs.empty() ? std::string("analyze's default list") : specs)
            << "\nanchor: one float64 Q K^T plus one P V, Eigen, one thread, median of " << o.reps
            << "; the fp64 reference's two products (qattn's own, 64-row blocks), one thread, median of " << o.reps
            << "; analyze runs as a child process (peak RSS is its own)\n\n";
}

// A 3-way shard + merge of the head, each shard on one thread: the table's row, with whether the merged report has
// the bytes of the first run's.
std::vector<std::string> shard_and_merge(const fs::path& dir, const fs::path& head, const std::vector<std::string>& methods,
                                         Eigen::Index L, double anchor, const std::string& first) {
  double seconds = 0, peak = 0;
  std::vector<std::string> parts;
  for (int k = 0; k < 3; ++k) {
    const fs::path part = dir / ("part-" + std::to_string(k) + ".json");
    std::vector<std::string> args = {"analyze", "--tensors", head.string(), "--format", "json", "--threads", "1",
                                     "--shard", std::to_string(k) + "/3", "--out", part.string()};
    args.insert(args.end(), methods.begin(), methods.end());
    const ChildRun r = run_self(args, dir / "stderr.txt");
    seconds += r.seconds, peak = std::max(peak, r.peak_mb);
    parts.push_back(part.string());
  }
  std::vector<std::string> merge = {"merge"};
  merge.insert(merge.end(), parts.begin(), parts.end());
  merge.insert(merge.end(), {"--format", "json", "--out", (dir / "merged.json").string()});
  run_self(merge, dir / "stderr.txt");
  return {std::to_string(L), "3 shards + merge (sum of shard times)", fixed(seconds, 2), fixed(peak, 0),
          anchor > 0 ? fixed(seconds / anchor, 1) : "", file_bytes(dir / "merged.json") == first ? "yes" : "NO"};
}

void run_bench_eval(const BenchEvalOptions& o) {
  for (int l : o.lengths) require_range("--L", l, 64, 1 << 20);
  require_range("--d", o.d, 1, 1024);
  require_range("--reps", o.reps, 1, 100);
  for (int t : o.threads) require_range("--threads", t, 1, kMaxThreads);
  require_range("--anchor-max-L", o.anchor_max_l, 0, 1 << 20);
  // The children's methods are resolved here, as analyze resolves them, so that a spec it would refuse fails before
  // the heads are written and the anchor is timed (8.6 GB at L = 32768), with analyze's own message.
  eval::AnalysisRequest resolve;
  resolve.specs = o.specs;
  resolve.build = [](const MethodSpec& spec) { return make_method(spec, EngineSetting{}); };
  eval::plan_request(resolve);
  char tmpl[] = "/tmp/qattn-bench-eval-XXXXXX";
  if (!mkdtemp(tmpl)) throw InputError("/tmp", "scratch", "cannot create a directory");
  const fs::path dir = tmpl;
  const RemovedDirectory cleanup{dir};
  std::vector<std::string> methods;
  for (const std::string& s : o.specs) methods.insert(methods.end(), {"--method", s});
  trial_run(dir, o.d, methods);
  print_header(o);
  Table t{{"L", "run", "wall s", "peak RSS MB", "x anchor", "same bytes as the first run"}, {}};
  for (std::size_t li = 0; li < o.lengths.size(); ++li) {
    const Eigen::Index L = o.lengths[li];
    const fs::path head = dir / ("L" + std::to_string(L));
    double anchor = 0, reference = 0;
    {
      const std::array<RowMatrixXd, 3> m = write_head(head, L, o.d);
      if (L <= o.anchor_max_l) {
        anchor = anchor_seconds(m[0], m[1], m[2], o.reps);
        reference = reference_products_seconds(m[0], m[1], m[2], o.reps);
      }
    }
    if (anchor > 0) {
      t.rows.push_back({std::to_string(L), "anchor (2 GEMMs)", fixed(anchor, 3), "", "1.0", ""});
      t.rows.push_back({std::to_string(L), "fp64 reference's 2 products, 64-row blocks", fixed(reference, 3), "",
                        fixed(reference / anchor, 2), ""});
    }
    std::string first;
    auto analyze = [&](const std::string& label, std::vector<std::string> extra) {
      const fs::path out = dir / "out.json";
      std::vector<std::string> args = {"analyze", "--tensors", head.string(), "--format", "json", "--out", out.string()};
      args.insert(args.end(), methods.begin(), methods.end());
      args.insert(args.end(), extra.begin(), extra.end());
      const ChildRun r = run_self(args, dir / "stderr.txt");
      const std::string bytes = file_bytes(out);
      const bool same = first.empty() || bytes == first;
      if (first.empty()) first = bytes;
      t.rows.push_back({std::to_string(L), label, fixed(r.seconds, 2), fixed(r.peak_mb, 0),
                        anchor > 0 ? fixed(r.seconds / anchor, 1) : "", same ? "yes" : "NO"});
      std::cout << "  L = " << L << ", " << label << ": " << fixed(r.seconds, 2) << " s\n" << std::flush;
      return r;
    };
    for (int th : o.threads) analyze("--threads " + std::to_string(th), {"--threads", std::to_string(th)});
    if (li != 0 || !o.check) continue;
    analyze("--threads 3 --block-rows 64", {"--threads", "3", "--block-rows", "64"});
    analyze("--threads 2 --block-rows 192", {"--threads", "2", "--block-rows", "192"});
    t.rows.push_back(shard_and_merge(dir, head, methods, L, anchor, first));
  }
  std::cout << "\n" << t.markdown();
}

}  // namespace

void add_bench_eval(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "bench-eval", "Time and peak memory of `qattn analyze` on a generated head per L against two float64 GEMMs of "
                    "the same shapes, and the same-bytes check across threads, block sizes and shards (docs/streaming.md)");
  auto o = std::make_shared<BenchEvalOptions>();
  sub->add_option("--L", o->lengths, "sequence lengths L = L_q = L_k")->delimiter(',')->capture_default_str();
  sub->add_option("--d", o->d, "head dimension")->capture_default_str();
  sub->add_option("--threads", o->threads, "analyze --threads values, one run each")->delimiter(',')->capture_default_str();
  sub->add_option("--method", o->specs, "method spec, repeatable (default: analyze's default list)");
  sub->add_option("--reps", o->reps, "repetitions of the anchor GEMMs (median)")->capture_default_str();
  sub->add_option("--anchor-max-L", o->anchor_max_l,
                  "time the anchor only up to this L (its float64 S is L x L: 8.6 GB at 32768)")
      ->capture_default_str();
  sub->add_flag("!--no-check", o->check, "skip the same-bytes runs (other block sizes, 3 threads, shards) at the first L");
  sub->callback([=] { run_bench_eval(*o); });
}

}  // namespace qattn::cli
