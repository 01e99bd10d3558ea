// Run options: one table of Megatron-named options drives the command line (CLI11), the --config
// TOML file (toml++) and the value checks, so the three never disagree about names or bounds.
#include "cli/options.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cli/option_table.h"
#include "cli/path_checks.h"
#include "cli/sizes.h"
#include "core/error.h"
#include "schedule/generators.h"

// Note [Exit codes]
// main() runs app.parse() and finalize_run_options() in one try block and maps
//   CLI::ParseError e  -> `int rc = app.exit(e); return rc == 0 ? 0 : 2;`
//   tandem::Error e    -> print e.what() to stderr, return 2.
// What this relies on (CLI11 2.1, App::exit): --help and --version arrive as ParseErrors with
// exit code 0 (CallForHelp, CallForAllHelp, CallForVersion); App::exit prints them to stdout and
// returns 0. Every real parse error (ExtrasError for an unknown option 109, ConversionError for a
// non-number 104, ValidationError from the checks below 105, ArgumentMismatch for a missing value
// 114, ...) is printed by App::exit to stderr as "<message>\nRun with --help for more
// information." and returns that nonzero CLI11 code, which main folds into 2. Neither
// add_run_options nor finalize_run_options writes or creates a file, so a rejected command line
// leaves the file system as it was.

