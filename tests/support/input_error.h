// The refusal a call makes, as text: tests of the error catalogue (docs/tensor-io.md) compare it with the exact
// "file: field: reason" the user reads.
#pragma once

#include <string>

#include "qattn/error.h"

namespace qattn::test {

// The what() of the InputError `f()` throws, "file: field: reason"; "" when it throws none. Any other exception
// passes through, failing the test case.
template <class F>
std::string input_error_text(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace qattn::test
