// A directory the CLI makes for itself (bench-eval's scratch, reproduce's and kernel check --search's staging),
// removed with everything in it when the command leaves, on success or error alike.
#pragma once

#include <filesystem>
#include <system_error>
#include <utility>

namespace qattn::cli {

// Removes `dir` and its contents on destruction, unless `keep` is set (a staging directory moved into place);
// a failure to remove is ignored, as the command's own outcome is what it reports.
struct RemovedDirectory {
  std::filesystem::path dir;
  bool keep = false;

  explicit RemovedDirectory(std::filesystem::path d) : dir(std::move(d)) {}
  RemovedDirectory(const RemovedDirectory&) = delete;
  RemovedDirectory& operator=(const RemovedDirectory&) = delete;
  ~RemovedDirectory() {
    std::error_code ignored;
    if (!keep) std::filesystem::remove_all(dir, ignored);
  }
};

}  // namespace qattn::cli
