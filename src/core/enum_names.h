// Note [One name table per enumeration]: every enumeration a user types (an option's value, a
// config file's or a checkpoint's string) is spelled once, in a table of {value, name} pairs
// found by `enum_names(E{})` beside the enum's declaration. The command line parses the name
// straight into the enum (cli/options.cc), and printing, the TOML file, checkpoints and messages
// read the same table; no second list of names, no string twin of the enum.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `v` in its table ("?" for a value the table lacks, which is a bug).
template <class E>
std::string_view enum_name(E v) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (n.value == v) return n.name;
  return "?";
}

// The value named `name` (exactly as the table spells it), or nullopt.
template <class E>
std::optional<E> parse_enum(std::string_view name) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (name == n.name) return n.value;
  return std::nullopt;
}

// Another spelling of an enumeration's values (a file format's, a class name): its name of `v`
// in `table` ("?" when the table lacks it), and the value `table` names `name` (or nullopt).
template <class E, size_t N>
constexpr std::string_view name_in(const EnumName<E> (&table)[N], E v) {
  for (const EnumName<E>& n : table)
    if (n.value == v) return n.name;
  return "?";
}
template <class E, size_t N>
constexpr std::optional<E> value_in(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& n : table)
    if (name == n.name) return n.value;
  return std::nullopt;
}

// Every name, in the table's order.
template <class E>
std::vector<std::string> enum_name_list() {
  std::vector<std::string> out;
  for (const EnumName<E>& n : enum_names(E{})) out.emplace_back(n.name);
  return out;
}

// "stop, skip": the valid names for messages and help texts.
template <class E>
std::string enum_choices(std::string_view sep = ", ") {
  std::string out;
  for (const EnumName<E>& n : enum_names(E{})) {
    if (!out.empty()) out += sep;
    out += n.name;
  }
  return out;
}

}  // namespace tandem