namespace tandem::cli {
namespace {

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

// The valid values of a string option: its choices, or its enumeration's names.
const std::vector<std::string>& choices_of(const OptionSpec& spec) {
  if (const auto* e = std::get_if<EnumTarget>(&spec.target)) return e->names;
  return spec.choices;
}

bool is_text(const OptionSpec& spec) {
  return std::holds_alternative<std::string*>(spec.target) ||
         std::holds_alternative<EnumTarget>(spec.target);
}

std::string to_text(const Value& v) {
  return std::visit(Overloaded{[](const std::string& s) { return s; },
                               [](bool b) { return std::string(b ? "true" : "false"); },
                               [](auto x) { return detail::concat(x); }},
                    v);
}

Value current_value(const OptionSpec& spec) {
  return std::visit(Overloaded{[](const EnumTarget& e) { return Value(e.get()); },
                               [](auto* p) { return Value(*p); }},
                    spec.target);
}

void store_value(const OptionSpec& spec, const Value& v) {
  std::visit(Overloaded{[&](const EnumTarget& e) { e.set(std::get<std::string>(v)); },
                        [&](auto* p) { *p = std::get<std::remove_pointer_t<decltype(p)>>(v); }},
             spec.target);
}

std::string default_suffix(const OptionSpec& spec) {
  if (!spec.default_text.empty()) return " (default: " + spec.default_text + ")";
  const Value v = current_value(spec);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? " (default: on)" : " (default: off)";
  if (const auto* s = std::get_if<std::string>(&v); s && s->empty()) return "";
  return " (default: " + to_text(v) + ")";  // choices are shown as the value's name
}

// What a valid value looks like, for messages: "an integer >= 1", "one of: cpu, cuda".
std::string valid_text(const OptionSpec& spec) {
  const bool is_int = std::holds_alternative<int64_t*>(spec.target) ||
                      std::holds_alternative<uint64_t*>(spec.target);
  const bool is_float = std::holds_alternative<double*>(spec.target);
  std::string out;
  if (is_int || is_float) {
    out = is_int ? "an integer" : "a finite number";
    if (spec.bound == Bound::kPositive) out += is_int ? " >= 1" : " > 0";
    if (spec.bound == Bound::kNonNegative) out += " >= 0";
  } else if (std::holds_alternative<bool*>(spec.target)) {
    out = "true or false";
  } else {
    out = choices_of(spec).empty() ? "a string" : "one of: " + join(choices_of(spec), ", ");
  }
  return out;
}

// Bounds, finiteness and choices; returns the problem, or "" when the value is valid.
std::string value_problem(const OptionSpec& spec, const Value& v) {
  bool ok = true;
  if (const auto* i = std::get_if<int64_t>(&v)) {
    ok = spec.bound == Bound::kAny || *i >= (spec.bound == Bound::kPositive ? 1 : 0);
  } else if (const auto* d = std::get_if<double>(&v)) {
    ok = std::isfinite(*d) && (spec.bound != Bound::kPositive || *d > 0) &&
         (spec.bound != Bound::kNonNegative || *d >= 0);
  } else if (const auto* u = std::get_if<uint64_t>(&v)) {
    ok = spec.bound != Bound::kPositive || *u >= 1;
  } else if (const auto* s = std::get_if<std::string>(&v); s && !choices_of(spec).empty()) {
    const std::vector<std::string>& choices = choices_of(spec);
    ok = std::find(choices.begin(), choices.end(), *s) != choices.end();
  }
  return ok ? "" : "it must be " + valid_text(spec);
}

// CLI11 validator for integer options: plain decimal only. Without it strtoll's base 0 would
// read "010" as 8, and strtoull would turn "-1" into 2^64-1 for the seed.
std::string check_decimal(const std::string& s, Bound bound, bool is_unsigned) {
  size_t digits_from = (!s.empty() && s[0] == '-') ? 1 : 0;
  const bool digits =
      s.size() > digits_from && std::all_of(s.begin() + static_cast<std::ptrdiff_t>(digits_from),
                                            s.end(), [](char c) { return c >= '0' && c <= '9'; });
  const bool leading_zero = digits && s.size() > digits_from + 1 && s[digits_from] == '0';
  if (!digits || leading_zero) return s + " is not a whole decimal number (e.g. 4)";
  if (digits_from == 1 && (is_unsigned || bound != Bound::kAny))
    return s + " is negative: it must be >= " + (bound == Bound::kPositive ? "1" : "0");
  // Past the type's range CLI11 would clamp the value silently: refuse it instead.
  const std::string most = is_unsigned ? "18446744073709551615" : "9223372036854775807";
  const std::string magnitude = s.substr(digits_from);
  if (magnitude.size() > most.size() || (magnitude.size() == most.size() && magnitude > most)) {
    return s + " is too large: at most " + most;
  }
  return "";
}

}  // namespace

CLI::Validator finite_number(FieldBound bound) {
  const char* what = bound == Bound::kPositive      ? "a finite number > 0"
                     : bound == Bound::kNonNegative ? "a finite number >= 0"
                                                    : "a finite number";
  return CLI::Validator(
      [bound, what](std::string& s) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool ok = used > 0 && used == s.size() && std::isfinite(v) &&
                        (bound != Bound::kPositive || v > 0) &&
                        (bound != Bound::kNonNegative || v >= 0);
        return ok ? std::string() : s + " is invalid: it must be " + what;
      },
      "", "finite");
}

CLI::Validator decimal_number(FieldBound bound, bool is_unsigned) {
  return CLI::Validator(
      [bound, is_unsigned](std::string& s) { return check_decimal(s, bound, is_unsigned); }, "",
      "decimal");
}

CLI::Option* add_named_option(CLI::App& app, const std::string& flag, const std::string& help,
                              const std::vector<std::string>& names,
                              std::function<void(const std::string&)> store) {
  // A tandem::Error from here leaves app.parse() as any other bad value does (exit 2).
  const auto parse = [flag, names, store = std::move(store)](const std::string& s) {
    TANDEM_CHECK(std::find(names.begin(), names.end(), s) != names.end(), flag, " ", s,
                 " is invalid: it must be one of: ", join(names, ", "));
    store(s);
  };
  CLI::Option* o = app.add_option_function<std::string>(flag, parse, help);
  o->type_name(join(names, "|"));
  return o;
}

schedule::ScheduleKind schedule_kind(const ParallelConfig& p) {
  return schedule::parse_schedule_kind(p.schedule);
}

