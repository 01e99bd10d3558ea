// The --config TOML file (config_file.h), read with toml++.
#include "cli/config_file.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <variant>
#include <vector>

#include "cli/option_table.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

// The largest config file read: far above any set of options, and a bound for a path that
// never ends (/dev/zero, a pipe that keeps writing).
constexpr size_t kMaxConfigBytes = size_t{1} << 20;

// Reads the whole file; a missing or unreadable file names the path and the OS reason.
std::string read_text_file(const std::string& path) {
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), "--config ", path,
               ": is a directory; give a TOML file");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  TANDEM_CHECK(f != nullptr, "--config ", path, ": cannot open the config file (",
               std::strerror(errno), ")");
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) {
    text.append(buf, n);
    TANDEM_CHECK(text.size() <= kMaxConfigBytes, "--config ", path, ": more than ", kMaxConfigBytes,
                 " bytes; a config file is a short TOML file of options");
  }
  TANDEM_CHECK(!std::ferror(f.get()), "--config ", path, ": cannot read the config file (",
               std::strerror(errno), ")");
  return text;
}

toml::table parse_config(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw Error(detail::concat("config file ", path, ", line ", e.source().begin.line, ", column ",
                               e.source().begin.column, ": TOML syntax error: ", e.description(),
                               " (valid lines look like `num-layers = 4`, `lr = 3e-3` or "
                               "`schedule = \"1f1b\"`)"));
  }
}

std::string describe_node(const toml::node& node) {
  std::ostringstream out;
  switch (node.type()) {
    case toml::node_type::string:
      out << "the string \"" << node.as_string()->get() << '"';
      break;
    case toml::node_type::integer:
      out << "the integer " << node.as_integer()->get();
      break;
    case toml::node_type::floating_point:
      out << "the floating-point number " << node.as_floating_point()->get();
      break;
    case toml::node_type::boolean:
      out << "the boolean " << (node.as_boolean()->get() ? "true" : "false");
      break;
    case toml::node_type::table:
      out << "a table (only flat keys are supported)";
      break;
    case toml::node_type::array:
      out << "an array";
      break;
    default:
      out << "a date or time";
      break;
  }
  return out.str();
}

// A list setting's words: one string, or an array of strings and numbers (`data-path = [0.3,
// "a", 0.7, "b"]`, each number as typed on the command line); nullopt for anything else.
std::optional<SettingValue> read_list(const toml::node& node) {
  if (const auto* s = node.as_string()) return SettingValue(StringList{s->get()});
  const auto* array = node.as_array();
  if (array == nullptr || array->empty()) return std::nullopt;
  StringList out;
  for (const toml::node& item : *array) {
    if (const auto* s = item.as_string()) {
      out.push_back(s->get());
    } else if (const auto* i = item.as_integer()) {
      out.push_back(std::to_string(i->get()));
    } else if (const auto* d = item.as_floating_point()) {
      out.push_back(value_text(d->get()));
    } else {
      return std::nullopt;
    }
  }
  return SettingValue(std::move(out));
}

// The node as the spec's type, or nullopt when the TOML type does not fit. Integers are accepted
// for float options (`rotary-base = 10000`), never the other way round.
std::optional<SettingValue> read_node(const Setting& spec, const toml::node& node) {
  return std::visit(Overloaded{[&](int64_t*) -> std::optional<SettingValue> {
                                 if (const auto* i = node.as_integer())
                                   return SettingValue(i->get());
                                 return std::nullopt;
                               },
                               [&](uint64_t*) -> std::optional<SettingValue> {
                                 const auto* i = node.as_integer();
                                 if (i && i->get() >= 0)
                                   return SettingValue(static_cast<uint64_t>(i->get()));
                                 return std::nullopt;
                               },
                               [&](double*) -> std::optional<SettingValue> {
                                 if (const auto* d = node.as_floating_point())
                                   return SettingValue(d->get());
                                 if (const auto* i = node.as_integer())
                                   return SettingValue(static_cast<double>(i->get()));
                                 return std::nullopt;
                               },
                               [&](std::string*) -> std::optional<SettingValue> {
                                 if (const auto* s = node.as_string())
                                   return SettingValue(s->get());
                                 return std::nullopt;
                               },
                               [&](bool*) -> std::optional<SettingValue> {
                                 if (const auto* b = node.as_boolean())
                                   return SettingValue(b->get());
                                 return std::nullopt;
                               },
                               [&](const EnumRef&) -> std::optional<SettingValue> {
                                 if (const auto* s = node.as_string())
                                   return SettingValue(s->get());
                                 return std::nullopt;
                               },
                               [&](StringList*) { return read_list(node); }},
                    spec.ref);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_key(const Settings& specs, std::string_view key) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const Setting& spec : specs) {
    if (spec.in_file == InFile::kForbidden) continue;
    const size_t d = edit_distance(key, spec.name);
    if (d < best_distance) best_distance = d, best = spec.name;
  }
  return best;
}

// Type-checks and bound-checks one `key = value` line, and stores the value unless the command
// line gave the option.
void apply_config_entry(const CLI::App& app, const Settings& specs, const std::string& path,
                        const toml::key& key, const toml::node& node,
                        std::map<std::string, int64_t>& seen_lines, Origins& origins) {
  std::string name(key.str());
  std::replace(name.begin(), name.end(), '_', '-');
  const auto line = static_cast<int64_t>(key.source().begin.line);
  const std::string where =
      detail::concat("config file ", path, ", line ", line, ", key '", key.str(), "': ");
  const Setting* spec = find_setting(specs, name);
  TANDEM_CHECK(spec != nullptr || !node.is_table(), where,
               "tables are not supported: write the keys flat at the top of the file, e.g. "
               "`num-layers = 4`");
  TANDEM_CHECK(spec != nullptr, where, "unknown key; did you mean '", closest_key(specs, name),
               "'? (the keys are the long options of --help without the leading dashes)");
  TANDEM_CHECK(spec->in_file == InFile::kAllowed, where,
               "--config cannot be set inside a config file");
  TANDEM_CHECK(seen_lines.count(name) == 0, where, "'", name, "' is already set on line ",
               seen_lines[name], " (dashes and underscores name the same key)");
  seen_lines[name] = line;
  const std::optional<SettingValue> value = read_node(*spec, node);
  TANDEM_CHECK(value.has_value(), where, "expected ", valid_text(*spec), ", got ",
               describe_node(node), " (e.g. ", name, " = ", is_text_setting(*spec) ? "\"" : "",
               value_text(setting_value(*spec)), is_text_setting(*spec) ? "\"" : "", ")");
  const std::string problem = value_problem(*spec, *value);
  TANDEM_CHECK(problem.empty(), where, "value ", value_text(*value), " is invalid: ", problem);
  if (app.count("--" + name) == 0) {
    store_setting(*spec, *value);
    origins[name] = Origin{Origin::Source::kConfigFile, line};
  }
}

}  // namespace

void apply_config_file(const CLI::App& app, const Settings& specs, const std::string& path,
                       Origins& origins) {
  const toml::table table = parse_config(path);
  std::map<std::string, int64_t> seen_lines;  // key (with dashes) -> its line
  for (auto&& [key, node] : table)
    apply_config_entry(app, specs, path, key, node, seen_lines, origins);
}

}  // namespace tandem::cli
