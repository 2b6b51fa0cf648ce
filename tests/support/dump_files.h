// Fixtures of the dump reader's tests: a scratch directory removed with the object, small head tensors told apart
// by their offset, and the refusal of a dump as text.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <source_location>
#include <string>
#include <system_error>
#include <vector>

#include "qattn/eval/evaluate.h"
#include "qattn/tensor.h"
#include "support/input_error.h"

namespace qattn::test {

// A fresh directory under the system's temporary one, "qattn-<stem>-<name>-<pid>", <stem> the name of the test file
// that makes it (the caller's by default): test files that share a program (the unity build) and a `name` get two.
struct ScratchDir {
  std::filesystem::path dir;
  explicit ScratchDir(const std::string& name, std::source_location where = std::source_location::current())
      : dir(std::filesystem::temp_directory_path() /
            ("qattn-" + std::filesystem::path(where.file_name()).stem().string() + "-" + name + "-" +
             std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

// [2, 4, 8] float32 whose entries start at `offset`.
inline Tensor head_tensor(double offset) {
  std::vector<double> v(2 * 4 * 8);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = offset + 0.01 * static_cast<double>(i % 13) - 0.05;
  return Tensor::from_double(DType::f32, {2, 4, 8}, v);
}

// The InputError eval::load_dump throws on `source`, as "file: field: reason"; "" when it throws none.
inline std::string load_error(const std::filesystem::path& source) {
  return input_error_text([&] { eval::load_dump(source); });
}

}  // namespace qattn::test
