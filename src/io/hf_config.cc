// config.json writer and reader for MixtralForCausalLM / LlamaForCausalLM (see hf_config.h).
// Defaults for absent keys are those of transformers' MixtralConfig and LlamaConfig.
#include "io/hf_config.h"

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "io/atomic_dir.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;

// Typed access to one key of the config object; every error names the source and the key.
class ConfigReader {
 public:
  ConfigReader(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error("config '" + source_ + "': key '" + key + "' " + why);
  }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) return fallback ? *fallback : missing<int64_t>(key);
    const Json& v = j_[key];
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(key, "is " + v.dump() + ", too large");
    }
    if (!v.is_number_integer()) fail(key, "is " + v.dump() + ", expected an integer");
    return v.get<int64_t>();
  }
  double number(const std::string& key, std::optional<double> fallback = std::nullopt) const {
    if (!has(key)) return fallback ? *fallback : missing<double>(key);
    const Json& v = j_[key];
    if (!v.is_number()) fail(key, "is " + v.dump() + ", expected a number");
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& v = j_[key];
    if (!v.is_boolean()) fail(key, "is " + v.dump() + ", expected true or false");
    return v.get<bool>();
  }
  std::string string(const std::string& key, std::optional<std::string> fallback = {}) const {
    if (!has(key)) return fallback ? *fallback : missing<std::string>(key);
    const Json& v = j_[key];
    if (!v.is_string()) fail(key, "is " + v.dump() + ", expected a string");
    return v.get<std::string>();
  }

 private:
  template <typename T>
  T missing(const std::string& key) const {
    fail(key, "is missing");
  }

  const Json& j_;
  std::string source_;
};

// Settings of the HF classes that would change the equations of docs/model.md.
void reject_unsupported(const ConfigReader& r, const ModelConfig& m, const std::string& type) {
  if (r.boolean("tie_word_embeddings", false)) {
    r.fail("tie_word_embeddings", "is true; tandem's lm_head is not tied to the embeddings");
  }
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", "is \"" + act + "\"; only \"silu\" (SwiGLU) is valid");
  if (r.boolean("attention_bias", false)) r.fail("attention_bias", "is true; valid: false");
  if (r.boolean("mlp_bias", false)) r.fail("mlp_bias", "is true; valid: false");
  if (r.has("rope_scaling")) r.fail("rope_scaling", "is set; only plain RoPE (null) is valid");
  // (A head count that does not divide the hidden size is reported by validate() instead.)
  if (r.has("head_dim") && m.num_attention_heads > 0 &&
      m.hidden_size % m.num_attention_heads == 0 &&
      r.integer("head_dim") != m.hidden_size / m.num_attention_heads) {
    r.fail("head_dim", "is " + std::to_string(r.integer("head_dim")) +
                           "; it must be hidden_size / num_attention_heads = " +
                           std::to_string(m.hidden_size / m.num_attention_heads));
  }
  if (type == "mixtral") {
    if (r.has("sliding_window") && r.integer("sliding_window") < m.seq_length) {
      r.fail("sliding_window", "is " + std::to_string(r.integer("sliding_window")) +
                                   ", below max_position_embeddings; valid: null");
    }
    if (r.number("router_jitter_noise", 0.0) != 0.0) {
      r.fail("router_jitter_noise", "is nonzero; valid: 0");
    }
  }
}

}  // namespace

std::string hf_config_json(const ModelConfig& model) {
  model.validate();
  nlohmann::ordered_json j;
  const bool moe = model.is_moe();
  j["architectures"] = {moe ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = moe ? "mixtral" : "llama";
  j["vocab_size"] = model.vocab_size;
  j["hidden_size"] = model.hidden_size;
  j["intermediate_size"] = model.ffn_hidden_size;
  j["num_hidden_layers"] = model.num_layers;
  j["num_attention_heads"] = model.num_attention_heads;
  j["num_key_value_heads"] = model.num_query_groups;
  j["head_dim"] = model.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = model.seq_length;
  j["rms_norm_eps"] = model.norm_epsilon;
  j["rope_theta"] = model.rotary_base;
  j["rope_scaling"] = nullptr;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = false;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  if (moe) {
    j["num_local_experts"] = model.num_experts;
    j["num_experts_per_tok"] = model.moe_router_topk;
    j["router_aux_loss_coef"] = model.moe_aux_loss_coeff;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  return j.dump(2) + "\n";
}

void save_hf_config(const std::string& path, const ModelConfig& model) {
  write_file_atomic(path, hf_config_json(model));
}

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(!j.is_discarded() && j.is_object(), "config '", source, "' is not a JSON object");
  const ConfigReader r(j, source);
  const std::string type = r.string("model_type");
  if (type != "mixtral" && type != "llama") {
    r.fail("model_type", "is \"" + type + "\"; valid: \"mixtral\" (MoE) or \"llama\" (dense)");
  }
  const std::string arch = type == "mixtral" ? "MixtralForCausalLM" : "LlamaForCausalLM";
  if (r.has("architectures")) {
    const Json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != arch) {
      r.fail("architectures",
             "is " + a.dump() + "; for model_type \"" + type + "\" valid: [\"" + arch + "\"]");
    }
  }
  const bool moe = type == "mixtral";
  ModelConfig m;
  m.vocab_size = r.integer("vocab_size");
  m.hidden_size = r.integer("hidden_size");
  m.ffn_hidden_size = r.integer("intermediate_size");
  m.num_layers = r.integer("num_hidden_layers");
  m.num_attention_heads = r.integer("num_attention_heads");
  m.num_query_groups = r.integer("num_key_value_heads", m.num_attention_heads);
  m.norm_epsilon = r.number("rms_norm_eps", moe ? 1e-5 : 1e-6);
  m.rotary_base = r.number("rope_theta", moe ? 1e6 : 1e4);
  m.seq_length = r.integer("max_position_embeddings", moe ? 4096 * 32 : 2048);
  if (moe) {
    m.num_experts = r.integer("num_local_experts", 8);
    m.moe_router_topk = r.integer("num_experts_per_tok", 2);
    m.moe_aux_loss_coeff = r.number("router_aux_loss_coef", 0.001);
    if (m.num_experts < 1) r.fail("num_local_experts", "is below 1; a Mixtral model has experts");
  } else {
    m.num_experts = 0;
  }
  reject_unsupported(r, m, type);
  try {
    m.validate();
  } catch (const Error& e) {
    throw Error("config '" + source + "': " + e.what());
  }
  return m;
}

ModelConfig load_hf_config(const std::string& path) {
  return parse_hf_config(read_file(path, 16 << 20), path);
}

}  // namespace tandem::io
