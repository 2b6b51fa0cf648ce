// Experiment use-lite-e2e: every attention method and KV quantizer inside Universal Sentence Encoder Lite, end to
// end. The experiment is the Python script e2e.py in this folder (installed as share/qattn/experiments/use-lite-e2e;
// it needs the package qattn, built with -DQATTN_PYTHON=ON or installed with pip, and the model weights that
// scripts/fetch-model.sh downloads); `qattn reproduce` runs it from here with the context's options, its stdout
// being the report. See README.md.
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "experiment.h"
#include "qattn/error.h"

namespace qattn::experiments {
namespace {

namespace fs = std::filesystem;

std::string quoted(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

}  // namespace

std::string run_use_lite_e2e(const ExperimentContext& ctx) {
  // The package next to this program in a build tree (<build>/python, made with -DQATTN_PYTHON=ON); installed, the
  // interpreter finds it in dist-packages.
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::string env;
  if (!ec && fs::is_directory(self.parent_path() / "python" / "qattn", ec)) {
    const char* old = std::getenv("PYTHONPATH");
    env = "PYTHONPATH=" + quoted((self.parent_path() / "python").string() + (old && *old ? ":" + std::string(old) : "")) + " ";
  }
  const fs::path script = ctx.share_dir / "experiments" / "use-lite-e2e" / "e2e.py";
  if (!fs::is_regular_file(script, ec))
    throw InputError(script.string(), "use-lite-e2e", "the experiment's script is not installed there");
  const char* python = std::getenv("QATTN_PYTHON");
  std::string command = env + quoted(python && *python ? python : "/usr/bin/python3") + " " + quoted(script.string()) +
                        " --out-dir " + quoted(ctx.out_dir.string()) + " --tensors " + quoted(ctx.tensors);
  if (ctx.fast) command += " --fast";
  if (!ctx.plots) command += " --no-plots";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw InputError("python3", "use-lite-e2e", std::string("cannot start: ") + std::strerror(errno));
  std::string report;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) report.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code == 1 && report.empty())
      throw InputError(script.string(), "use-lite-e2e",
                       "failed (is the Python package built, -DQATTN_PYTHON=ON, and importable? its message is above)");
    throw ExperimentExit{code == 0 ? 1 : code};
  }
  return report;
}

}  // namespace qattn::experiments