void add_run_options(CLI::App& app, RunOptions& opts) {
  for (const OptionSpec& spec : option_specs(opts)) {
    const std::string flag = "--" + spec.name;
    const std::string help = spec.help + default_suffix(spec);
    std::visit(
        Overloaded{[&](bool* b) { app.add_flag(flag, *b, help); },
                   [&](const EnumTarget& e) { add_named_option(app, flag, help, e.names, e.set); },
                   [&](std::string* s) {
                     CLI::Option* o = app.add_option(flag, *s, help);
                     if (!spec.choices.empty()) o->type_name(join(spec.choices, "|"));
                     if (!spec.metavar.empty()) o->type_name(spec.metavar);
                   },
                   [&](auto* n) {
                     CLI::Option* o = app.add_option(flag, *n, help);
                     using T = std::remove_pointer_t<decltype(n)>;
                     if constexpr (std::is_integral_v<T>) {
                       const Bound bound = spec.bound;
                       o->check(CLI::Validator(
                           [bound](std::string& s) {
                             return check_decimal(s, bound, std::is_unsigned_v<T>);
                           },
                           "", "decimal"));
                     }
                   }},
        spec.target);
  }
}

namespace {

// Where each option's final value came from, for messages.
struct Origin {
  enum class Source : uint8_t {
    kDefault,
    kCommandLine,
    kConfigFile,
    kCheckpoint,
  } source = Source::kDefault;
  int64_t line = 0;  // in the config file
};
using Origins = std::map<std::string, Origin>;

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

// The node as the spec's type, or nullopt when the TOML type does not fit. Integers are accepted
// for float options (`rotary-base = 10000`), never the other way round.
std::optional<Value> read_node(const OptionSpec& spec, const toml::node& node) {
  return std::visit(Overloaded{[&](int64_t*) -> std::optional<Value> {
                                 if (const auto* i = node.as_integer()) return Value(i->get());
                                 return std::nullopt;
                               },
                               [&](uint64_t*) -> std::optional<Value> {
                                 const auto* i = node.as_integer();
                                 if (i && i->get() >= 0)
                                   return Value(static_cast<uint64_t>(i->get()));
                                 return std::nullopt;
                               },
                               [&](double*) -> std::optional<Value> {
                                 if (const auto* d = node.as_floating_point())
                                   return Value(d->get());
                                 if (const auto* i = node.as_integer())
                                   return Value(static_cast<double>(i->get()));
                                 return std::nullopt;
                               },
                               [&](std::string*) -> std::optional<Value> {
                                 if (const auto* s = node.as_string()) return Value(s->get());
                                 return std::nullopt;
                               },
                               [&](bool*) -> std::optional<Value> {
                                 if (const auto* b = node.as_boolean()) return Value(b->get());
                                 return std::nullopt;
                               },
                               [&](const EnumTarget&) -> std::optional<Value> {
                                 if (const auto* s = node.as_string()) return Value(s->get());
                                 return std::nullopt;
                               }},
                    spec.target);
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

std::string closest_key(const std::vector<OptionSpec>& specs, std::string_view key) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const OptionSpec& spec : specs) {
    if (spec.in_file == InFile::kForbidden) continue;
    const size_t d = edit_distance(key, spec.name);
    if (d < best_distance) best_distance = d, best = spec.name;
  }
  return best;
}

const OptionSpec* find_spec(const std::vector<OptionSpec>& specs, std::string_view name) {
  for (const OptionSpec& spec : specs)
    if (spec.name == name) return &spec;
  return nullptr;
}

