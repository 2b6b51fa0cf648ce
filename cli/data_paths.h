// Where qattn finds its own data files, relative to the running executable (never a path fixed at build time):
//   installed:   <prefix>/bin/qattn, <prefix>/share/qattn/{data/use-lite/, plots/qattn_plot.py}
//   build tree:  <build>/qattn, <build>/share/qattn/ (links CMake makes to experiments/data and cli/plots)
// QATTN_SHARE_DIR, when set, names the share/qattn directory instead; QATTN_PLOTS_DIR the plot script's directory.
#pragma once

#include <filesystem>
#include <string>

namespace qattn::cli {

// The share/qattn directory that exists next to the executable (the installed layout first), or the installed
// layout's path when neither exists: loading from it then fails naming that path.
std::filesystem::path share_dir();
// The embedded USE-Lite sample: share_dir()/data/use-lite. The default of every --tensors.
std::string default_tensors();
// The matplotlib script behind `qattn plot`: $QATTN_PLOTS_DIR/qattn_plot.py, else share_dir()/plots/qattn_plot.py.
std::filesystem::path plot_script();

}  // namespace qattn::cli
