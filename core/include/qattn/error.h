// Typed errors of qattn. Every error that comes from outside data (a file, a command-line spec) names where it
// came from, which field is wrong and why, so that a user can fix the input without reading code.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace qattn {

// `text` made safe to print on a terminal: control bytes (C0, DEL, the C1 range) and bytes that are not valid UTF-8
// become \xNN escapes, and text beyond `max_bytes` is cut with a note of how much was cut. Header fields of hostile
// files (escape sequences, NULs, a 900 KB descr) reach stderr only through this.
std::string printable(std::string_view text, std::size_t max_bytes = 400);

// Malformed or unsupported input data. what() reads "<source>: <field>: <reason>", each part passed through
// printable(); source(), field() and reason() return the parts as given.
class InputError : public std::runtime_error {
 public:
  InputError(std::string source, std::string field, std::string reason)
      : std::runtime_error(printable(source, 1024) + ": " + printable(field, 200) + ": " + printable(reason, 1024)),
        source_(std::move(source)), field_(std::move(field)), reason_(std::move(reason)) {}
  const std::string& source() const noexcept { return source_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string source_, field_, reason_;
};

// A method spec or parameter that does not exist or does not parse. what() lists what is valid.
class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace qattn