// Type-checks and bound-checks one `key = value` line, and stores the value unless the command
// line gave the option.
void apply_config_entry(const CLI::App& app, const std::vector<OptionSpec>& specs,
                        const std::string& path, const toml::key& key, const toml::node& node,
                        std::map<std::string, int64_t>& seen_lines, Origins& origins) {
  std::string name(key.str());
  std::replace(name.begin(), name.end(), '_', '-');
  const auto line = static_cast<int64_t>(key.source().begin.line);
  const std::string where =
      detail::concat("config file ", path, ", line ", line, ", key '", key.str(), "': ");
  const OptionSpec* spec = find_spec(specs, name);
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
  const std::optional<Value> value = read_node(*spec, node);
  TANDEM_CHECK(value.has_value(), where, "expected ", valid_text(*spec), ", got ",
               describe_node(node), " (e.g. ", name, " = ", is_text(*spec) ? "\"" : "",
               to_text(current_value(*spec)), is_text(*spec) ? "\"" : "", ")");
  const std::string problem = value_problem(*spec, *value);
  TANDEM_CHECK(problem.empty(), where, "value ", to_text(*value), " is invalid: ", problem);
  if (app.count("--" + name) == 0) {
    store_value(*spec, *value);
    origins[name] = Origin{Origin::Source::kConfigFile, line};
  }
}

void apply_config_file(const CLI::App& app, const std::vector<OptionSpec>& specs,
                       const std::string& path, Origins& origins) {
  const toml::table table = parse_config(path);
  std::map<std::string, int64_t> seen_lines;  // key (with dashes) -> its line
  for (auto&& [key, node] : table)
    apply_config_entry(app, specs, path, key, node, seen_lines, origins);
}

// Options given on the command line: bounds and choices (CLI11 already checked the types).
void check_command_line_values(const std::vector<OptionSpec>& specs, const Origins& origins) {
  for (const OptionSpec& spec : specs) {
    const auto it = origins.find(spec.name);
    if (it == origins.end() || it->second.source != Origin::Source::kCommandLine) continue;
    const Value v = current_value(spec);
    const std::string problem = value_problem(spec, v);
    TANDEM_CHECK(problem.empty(), "--", spec.name, " ", to_text(v), " is invalid: ", problem);
  }
}

