// The names of an enum's values, as specs, the CLI and reports spell them. One table per enum, in the order its
// names are listed, is the one place those names live: name_of reads it from value to name, value_named from name
// to value, so printing and parsing cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace qattn {

template <class Enum>
struct Choice {
  const char* name;
  Enum value;
};

// The name of `value` in `table`; `missing` for a value the table lacks.
template <class Enum, std::size_t N>
constexpr const char* name_of(const Choice<Enum> (&table)[N], Enum value, const char* missing = "?") {
  for (const Choice<Enum>& c : table)
    if (c.value == value) return c.name;
  return missing;
}

// The value named `name` in `table`, or nullopt where no entry has that name.
template <class Enum, std::size_t N>
constexpr std::optional<Enum> value_named(const Choice<Enum> (&table)[N], std::string_view name) {
  for (const Choice<Enum>& c : table)
    if (name == c.name) return c.value;
  return std::nullopt;
}

}  // namespace qattn
