// The --config TOML file: its keys are the settings' names (Note [Every setting declared once] in
// core/settings.h), flat, `num-layers = 4`; a key the command line also gives keeps the command
// line's value.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>

#include "core/settings.h"

namespace tandem::cli {

// Where each setting's final value came from, for messages.
struct Origin {
  enum class Source : uint8_t {
    kDefault,
    kCommandLine,
    kConfigFile,
    kCheckpoint,
  } source = Source::kDefault;
  int64_t line = 0;  // in the config file
};
using Origins = std::map<std::string, Origin>;  // by setting name

// Whether the setting `name` was given (command line, --config file or checkpoint), not left at
// its default.
inline bool was_given(const Origins& origins, const std::string& name) {
  const auto o = origins.find(name);
  return o != origins.end() && o->second.source != Origin::Source::kDefault;
}

// Reads `path` and stores each key's value into its setting of `table` unless the command line
// (`app`) gave it, recording the line in `origins`. Throws tandem::Error naming the file, line and
// key for a syntax error, an unknown key (with the closest name), a repeated key, a value of the
// wrong type or out of its bounds.
void apply_config_file(const CLI::App& app, const Settings& table, const std::string& path,
                       Origins& origins);

}  // namespace tandem::cli