// Checks across options: the configs' own validate() plus the run's parallel layout and task.
void check_combinations(const RunOptions& o) {
  o.model.validate();
  o.train.validate(1);  // the data-parallel size is checked against the layout at the start
  // Note [Sizes that fit] (core/config.cc): a micro-batch's tokens index rows too.
  TANDEM_CHECK(o.train.micro_batch_size <= ((int64_t{1} << 31) - 1) / o.model.seq_length,
               "--micro-batch-size ", o.train.micro_batch_size, " x --seq-length ",
               o.model.seq_length, " tokens a micro-batch is too many: at most 2^31 - 1");
  const ParallelConfig& p = o.parallel;
  TANDEM_CHECK(!(o.mock_data && !o.data_path.empty()), "--mock-data and --data-path ", o.data_path,
               " both name the training data: give one of them");
  if (o.data_path.empty() && !o.mock_data) {
    TANDEM_CHECK(o.model.vocab_size >= 256, "--vocab-size ", o.model.vocab_size,
                 " is too small for the built-in task: its tokens are bytes (0..255), so it needs "
                 "--vocab-size >= 256 (or give --data-path)");
  }
  if (o.model.is_moe()) {
    TANDEM_CHECK(o.model.num_experts % p.expert_model_parallel_size == 0,
                 "--expert-model-parallel-size ", p.expert_model_parallel_size,
                 " does not divide --num-experts ", o.model.num_experts,
                 ": choose a divisor of the number of experts");
  } else {
    TANDEM_CHECK(p.expert_model_parallel_size == 1, "--expert-model-parallel-size ",
                 p.expert_model_parallel_size,
                 " needs experts, but --num-experts is 0 (a dense model): use 1");
  }
  const int64_t chunks = p.pipeline_model_parallel_size * p.virtual_pipeline_model_parallel_size;
  TANDEM_CHECK(o.model.num_layers >= chunks, "--num-layers ", o.model.num_layers,
               " is fewer than the ", chunks,
               " model chunks (--pipeline-model-parallel-size x "
               "--virtual-pipeline-model-parallel-size): each chunk needs at least one layer");
  TANDEM_CHECK(
      !p.pair_first_forwards ||
          (schedule_kind(p) == schedule::ScheduleKind::kCombined1f1b &&
           p.pipeline_model_parallel_size == 1 && p.virtual_pipeline_model_parallel_size == 1),
      "--pair-first-forwards pairs the first two forwards of combined-1f1b with one "
      "stage; it needs --schedule combined-1f1b (it is ",
      p.schedule, "), --pipeline-model-parallel-size 1 (it is ", p.pipeline_model_parallel_size,
      ") and --virtual-pipeline-model-parallel-size 1 (it is ",
      p.virtual_pipeline_model_parallel_size, ")");
  TANDEM_CHECK(
      o.train.rebalance_experts == 0 || (o.model.is_moe() && p.expert_model_parallel_size > 1),
      "--rebalance-experts ", o.train.rebalance_experts,
      " moves experts between expert-parallel ranks; it needs --num-experts > 0 (it is ",
      o.model.num_experts, ") and --expert-model-parallel-size > 1 (it is ",
      p.expert_model_parallel_size, "), or 0 (never)");
  // DeepSeek-V3's sequence-wise aux loss runs on the CPU only (docs/model.md "DeepSeek-V3
  // routing").
  TANDEM_CHECK(o.train.device == Device::kCPU ||
                   o.model.moe_router_load_balancing_type != "seq_aux_loss" ||
                   o.model.moe_aux_loss_coeff == 0,
               "--moe-router-load-balancing-type seq_aux_loss with --moe-aux-loss-coeff ",
               o.model.moe_aux_loss_coeff,
               " is not implemented on the GPU: use --device cpu, or --moe-aux-loss-coeff 0 (the "
               "expert bias balances without it)");
  TANDEM_CHECK(!o.train.moe_router_force_balance || !o.model.sigmoid_router(),
               "--moe-router-force-load-balancing forces the choice through the router's logits, "
               "which a sigmoid router (--moe-router-score-function sigmoid) saturates: leave it "
               "out");
  TANDEM_CHECK(o.comm_overlap != runtime::CommOverlap::kSplit || o.train.device == Device::kCUDA,
               "--comm-overlap split gives each micro-batch of a pair GPU streams of its own; it "
               "needs --device cuda (it is cpu), or use on");
  TANDEM_CHECK(o.train.moe_wgrad_merge == 1 || o.comm_overlap != runtime::CommOverlap::kSplit ||
                   p.expert_model_parallel_size == 1,
               "--moe-wgrad-merge ", o.train.moe_wgrad_merge,
               " with --comm-overlap split: the "
               "second half of a pair runs on a compute stream of its own; use --comm-overlap on "
               "or off, or --moe-wgrad-merge 1");
  TANDEM_CHECK(o.train.moe_wgrad_merge == 1 || o.model.is_moe(), "--moe-wgrad-merge ",
               o.train.moe_wgrad_merge,
               " merges the experts' weight gradients; the model has no "
               "experts (--num-experts 0): leave it at 1");
  TANDEM_CHECK(schedule_kind(p) != schedule::ScheduleKind::kInterleaved1f1b ||
                   p.virtual_pipeline_model_parallel_size >= 2,
               "--schedule interleaved-1f1b needs --virtual-pipeline-model-parallel-size >= 2 "
               "(it is ",
               p.virtual_pipeline_model_parallel_size, ")");
}

