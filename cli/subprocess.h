// The programs qattn runs as children: the plot script behind `qattn plot` and the experiments' figures, and an
// experiment that is its own program (`qattn reproduce`).
#pragma once

#include <string>
#include <vector>

namespace qattn::cli {

// Runs argv[0] with its arguments (MPLBACKEND=Agg) and waits; its exit status (127 when it cannot start).
int run_program(std::vector<std::string> argv);
// Runs the plot script (cli/plots/qattn_plot.py, found by plot_script(), data_paths.h) with args under
// $QATTN_PYTHON or /usr/bin/python3; its exit status. InputError when the script is missing.
int run_plot_script(const std::vector<std::string>& args);

}  // namespace qattn::cli
