// qattn reproduce: lists the experiments (experiments/<name>/, experiments/common/experiment.h) and runs one, staging its data
// files so that a failure leaves nothing behind. An experiment prints a deterministic report (the numbers it
// measured, the paper's numbers, a verdict) that CTest compares with the committed expected output. `qattn plot`
// renders qattn's CSV with cli/plots/qattn_plot.py, a link to python/qattn/plot.py (qattn.plot in Python).
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <span>

#include "commands.h"
#include "data_paths.h"
#include "engine_setting.h"
#include "evaluate.h"
#include "experiment.h"
#include "qattn/error.h"
#include "removed_directory.h"
#include "subprocess.h"

namespace qattn::cli {
namespace fs = std::filesystem;
namespace {
using experiments::Experiment;
using experiments::experiment_list;

struct ReproduceOptions {
  std::string name, tensors = default_tensors(), out_dir = ".", out;
  bool list = false, fast = false, no_plots = false;
  int threads = 0;
  EngineSetting engine;
};

void run_reproduce(const ReproduceOptions& o) {
  if (o.list || o.name.empty()) {
    Table t{{"experiment", "source", "claim", "command"}, {}};
    for (const auto& e : experiment_list().all()) t.rows.push_back({e.name, e.source, e.claim, e.command});
    std::cout << t.markdown();
    return;
  }
  const Experiment* it = experiment_list().find(o.name);
  if (!it) {
    std::string names;
    for (const auto& e : experiment_list().all()) names += (names.empty() ? "" : ", ") + e.name;
    throw CLI::ValidationError("NAME", "'" + o.name + "' is not an experiment (" + names + ")");
  }
  if (!it->run) {  // its own program, built next to qattn under experiments/
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    const fs::path program = self.parent_path() / "experiments" / it->program;
    if (ec || !fs::is_regular_file(program, ec))
      throw InputError(program.string(), "NAME", "'" + o.name + "' is the program " + it->program +
                                                   ": build it (cmake --build build-release --target " + it->program + ")");
    std::vector<std::string> argv = {program.string()};
    if (o.fast && it->fast) argv.push_back("--fast");
    const int rc = run_program(argv);
    if (rc != 0) throw ExitCode{rc};
    return;
  }
  require_threads(o.threads);
  require_distinct_files({{"--tensors", o.tensors}}, {{"--out", o.out}});
  // The experiment writes its data files into a staging directory beside --out-dir; they move into --out-dir (created
  // then) only once the experiment and its report have succeeded, so a failure leaves no directory and no file.
  std::error_code ec;
  const fs::path out_dir = fs::absolute(o.out_dir, ec).lexically_normal();
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw InputError(o.out_dir, "--out-dir", "exists and is not a directory");
  fs::path anchor = out_dir;  // the nearest existing ancestor, where the staging directory goes
  while (!anchor.empty() && !fs::is_directory(anchor, ec) && anchor != anchor.parent_path()) anchor = anchor.parent_path();
  std::string tmpl = (anchor / ".qattn-reproduce-XXXXXX").string();
  if (!mkdtemp(tmpl.data()))
    throw InputError(o.out_dir, "--out-dir", "cannot create a staging directory in " + anchor.string() + ": " +
                                                 std::strerror(errno));
  const fs::path staging = tmpl;
  const RemovedDirectory cleanup{staging};
  experiments::ExperimentContext ctx;
  ctx.tensors = o.tensors;
  ctx.out_dir = staging;
  ctx.fast = o.fast;
  ctx.plots = !o.no_plots;
  ctx.threads = o.threads;
  ctx.engine = o.engine;
  ctx.share_dir = share_dir();
  ctx.plot = run_plot_script;
  std::string report;
  try {
    report = it->run(ctx);
  } catch (const experiments::ExperimentExit& e) {
    throw ExitCode{e.code};
  }
  std::vector<std::unique_ptr<PendingFile>> files;
  if (!o.out.empty()) files.push_back(std::make_unique<PendingFile>(o.out, std::as_bytes(std::span(report.data(), report.size()))));
  fs::create_directories(out_dir, ec);
  if (ec) throw InputError(o.out_dir, "--out-dir", "cannot be created: " + ec.message());
  for (const auto& entry : fs::directory_iterator(staging)) {
    fs::rename(entry.path(), out_dir / entry.path().filename(), ec);
    if (ec) throw InputError((out_dir / entry.path().filename()).string(), "file", "cannot move into place: " + ec.message());
  }
  for (auto& f : files) f->commit();
  if (o.out.empty()) emit(report, "");
}

}  // namespace

void add_reproduce(CLI::App& app) {
  auto* sub = app.add_subcommand("reproduce", "Run one paper claim as an experiment (a report with a verdict, data files)");
  auto o = std::make_shared<ReproduceOptions>();
  sub->add_option("NAME", o->name, "experiment (see --list)");
  sub->add_flag("--list", o->list, "list the experiments");
  sub->add_flag("--fast", o->fast, "the reduced variant (coarser grids) that CI re-checks under sanitizers");
  sub->add_option("--tensors", o->tensors, "dump directory")->capture_default_str();
  sub->add_option("--out-dir", o->out_dir, "where data files (CSV, PNG) go")->capture_default_str();
  sub->add_option("--out", o->out, "write the report here instead of stdout");
  sub->add_flag("--no-plots", o->no_plots, "skip the figures (no Python needed)");
  add_threads_option(sub, o->threads, "worker threads");
  add_engine_options(sub, o->engine);
  sub->callback([o] { run_reproduce(*o); });
}

void add_plot(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "plot", "Render qattn CSV with matplotlib: heatmap|lines|pareto CSV -o FIG.{png,pdf,svg} [options] "
              "(python/qattn/plot.py, also qattn.plot in Python; `qattn plot heatmap --help` lists the options)");
  sub->prefix_command();  // everything after `plot` goes to the script as given
  sub->callback([sub] {
    const std::vector<std::string> args = sub->remaining();
    if (args.empty()) throw CLI::ValidationError("plot", "expected heatmap|lines|pareto CSV -o FIG");
    const int rc = run_plot_script(args);
    if (rc != 0) throw ExitCode{rc};  // the script's 2 is a usage error, 3 bad input: the program's own codes
  });
}

}  // namespace qattn::cli
