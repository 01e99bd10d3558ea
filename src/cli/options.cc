// Run options: the settings' tables (Note [Every setting declared once] in core/settings.h) drive
// the command line (CLI11), the --config file (config_file.h) and the value checks, so the three
// never disagree about names or bounds.
#include "cli/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cli/config_file.h"
#include "cli/data_options.h"
#include "cli/megatron_options.h"
#include "cli/option_table.h"
#include "cli/path_checks.h"
#include "cli/sizes.h"
#include "core/error.h"
#include "core/footprint.h"
#include "core/setting_tables.h"
#include "ops/ops.h"

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

// Note [Repeated options]: as Megatron-LM's argparse, an option given twice takes its last value
// (`$BASE --num-layers 6` over a $BASE that sets it too); so does a flag (`--quiet
// --quiet=false`).

namespace tandem::cli {
namespace {

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

std::string default_suffix(const Setting& s) {
  if (!s.default_text.empty()) return " (default: " + s.default_text + ")";
  const SettingValue v = setting_value(s);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? " (default: on)" : " (default: off)";
  if (const auto* t = std::get_if<std::string>(&v); t && t->empty()) return "";
  if (const auto* l = std::get_if<StringList>(&v); l && l->empty()) return "";
  return " (default: " + value_text(v) + ")";  // choices are shown as the value's name
}

// CLI11 validator for integer options: plain decimal only. Without it strtoll's base 0 would
// read "010" as 8, and strtoull would turn "-1" into 2^64-1 for the seed.
std::string check_decimal(const std::string& s, FieldBound bound, bool is_unsigned) {
  size_t digits_from = (!s.empty() && s[0] == '-') ? 1 : 0;
  const bool digits =
      s.size() > digits_from && std::all_of(s.begin() + static_cast<std::ptrdiff_t>(digits_from),
                                            s.end(), [](char c) { return c >= '0' && c <= '9'; });
  const bool leading_zero = digits && s.size() > digits_from + 1 && s[digits_from] == '0';
  if (!digits || leading_zero) return s + " is not a whole decimal number (e.g. 4)";
  if (digits_from == 1 && (is_unsigned || bound != FieldBound::kAny))
    return s + " is negative: it must be >= " + (bound == FieldBound::kPositive ? "1" : "0");
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
  const char* what = bound == FieldBound::kPositive      ? "a finite number > 0"
                     : bound == FieldBound::kNonNegative ? "a finite number >= 0"
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
                        (bound != FieldBound::kPositive || v > 0) &&
                        (bound != FieldBound::kNonNegative || v >= 0);
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

void add_settings(CLI::App& app, const Settings& table) {
  for (const Setting& s : table) {
    const std::string flag = "--" + s.name;
    const std::string help = s.help + default_suffix(s);
    CLI::Option* o = std::visit(
        Overloaded{
            [&](bool* b) { return app.add_flag(flag, *b, help); },
            [&](const EnumRef& e) { return add_named_option(app, flag, help, e.names, e.set); },
            [&](std::string* t) {
              CLI::Option* opt = app.add_option(flag, *t, help);
              if (!s.choices.empty()) opt->type_name(join(s.choices, "|"));
              return opt;
            },
            [&](StringList* l) {
              // The words up to the next option; each occurrence starts the list afresh, so the
              // last one given wins (Note [Repeated options]).
              CLI::Option* opt = app.add_option(flag, *l, help);
              opt->expected(1, CLI::detail::expected_max_vector_size);
              opt->trigger_on_parse();
              return opt;
            },
            [&](auto* n) {
              CLI::Option* opt = app.add_option(flag, *n, help);
              using T = std::remove_pointer_t<decltype(n)>;
              if constexpr (std::is_integral_v<T>) {
                opt->check(decimal_number(s.bound, std::is_unsigned_v<T>));
              }
              if (!s.choices.empty()) opt->type_name(join(s.choices, "|"));
              return opt;
            }},
        s.ref);
    if (!s.metavar.empty()) o->type_name(s.metavar);
    if (!std::holds_alternative<StringList*>(s.ref)) {
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // Note [Repeated options]
    }
    o->group(setting_group_title(s.group));
  }
}

void add_run_options(CLI::App& app, RunOptions& opts) {
  add_settings(app, run_settings(opts));
  add_megatron_options(app, opts.megatron);
}

namespace {

// Options given on the command line: bounds and choices (CLI11 already checked the types).
void check_command_line_values(const Settings& table, const Origins& origins) {
  for (const Setting& s : table) {
    const auto it = origins.find(s.name);
    if (it == origins.end() || it->second.source != Origin::Source::kCommandLine) continue;
    const SettingValue v = setting_value(s);
    const std::string problem = value_problem(s, v);
    TANDEM_CHECK(problem.empty(), "--", s.name, " ", value_text(v), " is invalid: ", problem);
  }
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

// Whether a checkpoint's value must equal a given one, or only fills in for an absent one.
enum class FromCheckpoint : uint8_t { kFixed, kDefault };

// Note [Options from a checkpoint], for one of its two maps.
void apply_checkpoint_map(const Settings& specs, const nlohmann::json& values, FromCheckpoint kind,
                          const RunOptions& opts, Origins& origins) {
  if (values.is_null()) return;
  TANDEM_ASSERT(values.is_object(), "checkpoint options are not an object");
  for (const auto& [name, v] : values.items()) {
    const Setting* spec = find_setting(specs, name);
    TANDEM_ASSERT(spec != nullptr, "a checkpoint sets the unknown option ", name);
    const std::optional<SettingValue> value = setting_from_json(*spec, v);
    TANDEM_CHECK(value.has_value() && value_problem(*spec, *value).empty(), "--load ",
                 opts.load_dir, ": the checkpoint's ", name, " is ", v.dump(), "; it must be ",
                 valid_text(*spec));
    const auto it = origins.find(name);
    if (it == origins.end() || it->second.source == Origin::Source::kDefault) {
      store_setting(*spec, *value);
      origins[name].source = Origin::Source::kCheckpoint;
      continue;
    }
    if (kind == FromCheckpoint::kDefault) continue;
    const SettingValue given = setting_value(*spec);
    const std::string where =
        it->second.source == Origin::Source::kConfigFile
            ? detail::concat("in ", opts.config_file, ", line ", it->second.line)
            : std::string("on the command line");
    TANDEM_CHECK(given == *value, "--", name, " ", value_text(given), " (given ", where,
                 ") differs from the checkpoint's ", name, " ", value_text(*value), " (--load ",
                 opts.load_dir, "): leave --", name, " out to take the checkpoint's value");
  }
}

void apply_checkpoint_values(const Settings& specs, const nlohmann::json& values,
                             const RunOptions& opts, Origins& origins) {
  TANDEM_ASSERT(values.is_object(), "checkpoint options are not an object");
  apply_checkpoint_map(specs, values.value("fixed", nlohmann::json()), FromCheckpoint::kFixed, opts,
                       origins);
  apply_checkpoint_map(specs, values.value("defaults", nlohmann::json()), FromCheckpoint::kDefault,
                       opts, origins);
}

// One model, one record, as a Hugging Face config.json reads back: --kv-channels equal to
// hidden-size / num-attention-heads is the width left unset (0, head_dim null); a
// --moe-layer-freq list or expression is "1" when every layer has experts, else the 0/1 list.
// A value that does not fit the layers is left for validation to name.
void canonical_model(ModelConfig& m) {
  const std::string& freq = m.moe_layer_freq;
  const bool number = !freq.empty() && freq.find_first_not_of("0123456789") == std::string::npos;
  if (!number) {
    try {
      const std::vector<bool> moe = moe_layer_pattern(freq, m.num_layers);
      std::string list = "[";
      bool all = true;
      for (size_t l = 0; l < moe.size(); ++l) {
        list += std::string(l ? "," : "") + (moe[l] ? "1" : "0");
        all = all && moe[l];
      }
      m.moe_layer_freq = all ? "1" : list + "]";
    } catch (const Error&) {
    }
  }
  // Multi-latent attention's head widths are --qk-head-dim, --qk-pos-emb-head-dim and
  // --v-head-dim; Megatron-LM's recipes pass --kv-channels too, which MLA does not read.
  if (m.multi_latent_attention) m.kv_channels = 0;
  if (m.kv_channels > 0 && m.num_attention_heads > 0 &&
      m.hidden_size % m.num_attention_heads == 0 &&
      m.kv_channels == m.hidden_size / m.num_attention_heads) {
    m.kv_channels = 0;
  }
}

// A directory that does not exist, or exists and is empty.
bool holds_nothing(const std::string& dir) {
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (status.type() == std::filesystem::file_type::not_found) return true;
  return status.type() == std::filesystem::file_type::directory &&
         std::filesystem::is_empty(dir, ec) && !ec;
}

void check_not_megatron_checkpoint(const std::string& dir) {
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::exists(
                   std::filesystem::path(dir) / "latest_checkpointed_iteration.txt", ec),
               "--load ", dir,
               " is a Megatron-LM checkpoint (it has latest_checkpointed_iteration.txt); tandem "
               "loads its own checkpoints and Hugging Face ones (config.json and safetensors): "
               "convert it to Hugging Face form with Megatron-LM's converter and --load that "
               "(docs/checkpoints.md)");
}

// Megatron-LM's --qk-layernorm with --multi-latent-attention means the RMSNorms of the q and kv
// latents, which tandem's MLA (DeepSeek-V3's q_a_layernorm and kv_a_layernorm) always has; its
// MLA without them has no transformers class, so a run that asks for MLA must ask for them too.
// ModelConfig::qk_layernorm itself is the per-head norm of grouped-query attention (Qwen3).
void latent_norms(ModelConfig& m, const Origins& origins) {
  if (!m.multi_latent_attention) return;
  const bool asked = was_given(origins, "multi-latent-attention");
  TANDEM_CHECK(!asked || m.qk_layernorm,
               "--multi-latent-attention without --qk-layernorm: Megatron-LM's MLA then has no "
               "norms of the q and kv latents, which tandem's (DeepSeek-V3's) always has; pass "
               "--qk-layernorm (docs/megatron.md)");
  m.qk_layernorm = false;
}

}  // namespace

void validate_run_options(const RunOptions& o) {
  validate_layout(o.model, o.train, o.parallel);
  parse_recompute(o.train.recompute);  // its words (Note [Recomputed modules])
  const int64_t tp = o.parallel.tensor_model_parallel_size;
  TANDEM_CHECK(tp == 1 || (o.save_dir.empty() && o.load_dir.empty()),
               "--tensor-model-parallel-size ", tp, " with ",
               o.save_dir.empty() ? "--load " + o.load_dir : "--save " + o.save_dir,
               " is not built yet: a checkpoint holds whole tensors and the tensor-parallel shards "
               "are not gathered or split (docs/parallel.md \"Tensor parallelism\"); use "
               "--tensor-model-parallel-size 1 to save or load");
  // Megatron-LM scores an expert group by the sum of its top topk // group-topk scores;
  // transformers' DeepSeek-V3, and tandem's router, by its top 2. The two agree (DeepSeek-V3's
  // 8 and 4) where that quotient is 2; other values would route differently from Megatron-LM.
  const ModelConfig& m = o.model;
  TANDEM_CHECK(m.moe_router_num_groups == 0 ||
                   m.moe_router_topk / std::max<int64_t>(m.moe_router_group_topk, 1) == 2,
               "--moe-router-topk ", m.moe_router_topk, " with --moe-router-group-topk ",
               m.moe_router_group_topk,
               ": Megatron-LM scores each group by its best topk // group-topk experts (here ",
               m.moe_router_topk / std::max<int64_t>(m.moe_router_group_topk, 1),
               "), tandem by its best 2 (as transformers' DeepSeek-V3); give a --moe-router-topk "
               "of 2 x --moe-router-group-topk or 2 x --moe-router-group-topk + 1");
  TANDEM_CHECK(!o.log_throughput,
               "--log-throughput (Megatron-LM's TFLOP/s per GPU) is not supported: tandem counts "
               "no FLOPs per step; leave it out, the log line's tok/s is the run's throughput");
  if (o.profile) {
    TANDEM_CHECK(!o.trace_path.empty(),
                 "--profile writes tandem's measured timeline of the profiled steps: give --trace "
                 "FILE for it (each step's goes to FILE with .iterN before its extension)");
    TANDEM_CHECK(o.profile_step_end > o.profile_step_start, "--profile-step-end ",
                 o.profile_step_end, " must be above --profile-step-start ", o.profile_step_start,
                 ": no step would be profiled");
    const std::string& ranks = o.profile_ranks;
    const bool list = !ranks.empty() && ranks.front() != ',' && ranks.back() != ',' &&
                      ranks.find(",,") == std::string::npos &&
                      std::all_of(ranks.begin(), ranks.end(), [](char c) {
                        return c == ',' || std::isdigit(static_cast<unsigned char>(c));
                      });
    TANDEM_CHECK(list, "--profile-ranks ", ranks,
                 " is invalid: give world ranks >= 0, comma-separated (0,1,3)");
  }
  check_data_sources(o);
  if (o.data_path.empty() && o.train_data_path.empty() && !o.mock_data) {
    TANDEM_CHECK(o.model.vocab_size >= 256, "--vocab-size ", o.model.vocab_size,
                 " is too small for the built-in task: its tokens are bytes (0..255), so it needs "
                 "--vocab-size >= 256 (or give --data-path)");
  }
  validate_tuning(o.tuning);
  ops::check_tuning(o.tuning);
}

std::string canonical_options(const RunOptions& opts) {
  RunOptions copy = opts;
  std::string out;
  for (const Setting& s : run_settings(copy)) {
    if (s.scope == Scope::kProcess) continue;
    const SettingValue v = setting_value(s);
    // Doubles in full (17 digits): two ranks' values differ wherever their bits do.
    const std::string text = std::holds_alternative<double>(v)
                                 ? detail::concat(std::setprecision(17), std::get<double>(v))
                                 : value_text(v);
    out += s.name + "=" + text + "\n";
  }
  return out;
}

nlohmann::json model_option_values(const ModelConfig& model) {
  ModelConfig copy = model;
  nlohmann::json out = nlohmann::json::object();
  for (const Setting& s : model_settings(copy)) out[s.name] = setting_to_json(s);
  return out;
}

bool defer_optimizer_by_default(const RunOptions& o) {
  const ParallelConfig& p = o.parallel;
  return o.train.device == Device::kCUDA && !o.train.use_distributed_optimizer &&
         o.model.is_moe() && p.expert_model_parallel_size > 1 &&
         schedule_kind(p) == schedule::ScheduleKind::kCombined1f1b &&
         p.comm_overlap != CommOverlap::kOff;
}

void finalize_run_options(const CLI::App& app, RunOptions& opts,
                          const CheckpointOptionsReader& read_checkpoint, Settings own) {
  Settings table = run_settings(opts);
  table.insert(table.end(), own.begin(), own.end());
  Origins origins;
  for (const Setting& s : table) {
    if (app.count("--" + s.name) > 0) origins[s.name].source = Origin::Source::kCommandLine;
  }
  check_command_line_values(table, origins);
  const auto given = [&origins](const char* name) { return was_given(origins, name); };
  if (!opts.config_file.empty()) apply_config_file(app, table, opts.config_file, origins);
  latent_norms(opts.model, origins);
  canonical_model(opts.model);
  apply_megatron_options(opts, origins);  // before a checkpoint's values are compared
  if (!opts.load_dir.empty()) check_not_megatron_checkpoint(opts.load_dir);
  if (!opts.load_dir.empty() && opts.load_may_start_fresh && holds_nothing(opts.load_dir)) {
    opts.started_fresh = opts.load_dir;
    opts.load_dir.clear();
  }
  if (!opts.load_dir.empty() && read_checkpoint) {
    check_readable("--load", opts.load_dir);
    apply_checkpoint_values(table, read_checkpoint(opts.load_dir), opts, origins);
  }
  // Megatron-LM runs the interleaved schedule whenever a pipeline rank holds several model
  // chunks; --schedule given says otherwise (and validate_layout checks it).
  if (opts.parallel.virtual_pipeline_model_parallel_size > 1 && !given("schedule")) {
    opts.parallel.schedule = "interleaved-1f1b";
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
  if (!given("defer-optimizer")) {
    opts.train.defer_optimizer = defer_optimizer_by_default(opts);
  }
  // Megatron-LM's attention is multi-head unless --group-query-attention brings in
  // --num-query-groups, and multi-head latent attention gives every head its own k and v: left
  // unset, --num-query-groups follows --num-attention-heads (a value given anywhere, a
  // checkpoint's included, is checked as given).
  if (!given("num-query-groups")) {
    opts.model.num_query_groups = opts.model.num_attention_heads;
  }
  // Megatron-LM's multi-latent attention takes YaRN unless --rope-type says otherwise, from 4096
  // original positions. At --rotary-scaling-factor 1 YaRN's frequencies and attention scale are
  // the plain RoPE's, so the model stays "rope" there (and its HF config says so).
  if (opts.model.multi_latent_attention && !given("rope-type") &&
      opts.model.rotary_scaling_factor != 1.0) {
    opts.model.rope_type = "yarn";
  }
  if (opts.model.rope_type == "yarn" && !given("rope-original-max-position-embeddings")) {
    opts.model.rope_original_max_position = 4096;
  }
  // Megatron-LM's names of two settings tandem has under its own: each sets the other's value,
  // and a value given for both must agree.
  if (opts.train.no_check_for_nan) {
    TANDEM_CHECK(!given("nan-policy") || opts.train.non_finite_policy == NonFinitePolicy::kContinue,
                 "--no-check-for-nan-in-loss-and-grad and --nan-policy ",
                 enum_name(opts.train.non_finite_policy),
                 " disagree: the first is --nan-policy continue; give one of them");
    opts.train.non_finite_policy = NonFinitePolicy::kContinue;
  }
  if (opts.parallel.distributed_timeout_minutes > 0) {
    const double seconds = 60.0 * static_cast<double>(opts.parallel.distributed_timeout_minutes);
    TANDEM_CHECK(!given("comm-timeout") || opts.parallel.comm_timeout_s == seconds,
                 "--distributed-timeout-minutes ", opts.parallel.distributed_timeout_minutes,
                 " and --comm-timeout ", opts.parallel.comm_timeout_s,
                 " disagree: the first is --comm-timeout ", seconds, "; give one of them");
    opts.parallel.comm_timeout_s = seconds;
  }
  // A run by samples (Megatron-LM's --train-samples) runs train-samples / global-batch-size
  // steps; --train-iters given as well would be a second length.
  if (opts.train.train_samples > 0) {
    TANDEM_CHECK(!given("train-iters"), "--train-samples ", opts.train.train_samples,
                 " and --train-iters ", opts.train.train_iters,
                 " both set the run's length: give one of them");
    TANDEM_CHECK(opts.train.train_samples >= opts.train.global_batch_size, "--train-samples ",
                 opts.train.train_samples, " is less than one step of --global-batch-size ",
                 opts.train.global_batch_size, ": give at least ", opts.train.global_batch_size);
    opts.train.train_iters = opts.train.train_samples / opts.train.global_batch_size;
  }
  canonical_model(opts.model);
  try {
    validate_run_options(opts);
  } catch (const Error& e) {
    throw Error(e.what() + config_file_note(e.what(), origins, opts.config_file));
  }
  check_paths(opts);
}

}  // namespace tandem::cli
