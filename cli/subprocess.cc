// The programs qattn runs as children (cli/subprocess.h).
#include "subprocess.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "data_paths.h"
#include "qattn/error.h"

namespace qattn::cli {
namespace fs = std::filesystem;

int run_program(std::vector<std::string> argv_s) {
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("qattn plot: fork failed");
  if (pid == 0) {
    setenv("MPLBACKEND", "Agg", 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int run_plot_script(const std::vector<std::string>& args) {
  const fs::path script = plot_script();
  std::error_code ec;
  if (!fs::is_regular_file(script, ec))
    throw InputError(script.string(), "QATTN_PLOTS_DIR", "plot script not found (installed under share/qattn/plots; QATTN_PLOTS_DIR names its directory)");
  // The script names a sweep's preset through `qattn methods` (QATTN_CLI: this program).
  if (const fs::path self = fs::read_symlink("/proc/self/exe", ec); !ec) setenv("QATTN_CLI", self.c_str(), 1);
  const char* python = std::getenv("QATTN_PYTHON");
  std::vector<std::string> argv = {python && *python ? python : "/usr/bin/python3", script.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv);
}

}  // namespace qattn::cli
