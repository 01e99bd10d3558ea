// The run's configs and training position as trainer_state.json records them (checkpoint.h):
// to JSON through the tables of fields and settings, and back with every key type-checked.
#include <optional>
#include <string>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/setting_tables.h"
#include "io/json_fields.h"
#include "runtime/checkpoint.h"

namespace tandem::runtime {

using Json = nlohmann::json;
using io::JsonFields;

Json config_to_json(const ModelConfig& m) {
  Json j = Json::object();
  for (const ModelField& f : model_fields()) {
    std::visit([&](auto member) { j[field_json_key(f)] = m.*member; }, f.member);
  }
  return j;
}

// The training settings a checkpoint keeps (Saved other than kNo in train_settings,
// Note [Every setting declared once] in core/settings.h), by their JSON keys.
Json config_to_json(const TrainConfig& t) {
  TrainConfig copy = t;
  Json j = Json::object();
  for (const Setting& s : train_settings(copy)) {
    if (s.saved != Saved::kNo) j[setting_json_key(s.name)] = setting_to_json(s);
  }
  return j;
}

ModelConfig model_config_from_json(const Json& j, const std::string& where) {
  const JsonFields f(j, where);
  ModelConfig m;
  // Checkpoints written before the setting existed hold an LM head of its own.
  m.untie_embeddings_and_output_weights = true;
  for (const ModelField& field : model_fields()) {
    const std::string key = field_json_key(field);
    if (!field.in_every_checkpoint && !j.contains(key)) continue;  // the default's model
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(m.*member)>;
          if constexpr (std::is_same_v<T, bool>)
            m.*member = f.boolean(key);
          else if constexpr (std::is_same_v<T, double>)
            m.*member = f.number(key);
          else if constexpr (std::is_same_v<T, std::string>)
            m.*member = f.string(key);
          else
            m.*member = f.integer(key);
        },
        field.member);
  }
  try {
    m.validate();
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
  return m;
}

TrainConfig train_config_from_json(const Json& j, const std::string& where) {
  const JsonFields f(j, where);
  TrainConfig t;
  for (const Setting& s : train_settings(t)) {
    const std::string key = setting_json_key(s.name);
    if (s.saved == Saved::kNo || (!s.in_every_checkpoint && !j.contains(key))) continue;
    const std::optional<SettingValue> v = setting_from_json(s, f.get(key));
    TANDEM_CHECK(v.has_value() && value_problem(s, *v).empty(), where, "key '", key, "' is ",
                 j[key].dump(), "; expected ", valid_text(s));
    store_setting(s, *v);
  }
  // A checkpoint may record document_positions under the name of Megatron-LM's option,
  // reset_position_ids, which tandem's document positions once went by; such a run restarted
  // its positions at each document, and so does its resumption.
  if (!j.contains("document_positions") && j.contains("reset_position_ids")) {
    t.document_positions = f.boolean("reset_position_ids");
  }
  try {
    t.validate();
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
  return t;
}

TrainingPosition read_training_position(const Json& trainer_state, const std::string& where) {
  const JsonFields f(trainer_state, where);
  TrainingPosition p;
  p.iteration = f.integer("iteration");
  p.optimizer_steps = f.integer("optimizer_steps");
  p.samples_consumed = f.integer("samples_consumed");
  p.model = model_config_from_json(f.get("model"), where + "'model': ");
  p.train = train_config_from_json(f.get("train"), where + "'train': ");
  TANDEM_CHECK(p.iteration >= 0, where, "iteration ", p.iteration, " is negative");
  TANDEM_CHECK(p.optimizer_steps >= 0 && p.optimizer_steps <= p.iteration, where,
               "optimizer_steps ", p.optimizer_steps, " is outside [0, iteration ", p.iteration,
               "]");
  TANDEM_CHECK(p.iteration <= INT64_MAX / p.train.global_batch_size &&
                   p.samples_consumed == p.iteration * p.train.global_batch_size,
               where, "samples_consumed ", p.samples_consumed, " is not iteration ", p.iteration,
               " x global_batch_size ", p.train.global_batch_size);
  TANDEM_CHECK(f.unsigned_integer("seed") == p.train.seed, where, "seed ",
               f.unsigned_integer("seed"), " differs from the train config's ", p.train.seed);
  return p;
}

}  // namespace tandem::runtime
