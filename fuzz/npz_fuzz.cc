// Fuzz target: parse_npz on arbitrary bytes. The only acceptable failure is qattn::InputError; anything else
// (a crash, a sanitizer report, another exception escaping) is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    (void)qattn::parse_npz(std::as_bytes(std::span(data, size)), "fuzz-input");
  } catch (const qattn::InputError&) {
  }
  return 0;
}
