// Every setting of every table (Note [Every setting declared once] in core/settings.h) round-trips
// through each route that reads or writes it: the command line (a repeated option taking its last
// value), the --config file, and a checkpoint's record; and --help shows each under its kind.
// Oracle: a valid value other than the default, written in through the route and read back from
// the object the row points into; for the checkpoint, the training settings' JSON written and read.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cli/config_file.h"
#include "cli/option_table.h"
#include "cli/options.h"
#include "cli/plan_options.h"
#include "core/error.h"
#include "core/setting_tables.h"
#include "runtime/checkpoint.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

// A run's and `plan`'s settings over one fresh pair of objects.
struct AllSettings {
  RunOptions run;
  PlanOptions plan;
  Settings table() {
    Settings all = run_settings(run);
    for (const Setting& s : plan_settings(plan)) all.push_back(s);
    return all;
  }
};

// Candidate values of `s` as typed, other than its current value; `valid` filters them (the
// first accepted is used). Numbers move within their bounds, strings take another choice.
std::optional<std::string> other_value(const Setting& s,
                                       const std::function<bool(const std::string&)>& valid) {
  const SettingValue now = setting_value(s);
  std::vector<std::string> candidates;
  for (const std::string& c : setting_choices(s)) candidates.push_back(c);
  if (const auto* b = std::get_if<bool>(&now)) candidates = {*b ? "false" : "true"};
  if (const auto* i = std::get_if<int64_t>(&now); i && setting_choices(s).empty()) {
    for (int64_t v : {*i + 1, *i * 2, *i / 2, *i - 1, int64_t{1}, int64_t{0}})
      candidates.push_back(std::to_string(v));
  }
  if (const auto* u = std::get_if<uint64_t>(&now)) candidates = {std::to_string(*u + 1)};
  if (const auto* d = std::get_if<double>(&now)) {
    // 1e-4: a rate below the default --lr for the settings bounded by it (--min-lr,
    // --lr-warmup-init, whose defaults are 0).
    for (double v : {*d / 2, *d * 2, 0.5, 0.25, 1e-4}) candidates.push_back(value_text(v));
  }
  if ((std::holds_alternative<std::string>(now) && setting_choices(s).empty()) ||
      std::holds_alternative<StringList>(now)) {
    candidates = {"x-" + s.name};
  }
  const std::string current = value_text(now);
  for (const std::string& c : candidates) {
    SettingValue v = now;
    if (std::holds_alternative<int64_t>(now)) v = static_cast<int64_t>(std::stoll(c));
    if (std::holds_alternative<uint64_t>(now)) v = static_cast<uint64_t>(std::stoull(c));
    if (std::holds_alternative<double>(now)) v = std::stod(c);
    if (std::holds_alternative<bool>(now)) v = c == "true";
    if (std::holds_alternative<std::string>(now)) v = c;
    if (std::holds_alternative<StringList>(now)) v = StringList{c};
    if (c != current && value_problem(s, v).empty() && valid(c)) return c;
  }
  return std::nullopt;
}

std::optional<std::string> other_value(const Setting& s) {
  return other_value(s, [](const std::string&) { return true; });
}

