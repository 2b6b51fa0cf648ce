#include "data_paths.h"

#include <cstdlib>
#include <system_error>

namespace qattn::cli {
namespace fs = std::filesystem;

fs::path share_dir() {
  if (const char* dir = std::getenv("QATTN_SHARE_DIR"); dir && *dir) return fs::path(dir);
  std::error_code ec;
  const fs::path bin = fs::read_symlink("/proc/self/exe", ec).parent_path();
  // QATTN_SHARE_FROM_BIN: the install's data directory relative to its bin directory ("../share/qattn").
  const fs::path installed = (bin / QATTN_SHARE_FROM_BIN).lexically_normal(), build_tree = bin / "share" / "qattn";
  if (fs::is_directory(installed, ec)) return installed;
  if (fs::is_directory(build_tree, ec)) return build_tree;
  return installed;
}

std::string default_tensors() { return (share_dir() / "data" / "use-lite").string(); }

fs::path plot_script() {
  if (const char* dir = std::getenv("QATTN_PLOTS_DIR"); dir && *dir) return fs::path(dir) / "qattn_plot.py";
  return share_dir() / "plots" / "qattn_plot.py";
}

}  // namespace qattn::cli