// Appends, for each --option named in `message` whose value came from the config file, where.
std::string config_file_note(const std::string& message, const Origins& origins,
                             const std::string& path) {
  std::string note;
  for (const auto& [name, origin] : origins) {
    if (origin.source != Origin::Source::kConfigFile) continue;
    const std::string flag = "--" + name;
    const size_t at = message.find(flag);
    const size_t end = at + flag.size();
    const bool whole =
        at != std::string::npos &&
        (end == message.size() ||
         !(std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-'));
    if (whole)
      note += detail::concat(note.empty() ? " [" : "; ", name, " is set in ", path, ", line ",
                             origin.line);
  }
  return note.empty() ? note : note + "]";
}

// A checkpoint's value as the spec's type; nullopt when the JSON type does not fit.
std::optional<Value> json_value(const OptionSpec& spec, const nlohmann::json& v) {
  const bool is_int = v.is_number_integer() &&
                      (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
  return std::visit(
      Overloaded{
          [&](int64_t*) { return is_int ? std::optional<Value>(v.get<int64_t>()) : std::nullopt; },
          [&](uint64_t*) {
            const bool ok = v.is_number_unsigned() || (is_int && v.get<int64_t>() >= 0);
            return ok ? std::optional<Value>(v.get<uint64_t>()) : std::nullopt;
          },
          [&](double*) {
            return v.is_number() ? std::optional<Value>(v.get<double>()) : std::nullopt;
          },
          [&](std::string*) {
            return v.is_string() ? std::optional<Value>(v.get<std::string>()) : std::nullopt;
          },
          [&](const EnumTarget&) {
            return v.is_string() ? std::optional<Value>(v.get<std::string>()) : std::nullopt;
          },
          [&](bool*) {
            return v.is_boolean() ? std::optional<Value>(v.get<bool>()) : std::nullopt;
          }},
      spec.target);
}

// Whether a checkpoint's value must equal a given one, or only fills in for an absent one.
enum class FromCheckpoint : uint8_t { kFixed, kDefault };

// Note [Options from a checkpoint], for one of its two maps.
void apply_checkpoint_map(const std::vector<OptionSpec>& specs, const nlohmann::json& values,
                          FromCheckpoint kind, const RunOptions& opts, Origins& origins) {
  if (values.is_null()) return;
  TANDEM_ASSERT(values.is_object(), "checkpoint options are not an object");
  for (const auto& [name, v] : values.items()) {
    const OptionSpec* spec = find_spec(specs, name);
    TANDEM_ASSERT(spec != nullptr, "a checkpoint sets the unknown option ", name);
    const std::optional<Value> value = json_value(*spec, v);
    TANDEM_CHECK(value.has_value() && value_problem(*spec, *value).empty(), "--load ",
                 opts.load_dir, ": the checkpoint's ", name, " is ", v.dump(), "; it must be ",
                 valid_text(*spec));
    const auto it = origins.find(name);
    if (it == origins.end() || it->second.source == Origin::Source::kDefault) {
      store_value(*spec, *value);
      origins[name].source = Origin::Source::kCheckpoint;
      continue;
    }
    if (kind == FromCheckpoint::kDefault) continue;
    const Value given = current_value(*spec);
    const std::string where =
        it->second.source == Origin::Source::kConfigFile
            ? detail::concat("in ", opts.config_file, ", line ", it->second.line)
            : std::string("on the command line");
    TANDEM_CHECK(given == *value, "--", name, " ", to_text(given), " (given ", where,
                 ") differs from the checkpoint's ", name, " ", to_text(*value), " (--load ",
                 opts.load_dir, "): leave --", name, " out to take the checkpoint's value");
  }
}

void apply_checkpoint_values(const std::vector<OptionSpec>& specs, const nlohmann::json& values,
                             const RunOptions& opts, Origins& origins) {
  TANDEM_ASSERT(values.is_object(), "checkpoint options are not an object");
  apply_checkpoint_map(specs, values.value("fixed", nlohmann::json()), FromCheckpoint::kFixed, opts,
                       origins);
  apply_checkpoint_map(specs, values.value("defaults", nlohmann::json()), FromCheckpoint::kDefault,
                       opts, origins);
}

}  // namespace

std::string canonical_options(const RunOptions& opts) {
  static const std::set<std::string> kPerProcess = {"log-json",    "trace", "node-times-out",
                                                    "routing-out", "quiet", "config"};
  RunOptions copy = opts;
  std::string out;
  for (const OptionSpec& spec : option_specs(copy)) {
    if (kPerProcess.count(spec.name)) continue;
    const Value v = current_value(spec);
    // Doubles in full (17 digits): two ranks' values differ wherever their bits do.
    const std::string text = std::holds_alternative<double>(v)
                                 ? detail::concat(std::setprecision(17), std::get<double>(v))
                                 : to_text(v);
    out += spec.name + "=" + text + "\n";
  }
  return out;
}

nlohmann::json model_option_values(const ModelConfig& model) {
  ModelConfig copy = model;
  std::vector<OptionSpec> specs;
  add_model_specs(specs, copy);
  nlohmann::json out = nlohmann::json::object();
  for (const OptionSpec& spec : specs) {
    out[spec.name] =
        std::visit(Overloaded{[](const EnumTarget& e) { return nlohmann::json(e.get()); },
                              [](auto* p) { return nlohmann::json(*p); }},
                   spec.target);
  }
  return out;
}

bool defer_optimizer_by_default(const RunOptions& o) {
  const ParallelConfig& p = o.parallel;
  return o.train.device == Device::kCUDA && !o.train.use_distributed_optimizer &&
         o.model.is_moe() && p.expert_model_parallel_size > 1 &&
         schedule_kind(p) == schedule::ScheduleKind::kCombined1f1b &&
         o.comm_overlap != runtime::CommOverlap::kOff;
}

void finalize_run_options(const CLI::App& app, RunOptions& opts,
                          const CheckpointOptionsReader& read_checkpoint) {
  const std::vector<OptionSpec> specs = option_specs(opts);
  Origins origins;
  for (const OptionSpec& spec : specs) {
    if (app.count("--" + spec.name) > 0) origins[spec.name].source = Origin::Source::kCommandLine;
  }
  check_command_line_values(specs, origins);
  if (!opts.config_file.empty()) apply_config_file(app, specs, opts.config_file, origins);
  if (!opts.load_dir.empty() && read_checkpoint) {
    check_readable("--load", opts.load_dir);
    apply_checkpoint_values(specs, read_checkpoint(opts.load_dir), opts, origins);
  }
  const std::optional<double> shard = parse_size(opts.max_shard_size);
  TANDEM_CHECK(shard && *shard >= 1 && *shard < 9e18, "--max-shard-size ", opts.max_shard_size,
               " is not a size of at least one byte: use ", kSizeForms);
  opts.max_shard_bytes = static_cast<int64_t>(*shard);
  // Note [Deferred update by default]: with expert parallelism on GPUs and the all-to-all on a
  // stream of its own, the update covers the first forward's all-to-all, which it otherwise
  // leaves exposed (bench/results/gpu_multi.md measures it); the values are bitwise the same
  // either way. Elsewhere there is nothing for it to cover, so it stays off, and with the
  // distributed optimizer (which updates in its own pieces) too. A value given anywhere
  // (command line, --config) wins.
  const auto defer = origins.find("defer-optimizer");
  if (defer == origins.end() || defer->second.source == Origin::Source::kDefault) {
    opts.train.defer_optimizer = defer_optimizer_by_default(opts);
  }
  // Multi-head latent attention gives every head its own k and v: --num-query-groups, left
  // unset, follows --num-attention-heads (a value given anywhere is checked as given).
  const auto groups = origins.find("num-query-groups");
  if (opts.model.multi_latent_attention &&
      (groups == origins.end() || groups->second.source == Origin::Source::kDefault)) {
    opts.model.num_query_groups = opts.model.num_attention_heads;
  }
  try {
    check_combinations(opts);
  } catch (const Error& e) {
    throw Error(e.what() + config_file_note(e.what(), origins, opts.config_file));
  }
  check_paths(opts);
}

}  // namespace tandem::cli
