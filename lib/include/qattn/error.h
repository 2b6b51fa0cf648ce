// Typed errors of qattn. Every error that comes from outside data (a file, a command-line spec) names where it
// came from, which field is wrong and why, so that a user can fix the input without reading code.
#pragma once

#include <stdexcept>
#include <string>

namespace qattn {

// Malformed or unsupported input data. what() reads "<source>: <field>: <reason>".
class InputError : public std::runtime_error {
 public:
  InputError(std::string source, std::string field, std::string reason)
      : std::runtime_error(source + ": " + field + ": " + reason),
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
