// A growable per-thread byte buffer for the ISA files: malloc'd, 64-byte aligned, and of internal linkage in every
// file that includes it, so that no std:: container is instantiated under an ISA's flags (the linker could keep that
// copy for the baseline code: docs/kernels.md). Declare it `static thread_local`.
#pragma once

#include <cstdlib>
#include <new>

#include "qattn/kernels.h"

namespace qattn::kernels {
namespace {  // NOLINT(google-build-namespaces): one private copy per ISA file, on purpose

class ThreadBuffer {
 public:
  ThreadBuffer() = default;
  ThreadBuffer(const ThreadBuffer&) = delete;
  ThreadBuffer& operator=(const ThreadBuffer&) = delete;
  ~ThreadBuffer() { std::free(data_); }

  // At least n bytes; the contents are not kept when it grows.
  std::uint8_t* reserve(Index n) {
    if (n > size_) {
      void* grown = std::aligned_alloc(64, static_cast<std::size_t>((n + 63) / 64 * 64));
      if (!grown) throw std::bad_alloc();
      std::free(data_);
      data_ = static_cast<std::uint8_t*>(grown), size_ = n;
    }
    return data_;
  }

 private:
  std::uint8_t* data_ = nullptr;
  Index size_ = 0;
};

}  // namespace
}  // namespace qattn::kernels