// Parses `args` into a fresh AllSettings (CLI11 only: the values as the command line stores them).
void parse_into(AllSettings& all, const std::vector<std::string>& args) {
  CLI::App app{"tandem test"};
  add_settings(app, all.table());
  std::vector<const char*> argv = {"tandem"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

// "--name value", or "--name=value" for a flag.
std::vector<std::string> given(const Setting& s, const std::string& value) {
  if (std::holds_alternative<bool*>(s.ref)) return {"--" + s.name + "=" + value};
  return {"--" + s.name, value};
}

std::string value_of(AllSettings& all, const std::string& name) {
  const Settings table = all.table();
  return value_text(setting_value(*find_setting(table, name)));
}

TEST(Settings, EveryTableHasRowsOfEveryKindAndNamesAreUnique) {
  AllSettings all;
  const Settings table = all.table();
  std::vector<std::string> names;
  std::vector<int> per_group(static_cast<size_t>(SettingGroup::kPlan) + 1, 0);
  for (const Setting& s : table) {
    EXPECT_EQ(std::count(names.begin(), names.end(), s.name), 0) << s.name << " twice";
    names.push_back(s.name);
    per_group[static_cast<size_t>(s.group)]++;
    EXPECT_FALSE(s.help.empty()) << s.name;
  }
  for (size_t g = 0; g < per_group.size(); ++g)
    EXPECT_GT(per_group[g], 0) << setting_group_title(static_cast<SettingGroup>(g));
  EXPECT_GT(table.size(), 100u);
}

// Given once, a value lands in the row's object; given twice, the last one does (argparse's
// rule, Note [Repeated options] in cli/options.cc).
TEST(Settings, EveryOptionRoundTripsThroughTheCommandLineAndTheLastOfTwoWins) {
  AllSettings defaults;
  int checked = 0;
  for (const Setting& s : defaults.table()) {
    const std::optional<std::string> other = other_value(s);
    ASSERT_TRUE(other.has_value()) << s.name << ": no other valid value";
    const std::string initial = value_text(setting_value(s));
    AllSettings once;
    parse_into(once, given(s, *other));
    EXPECT_EQ(value_of(once, s.name), *other) << "--" << s.name;
    const bool words = std::holds_alternative<StringList*>(s.ref);
    if ((std::holds_alternative<std::string*>(s.ref) || words) && setting_choices(s).empty() &&
        initial.empty()) {
      continue;  // an empty string or list cannot be typed back as the second value
    }
    std::vector<std::string> twice = given(s, *other);
    for (const std::string& a : given(s, initial)) twice.push_back(a);
    AllSettings last;
    parse_into(last, twice);
    EXPECT_EQ(value_of(last, s.name), initial) << "--" << s.name << " twice";
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

// A list setting takes the words up to the next option; given twice, the last occurrence's words
// (argparse's nargs='*' with its last-wins rule), on the command line and in the config file
// (an array of strings and numbers, or one string).
TEST(Settings, AListTakesItsWordsAndTheLastOccurrenceWins) {
  AllSettings one;
  parse_into(one, {"--data-path", "0.3", "a", "0.7", "b", "--seed", "5"});
  EXPECT_EQ(one.run.data_path, (StringList{"0.3", "a", "0.7", "b"}));
  EXPECT_EQ(one.run.train.seed, 5u);
  AllSettings two;
  parse_into(two, {"--data-path", "0.3", "a", "0.7", "b", "--seed", "5", "--data-path", "c"});
  EXPECT_EQ(two.run.data_path, (StringList{"c"}));
  AllSettings three;
  parse_into(three, {"--train-data-path", "a", "--train-data-path", "1", "b", "2", "c"});
  EXPECT_EQ(three.run.train_data_path, (StringList{"1", "b", "2", "c"}));
  EXPECT_EQ(value_of(three, "train-data-path"), "1 b 2 c");
  EXPECT_THROW(parse_into(three, {"--data-path"}), CLI::ParseError);
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    std::string pattern = (fs::temp_directory_path() / "tandem_settings_XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());
    ::close(fd);
    path_ = pattern;
    std::ofstream(path_) << text;
  }
  ~TempFile() { fs::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `name = value` in TOML: strings quoted, numbers and booleans bare, a list's word in an array.
std::string toml_line(const Setting& s, const std::string& value) {
  if (std::holds_alternative<StringList*>(s.ref)) return s.name + " = [\"" + value + "\"]\n";
  return s.name + " = " + (is_text_setting(s) ? "\"" + value + "\"" : value) + "\n";
}

// Reads `text` as the --config file into `read` (nothing on the command line); the options'
// origins.
Origins apply_config_text(AllSettings& read, const std::string& text) {
  const TempFile file(text);
  CLI::App app{"tandem test"};
  const Settings table = read.table();
  add_settings(app, table);
  std::vector<const char*> argv = {"tandem"};
  app.parse(1, argv.data());
  Origins origins;
  apply_config_file(app, table, file.path(), origins);
  return origins;
}

TEST(Settings, EveryOptionRoundTripsThroughTheConfigFile) {
  AllSettings defaults;
  int checked = 0;
  for (const Setting& s : defaults.table()) {
    if (s.in_file == InFile::kForbidden) continue;
    const std::string other = other_value(s).value();
    AllSettings read;
    Origins origins = apply_config_text(read, toml_line(s, other));
    EXPECT_EQ(value_of(read, s.name), other) << s.name << " in the config file";
    EXPECT_EQ(origins[s.name].source, Origin::Source::kConfigFile) << s.name;
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

TEST(Settings, AListInTheConfigFileIsAnArrayOrOneString) {
  for (const auto& [text, want] :
       {std::pair{std::string("data-path = [0.3, \"a\", 0.7, \"b\"]\n"),
                  StringList{"0.3", "a", "0.7", "b"}},
        std::pair{std::string("data-path = \"corpus\"\n"), StringList{"corpus"}},
        std::pair{std::string("data-path = [\"a\", 2, \"b\"]\n"), StringList{"a", "2", "b"}}}) {
    AllSettings read;
    apply_config_text(read, text);
    EXPECT_EQ(read.run.data_path, want) << text;
  }
  for (const std::string bad : {"data-path = []\n", "data-path = [true]\n", "data-path = 3\n"}) {
    AllSettings read;
    EXPECT_THROW(apply_config_text(read, bad), Error) << bad;
  }
}

// Each training setting a checkpoint keeps (its Saved column) comes back from the checkpoint's
// JSON under its name with '_' for '-'; the others are not written.
TEST(Settings, EverySavedTrainingSettingRoundTripsThroughTheCheckpoint) {
  TrainConfig defaults;
  int saved = 0;
  for (const Setting& s : train_settings(defaults)) {
    const std::string key = setting_json_key(s.name);
    TrainConfig t;
    // The schedule's lengths in samples belong to a run by samples.
    if (s.name.starts_with("lr-") && s.name.ends_with("-samples")) {
      t.train_samples = t.train_iters * t.global_batch_size;
    }
    // The document options split on an end-of-document id (Note [Document masking] in
    // data/document_masks.h).
    const bool document =
        s.name.starts_with("reset-") || s.name == "eod-mask-loss" || s.name == "document-positions";
    if (document) t.eod_token_id = 0;
    Settings rows = train_settings(t);
    const Setting& row = *find_setting(rows, s.name);
    const auto still_valid = [&](const std::string& text) {
      TrainConfig probe = t;
      Settings probe_rows = train_settings(probe);
      const Setting& p = *find_setting(probe_rows, s.name);
      const SettingValue now = setting_value(p);
      SettingValue v = text;
      if (std::holds_alternative<int64_t>(now)) v = static_cast<int64_t>(std::stoll(text));
      if (std::holds_alternative<uint64_t>(now)) v = static_cast<uint64_t>(std::stoull(text));
      if (std::holds_alternative<double>(now)) v = std::stod(text);
      if (std::holds_alternative<bool>(now)) v = text == "true";
      store_setting(p, v);
      try {
        probe.validate();
        return true;
      } catch (const Error&) {
        return false;
      }
    };
    const std::optional<std::string> other = other_value(row, still_valid);
    ASSERT_TRUE(other.has_value()) << s.name;
    AllSettings via_cli;  // the value typed, as the command line stores it
    std::vector<std::string> args = given(row, *other);
    if (t.train_samples > 0) {
      args.push_back("--train-samples");
      args.push_back(std::to_string(t.train_samples));
    }
    if (document) {
      args.push_back("--eod-token-id");
      args.push_back("0");
    }
    parse_into(via_cli, args);
    const nlohmann::json j = runtime::config_to_json(via_cli.run.train);
    if (s.saved == Saved::kNo) {
      EXPECT_FALSE(j.contains(key)) << s.name << " is not the checkpoint's";
      continue;
    }
    ASSERT_TRUE(j.contains(key)) << s.name;
    TrainConfig back = runtime::train_config_from_json(j, "test: ");
    Settings back_rows = train_settings(back);
    EXPECT_EQ(value_text(setting_value(*find_setting(back_rows, s.name))), *other) << s.name;
    ++saved;
  }
  EXPECT_GE(saved, 15);
}

// --help lists every setting under its kind's section, in the tables' order of kinds.
TEST(Settings, HelpShowsEverySettingUnderItsKind) {
  AllSettings all;
  CLI::App app{"tandem test"};
  const Settings table = all.table();
  add_settings(app, table);
  const std::string help = app.help();
  size_t last_section = 0;
  for (int g = 0; g <= static_cast<int>(SettingGroup::kPlan); ++g) {
    const std::string title = std::string(setting_group_title(static_cast<SettingGroup>(g))) + ":";
    const size_t at = help.find("\n" + title + "\n");
    ASSERT_NE(at, std::string::npos) << title << "\n" << help;
    EXPECT_GT(at, last_section) << title;
    last_section = at;
  }
  for (const Setting& s : table) {
    const std::string title = std::string(setting_group_title(s.group)) + ":";
    const size_t section = help.find("\n" + title + "\n");
    const size_t next = help.find(":\n", section + title.size() + 2);
    // "  --name" then a space, or a newline where a long name's help starts on the next line.
    const auto ends_name = [&](size_t at) {
      const char c = help[at + s.name.size() + 4];
      return c == ' ' || c == '\n';
    };
    size_t at = help.find("  --" + s.name, section);
    while (at != std::string::npos && !ends_name(at)) at = help.find("  --" + s.name, at + 1);
    EXPECT_TRUE(at != std::string::npos && at < next) << "--" << s.name << " under " << title;
  }
}

}  // namespace
}  // namespace tandem::cli
