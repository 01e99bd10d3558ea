// Note [Every setting declared once]: each setting of a run is one row of one table, and every
// place that reads or writes settings walks the tables instead of naming them again. A row holds
// the setting's name (the command-line option without its dashes, the --config file's key, and,
// with '_' for '-', the key of a checkpoint's JSON), where its value lives, its help, its bound
// and choices, its kind (--help's section), what a checkpoint keeps of it and whether every rank
// of a run must agree on it. The tables, one per kind:
//   model        model_settings (core/setting_tables.cc, from model_fields() in
//   core/model_config.cc) training     train_settings (core/setting_tables.cc) parallel
//   parallel_settings (core/setting_tables.cc) performance  tuning_settings
//   (core/setting_tables.cc; core/tuning.h) data, output the run's other options
//   (cli/option_table.cc) plan         `tandem plan`'s own (cli/plan_options.cc)
// The command line and the --config file (cli/options.cc), a checkpoint's trainer_state.json
// (runtime/checkpoint_json.cc) and what a resumed run takes from it (cli/train_checkpoint.cc), and
// the ranks' agreement check (cli::canonical_options) walk them. Cross-setting rules are checked in
// one place, cli::validate_run_options (with the layout's rules of validate_layout in
// core/config.h, which the trainer applies too).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/enum_names.h"

namespace tandem {

// The range a number may take.
enum class FieldBound : uint8_t { kAny, kNonNegative, kPositive };

// The kinds of setting, in --help's order.
enum class SettingGroup : uint8_t {
  kModel,
  kTraining,
  kParallel,
  kData,
  kOutput,
  kPerformance,
  kPlan
};
// --help's section title of a kind ("Model", "Training", ...).
const char* setting_group_title(SettingGroup g);

// What a tandem checkpoint keeps of a setting (Note [Options from a checkpoint] in cli/options.h).
enum class Saved : uint8_t {
  kNo,        // nothing
  kRecorded,  // written to trainer_state.json; a resumed run uses its own value
  kDefault,   // written; a resumed run takes it unless the command line or --config gives one
  kFixed,     // written; a resumed run takes it, and a value given must equal it
};

// Whether every rank of a run must hold the same value (a run's setting), or each process may
// hold its own (where it writes its own files, whether it prints).
enum class Scope : uint8_t { kRun, kProcess };

// Whether a setting may be a key of the --config file (--config itself may not).
enum class InFile : uint8_t { kAllowed, kForbidden };

// An enumeration's setting (Note [One name table per enumeration] in core/enum_names.h): its
// value travels as its name in the enum's table and is stored straight into the enum.
struct EnumRef {
  std::vector<std::string> names;
  std::function<std::string()> get;
  std::function<void(const std::string&)> set;  // one of `names`
};
template <class E>
EnumRef enum_ref(E* p) {
  return {enum_name_list<E>(), [p] { return std::string(enum_name(*p)); },
          [p](const std::string& name) { *p = parse_enum<E>(name).value(); }};
}

// A setting that takes one or more words, as argparse's nargs='*' (`--data-path 0.3 A 0.7 B`);
// a repeated option takes its last occurrence's words. Empty: not given.
using StringList = std::vector<std::string>;

// Where a setting's value lives, and a value of any setting.
using SettingRef =
    std::variant<int64_t*, uint64_t*, double*, std::string*, bool*, EnumRef, StringList*>;
using SettingValue = std::variant<int64_t, uint64_t, double, std::string, bool, StringList>;

inline constexpr double kNoMost = std::numeric_limits<double>::max();

struct Setting {
  std::string name;  // the long option without dashes; the TOML key
  SettingRef ref;
  std::string help;  // meaning; --help appends " (default: ...)" unless the value is ""
  FieldBound bound = FieldBound::kAny;
  double most = kNoMost;                  // a number's largest valid value
  std::vector<std::string> choices = {};  // non-empty: the only valid values (as typed)
  std::string metavar = {};               // shown in --help instead of the type
  std::string default_text = {};          // non-empty: shown as the default instead of the value
  Saved saved = Saved::kNo;
  // False for a saved setting a checkpoint may lack (written before the setting existed): the
  // checkpoint then holds its default.
  bool in_every_checkpoint = true;
  Scope scope = Scope::kRun;
  InFile in_file = InFile::kAllowed;
  SettingGroup group = SettingGroup::kTraining;  // set by the table that holds the row
};

// A table's rows point into one object: a table is made for the object it reads and writes.
using Settings = std::vector<Setting>;

// `rows`, each in the kind `group` (a table sets its rows' kind once).
Settings in_group(SettingGroup group, Settings rows);

// The setting named `name` (without dashes), or nullptr.
const Setting* find_setting(const Settings& table, const std::string& name);

SettingValue setting_value(const Setting& s);
void store_setting(const Setting& s, const SettingValue& v);
bool is_text_setting(const Setting& s);  // a string or an enumeration
// The valid values of a string setting: its choices, or its enumeration's names.
const std::vector<std::string>& setting_choices(const Setting& s);
// "4", "0.001", "true", "cpu", "0.3 A 0.7 B": a value as typed on the command line.
std::string value_text(const SettingValue& v);
// What a valid value looks like, for messages: "an integer >= 1", "one of: cpu, cuda".
std::string valid_text(const Setting& s);
// The bound, finiteness and choices of `v`; "" when it is valid, else "it must be ...".
std::string value_problem(const Setting& s, const SettingValue& v);

// A checkpoint's JSON key of a setting: its name with '_' for '-'.
std::string setting_json_key(const std::string& name);
// `v` as `s`'s type, or nullopt when the JSON type does not fit (a list: an array of strings, or
// one string).
std::optional<SettingValue> setting_from_json(const Setting& s, const nlohmann::json& v);
nlohmann::json setting_to_json(const Setting& s);

}  // namespace tandem
