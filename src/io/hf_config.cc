// config.json writer and reader for the transformers classes of docs/model.md "Families" (see
// hf_config.h). Defaults for absent keys are those of the transformers config classes.
//
// Note [config.json keys]: a model field that is one config.json key of one meaning in every
// family that has it names that key in model_fields() (its hf_key column, core/config.cc);
// family_keys() below lists which of them each transformers class has, with its config class's
// default where the key may be absent, and the reader and writer walk that list. The other
// fields are not one key, so the family code maps them: kv-channels is head_dim, null or the
// derived width for 0; num-experts is num_local_experts (Mixtral) or num_experts (Qwen), which
// some versions write both of; rotary-base and the RoPE scaling live in a dict as well
// (rope_parameters, rope_scaling) beside the top-level rope_theta; moe-ffn-hidden-size 0 means
// ffn-hidden-size, while moe_intermediate_size is always the width; qk-layernorm and
// moe-shared-expert-gate come with the class; moe-router-pre-softmax is norm_topk_prob negated
// (the Qwen classes; DeepSeek-V3's norm_topk_prob must be k > 1, as Megatron-LM's sigmoid
// router normalises);
// moe-layer-freq is decoder_sparse_step with mlp_only_layers; add-qkv-bias is Qwen2-MoE's
// qkv_bias, and attention_bias false elsewhere.
//
// Note [Every key is read or refused]: the reader marks each key it reads. A key that no family
// reader read and that is not in kNeutralKeys (keys that do not change the model's math: token
// ids, dtype, generation and output settings) is refused, naming it, so that a setting tandem
// does not implement never changes transformers' model without changing tandem's.
#include "io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/families.h"
#include "io/atomic_dir.h"
#include "io/json_fields.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;

// Keys of transformers' PretrainedConfig and of the families' configs that change nothing in
// the model's forward or backward: names, dtypes, token ids, caching, output and generation
// settings, the initialiser's range (tandem draws its own), auto_map (transformers' own class
// is the reference either way).
const std::set<std::string_view> kNeutralKeys = {
    "_name_or_path", "architectures", "auto_map", "dtype", "torch_dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "initializer_range", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "add_cross_attention", "tokenizer_class", "prefix", "task_specific_params",
    "finetuning_task", "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "keys_to_ignore_at_inference",
    // Whether transformers adds the router's aux loss to its returned loss; tandem's loss always
    // has it, weighted by router_aux_loss_coef (the math of the model is the same).
    "output_router_logits",
    // Llama's tensor-parallel slicing at pretraining: the same products, split.
    "pretraining_tp",
    // The multi-token prediction modules after the layers (DeepSeek-V3's key, which tandem writes
    // for its modules in every family): transformers' forward runs none, and tandem's loads them
    // with --mtp-num-layers only (Note [Multi-token prediction layers] in runtime/checkpoint.cc).
    "num_nextn_predict_layers"};

// A config.json object's keys (io/json_fields.h, errors naming "config 'source': key 'k'"), with
// the checks of settings tandem implements one value of, and the refusal of keys not read
// (Note [Every key is read or refused]).
class ConfigReader : public JsonFields {
 public:
  ConfigReader(const Json& j, const std::string& source, std::string prefix = {})
      : JsonFields(j, "config '" + source + "': ", std::move(prefix)) {}

  // A key whose only valid value is `valid` (absent or null is valid too): a setting tandem does
  // not implement.
  void expect_number(const std::string& key, double valid, const std::string& why) const {
    if (has(key) && number(key) != valid) {
      fail(key, "is " + json()[key].dump() + "; tandem implements only " + Json(valid).dump() +
                    " (" + why + ")");
    }
  }
  void expect_false(const std::string& key, const std::string& why) const {
    if (boolean(key, false)) fail(key, "is true; tandem implements only false (" + why + ")");
  }
  // Refuses the first key neither read nor in `neutral`.
  void check_all_read(const std::set<std::string_view>& neutral) const {
    for (const auto& [key, value] : json().items()) {
      if (was_read(key) || neutral.count(key)) continue;
      fail(key, "is not a setting tandem knows for this model (value " + value.dump() +
                    "); tandem refuses it rather than train a model transformers would build "
                    "differently (docs/model.md \"Families\")");
    }
  }
};

// What tandem reads and writes of each transformers class: its names and the defaults of its
// config class for keys that may be absent.
struct FamilyInfo {
  ModelFamily family;
  const char* model_type;
  double default_theta;          // the config class's default_theta
  double default_eps;            // rms_norm_eps's default
  int64_t default_max_position;  // max_position_embeddings' default
  int64_t default_topk;          // num_experts_per_tok's default; 0: a dense class
  int64_t default_shared;        // shared_expert_intermediate_size's default; 0: none
};

constexpr FamilyInfo kFamilies[] = {
    {ModelFamily::kLlama, "llama", 1e4, 1e-6, 2048, 0, 0},
    {ModelFamily::kMixtral, "mixtral", 1e6, 1e-5, 4096 * 32, 2, 0},
    {ModelFamily::kQwen3Moe, "qwen3_moe", 1e4, 1e-6, 32768, 8, 0},
    {ModelFamily::kQwen2Moe, "qwen2_moe", 1e4, 1e-6, 32768, 4, 5632},
    // DeepSeek-V3's router and shared experts are read by read_deepseek_v3 (their keys differ).
    {ModelFamily::kDeepseekV3, "deepseek_v3", 1e4, 1e-6, 4096, 0, 0},
};

// A key of family_keys(): the model field (by option name) and, for an absent key, nothing
// (the key is required), a value, or the value of a field read before it.
struct FamilyKey {
  const char* option;
  std::variant<std::monostate, double, const char*> fallback;
};

// Note [config.json keys]: the hf_key fields each class has, in the order they are read.
std::vector<FamilyKey> family_keys(const FamilyInfo& f) {
  std::vector<FamilyKey> keys = {{"vocab-size", {}},
                                 {"hidden-size", {}},
                                 {"ffn-hidden-size", {}},
                                 {"num-layers", {}},
                                 {"num-attention-heads", {}},
                                 {"num-query-groups", "num-attention-heads"},
                                 {"norm-epsilon", f.default_eps},
                                 {"seq-length", static_cast<double>(f.default_max_position)}};
  if (f.default_topk > 0) {
    keys.push_back({"moe-router-topk", static_cast<double>(f.default_topk)});
    keys.push_back({"moe-aux-loss-coeff", 0.001});
  }
  if (f.default_shared > 0) {
    keys.push_back({"moe-shared-expert-intermediate-size", static_cast<double>(f.default_shared)});
  }
  return keys;
}

const ModelField& field_named(const char* option) {
  for (const ModelField& f : model_fields()) {
    if (std::string_view(f.name) == option) {
      TANDEM_ASSERT(f.hf_key != nullptr, "model field ", option, " has no config.json key");
      return f;
    }
  }
  TANDEM_ASSERT(false, "no model field ", option);
  return model_fields().front();
}

const FamilyInfo& family_info(ModelFamily f) {
  for (const FamilyInfo& i : kFamilies) {
    if (i.family == f) return i;
  }
  TANDEM_ASSERT(false, "family ", static_cast<int>(f));
  return kFamilies[0];
}

std::string valid_model_types() {
  std::string s;
  for (const FamilyInfo& f : kFamilies) {
    s += std::string(s.empty() ? "" : ", ") + "\"" + f.model_type + "\"";
  }
  return s;
}

// DeepSeek-V3's YaRN (docs/model.md "YaRN"): absent mscale and mscale_all_dim are 0, which
// transformers reads as unset. transformers derives the factor from max_position_embeddings /
// original_max_position_embeddings when both are there; a config whose factor says otherwise is
// refused rather than read one of the two ways.
void read_yarn(const ConfigReader& r, const ConfigReader& d, const FamilyInfo& family,
               ModelConfig& m) {
  m.rope_type = "yarn";
  m.rotary_scaling_factor = d.number("factor");
  const int64_t max_position = r.integer("max_position_embeddings", family.default_max_position);
  m.rope_original_max_position = d.integer("original_max_position_embeddings", max_position);
  if (d.has("original_max_position_embeddings") &&
      std::abs(static_cast<double>(max_position) /
                   static_cast<double>(m.rope_original_max_position) -
               m.rotary_scaling_factor) > 1e-9 * m.rotary_scaling_factor) {
    d.fail("factor", "is " + Json(m.rotary_scaling_factor).dump() +
                         ", not max_position_embeddings / original_max_position_embeddings (" +
                         std::to_string(max_position) + " / " +
                         std::to_string(m.rope_original_max_position) +
                         "), which transformers uses in its place");
  }
  m.yarn_beta_fast = d.number("beta_fast", 32.0);
  m.yarn_beta_slow = d.number("beta_slow", 1.0);
  m.yarn_mscale = d.number("mscale", 0.0);
  m.yarn_mscale_all_dim = d.number("mscale_all_dim", 0.0);
  if (d.has("attention_factor")) {
    d.fail("attention_factor",
           "is set; tandem derives YaRN's attention factor from mscale and "
           "mscale_all_dim, as DeepSeek-V3's configs have it");
  }
  if (!d.boolean("truncate", true)) {
    d.fail("truncate", "is false; tandem implements YaRN's rounded correction range only");
  }
}

// RoPE as transformers 5.x writes it (rope_parameters, the base inside) or 4.x (rope_theta at the
// top, rope_scaling beside it); rope_scaling wins over rope_parameters and the dict's rope_theta
// over the top-level one, as transformers' standardize_rope_params has it.
void read_rope(const ConfigReader& r, const std::string& source, const FamilyInfo& family,
               ModelConfig& m) {
  const double top_theta = r.number("rope_theta", family.default_theta);
  const bool scaling = r.has("rope_scaling");
  const bool params = r.has("rope_parameters");
  m.rotary_base = top_theta;
  if (!scaling && !params) return;
  const std::string key = scaling ? "rope_scaling" : "rope_parameters";
  const Json& dict = r.get(key);
  if (!dict.is_object()) r.fail(key, "is " + dict.dump() + ", expected an object");
  const ConfigReader d(dict, source, key + ".");
  m.rotary_base = d.number("rope_theta", top_theta);
  if (m.rotary_base <= 1)
    d.fail("rope_theta", "is " + Json(m.rotary_base).dump() + "; it must be > 1");
  const std::string type = d.has("rope_type") ? d.string("rope_type") : d.string("type", "default");
  d.mark("type");
  d.expect_number("partial_rotary_factor", 1.0, "RoPE on every column of the head");
  if (type == "llama3") {
    m.use_rope_scaling = true;
    m.rope_scaling_factor = d.number("factor");
    m.rope_low_freq_factor = d.number("low_freq_factor");
    m.rope_high_freq_factor = d.number("high_freq_factor");
    m.rope_original_max_position =
        d.integer("original_max_position_embeddings",
                  r.integer("max_position_embeddings", family.default_max_position));
  } else if (type == "yarn" && family.family == ModelFamily::kDeepseekV3) {
    read_yarn(r, d, family, m);
  } else if (type != "default") {
    d.fail(dict.contains("rope_type") ? "rope_type" : "type",
           "is \"" + type +
               "\"; tandem implements \"default\", \"llama3\" and, for deepseek_v3, \"yarn\" "
               "(docs/model.md \"Rotary position embedding\")");
  }
  d.check_all_read({});
}

// head_dim: null or absent means hidden_size / num_attention_heads (kv_channels 0).
void read_head_dim(const ConfigReader& r, ModelConfig& m) {
  if (!r.has("head_dim")) return;
  const int64_t d = r.integer("head_dim");
  const bool derived = m.num_attention_heads > 0 && m.hidden_size % m.num_attention_heads == 0 &&
                       d == m.hidden_size / m.num_attention_heads;
  m.kv_channels = derived ? 0 : d;
}

// Attention and the rest common to every family: sizes, norm, RoPE, and the settings tandem
// refuses.
void read_common(const ConfigReader& r, const std::string& source, const FamilyInfo& f,
                 ModelConfig& m) {
  for (const FamilyKey& key : family_keys(f)) {
    const ModelField& field = field_named(key.option);
    std::optional<double> fallback;
    if (const auto* v = std::get_if<double>(&key.fallback)) fallback = *v;
    if (const auto* other = std::get_if<const char*>(&key.fallback)) {
      fallback =
          static_cast<double>(m.*std::get<int64_t ModelConfig::*>(field_named(*other).member));
    }
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(m.*member)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            m.*member = r.integer(
                field.hf_key,
                fallback ? std::optional<int64_t>(static_cast<int64_t>(*fallback)) : std::nullopt);
          } else if constexpr (std::is_same_v<T, double>) {
            m.*member = r.number(field.hf_key, fallback);
          } else {
            TANDEM_ASSERT(false, "config.json key ", field.hf_key, " of a non-number field");
          }
        },
        field.member);
  }
  read_head_dim(r, m);
  read_rope(r, source, f, m);
  r.expect_number("partial_rotary_factor", 1.0, "RoPE on every column of the head");
  // Note [Tied embeddings] in model/parameters.h. Absent, false: the default of every family's
  // config class in transformers (LlamaConfig, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig,
  // DeepseekV3Config).
  m.untie_embeddings_and_output_weights = !r.boolean("tie_word_embeddings", false);
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", "is \"" + act + "\"; only \"silu\" (SwiGLU) is valid");
  r.expect_number("attention_dropout", 0.0, "no dropout");
}

// Qwen's sliding-window attention is off unless use_sliding_window is true; then the window and
// the layers it applies to do not matter.
void read_qwen_attention(const ConfigReader& r) {
  r.expect_false("use_sliding_window", "full causal attention in every layer");
  r.mark("sliding_window");
  r.mark("max_window_layers");
  if (r.has("layer_types")) {
    for (const Json& t : r.get("layer_types")) {
      if (t != "full_attention") {
        r.fail("layer_types", "has " + t.dump() + "; tandem implements only \"full_attention\"");
      }
    }
  }
}

// Qwen's MoE layers: every decoder_sparse_step-th layer ((l + 1) % step == 0) not in
// mlp_only_layers, as --moe-layer-freq's list (or "1" when every layer is MoE).
void read_qwen_moe_layers(const ConfigReader& r, ModelConfig& m) {
  const int64_t step = r.integer("decoder_sparse_step", 1);
  if (step < 1) r.fail("decoder_sparse_step", "is " + std::to_string(step) + "; it must be >= 1");
  std::set<int64_t> dense;
  if (r.has("mlp_only_layers")) {
    const Json& list = r.get("mlp_only_layers");
    if (!list.is_array()) r.fail("mlp_only_layers", "is " + list.dump() + ", expected a list");
    for (const Json& l : list) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= m.num_layers) {
        r.fail("mlp_only_layers",
               "holds " + l.dump() + "; layers are 0.." + std::to_string(m.num_layers - 1));
      }
      dense.insert(l.get<int64_t>());
    }
  }
  std::string pattern = "[";
  bool all = true;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const bool moe = !dense.count(l) && (l + 1) % step == 0;
    all = all && moe;
    pattern += std::string(l ? "," : "") + (moe ? "1" : "0");
  }
  m.moe_layer_freq = all ? "1" : pattern + "]";
}

// The experts' count: Qwen2-MoE and transformers 4.x's Qwen3-MoE write num_experts, Mixtral and
// 5.x's Qwen3-MoE num_local_experts (the two are one attribute of those classes).
int64_t read_num_experts(const ConfigReader& r, int64_t fallback) {
  const bool both = r.has("num_experts") && r.has("num_local_experts");
  if (both && r.integer("num_experts") != r.integer("num_local_experts")) {
    r.fail("num_local_experts", "is " + std::to_string(r.integer("num_local_experts")) +
                                    " and num_experts " + std::to_string(r.integer("num_experts")) +
                                    "; they name one setting and must agree");
  }
  return r.has("num_local_experts") ? r.integer("num_local_experts")
                                    : r.integer("num_experts", fallback);
}

void read_qwen_moe(const ConfigReader& r, ModelConfig& m, int64_t experts) {
  m.num_experts = read_num_experts(r, experts);
  if (m.num_experts < 1) r.fail("num_experts", "is below 1; a MoE model has experts");
  m.moe_router_pre_softmax = !r.boolean("norm_topk_prob", false);
  read_qwen_moe_layers(r, m);
  read_qwen_attention(r);
}

// DeepSeek-V3 (docs/model.md "Families"): MLA, the sigmoid router with its score correction bias
// and groups, shared experts, the first first_k_dense_replace layers dense.
// num_nextn_predict_layers (multi-token prediction) is not a model setting here: transformers'
// forward and loss have no MTP layers; the modules load with --mtp-num-layers.
void read_deepseek_v3(const ConfigReader& r, ModelConfig& m) {
  m.multi_latent_attention = true;
  m.rotary_interleaved = r.boolean("rope_interleave", true);
  m.q_lora_rank = r.has("q_lora_rank") ? r.integer("q_lora_rank") : 0;
  if (r.has("q_lora_rank") && m.q_lora_rank < 1) {
    r.fail("q_lora_rank", "is " + std::to_string(m.q_lora_rank) + "; valid: null or >= 1");
  }
  m.kv_lora_rank = r.integer("kv_lora_rank", 512);
  m.qk_head_dim = r.integer("qk_nope_head_dim", 128);
  m.qk_pos_emb_head_dim = r.integer("qk_rope_head_dim", 64);
  m.v_head_dim = r.integer("v_head_dim", 128);
  if (r.has("qk_head_dim") && r.integer("qk_head_dim") != m.qk_head_dim + m.qk_pos_emb_head_dim) {
    r.fail("qk_head_dim", "is " + std::to_string(r.integer("qk_head_dim")) +
                              "; it must be qk_nope_head_dim + qk_rope_head_dim");
  }
  // head_dim is the RoPE part's width in DeepseekV3Config.
  if (r.has("head_dim") && r.integer("head_dim") != m.qk_pos_emb_head_dim) {
    r.fail("head_dim", "is " + std::to_string(r.integer("head_dim")) +
                           "; DeepSeek-V3's head_dim is qk_rope_head_dim (" +
                           std::to_string(m.qk_pos_emb_head_dim) + ")");
  }
  m.kv_channels = 0;  // MLA's head widths are the three above; kv-channels has no part in it
  r.expect_false("attention_bias", "no biases in attention");
  m.num_experts = r.integer("n_routed_experts", 256);
  if (m.num_experts < 1) r.fail("n_routed_experts", "is below 1; a MoE model has experts");
  m.moe_router_topk = r.integer("num_experts_per_tok", 8);
  m.moe_ffn_hidden_size = r.integer("moe_intermediate_size", 2048);
  const int64_t shared = r.integer("n_shared_experts", 1);
  if (shared < 0) r.fail("n_shared_experts", "is below 0");
  m.moe_shared_expert_intermediate_size = shared * m.moe_ffn_hidden_size;
  m.moe_router_score_function = "sigmoid";
  m.moe_router_enable_expert_bias = true;  // e_score_correction_bias is always there
  m.moe_aux_loss_coeff = 0;                // transformers' forward has no aux loss
  m.moe_router_load_balancing_type = "seq_aux_loss";
  // Megatron-LM's sigmoid router normalises the weights of k > 1 experts and leaves one
  // expert's as it is; tandem's follows it, which is transformers' norm_topk_prob = (k > 1).
  const bool normalized = r.boolean("norm_topk_prob", true);
  if (normalized != (m.moe_router_topk > 1)) {
    r.fail("norm_topk_prob", std::string("is ") + (normalized ? "true" : "false") + " with " +
                                 std::to_string(m.moe_router_topk) +
                                 " experts a token; tandem's sigmoid router (Megatron-LM's) "
                                 "normalises the weights exactly when there are more than one");
  }
  m.moe_router_topk_scaling_factor = r.number("routed_scaling_factor", 2.5);
  m.moe_router_num_groups = r.integer("n_group", 8);
  m.moe_router_group_topk = r.integer("topk_group", 4);
  const int64_t dense = r.integer("first_k_dense_replace", 3);
  if (dense < 0 || dense >= m.num_layers) {
    r.fail("first_k_dense_replace", "is " + std::to_string(dense) + "; valid: 0.." +
                                        std::to_string(m.num_layers - 1) +
                                        " (at least one MoE layer)");
  }
  std::string pattern = "[";
  for (int64_t l = 0; l < m.num_layers; ++l) {
    pattern += std::string(l ? "," : "") + (l < dense ? "0" : "1");
  }
  m.moe_layer_freq = dense == 0 ? "1" : pattern + "]";
  r.integer("num_nextn_predict_layers", 1);
}

void read_family(const ConfigReader& r, const FamilyInfo& f, ModelConfig& m) {
  switch (f.family) {
    case ModelFamily::kLlama:
      m.num_experts = 0;
      r.expect_false("attention_bias", "no biases in attention");
      r.expect_false("mlp_bias", "no biases in the MLP");
      return;
    case ModelFamily::kMixtral:
      m.num_experts = read_num_experts(r, 8);
      if (m.num_experts < 1) r.fail("num_local_experts", "is below 1; a Mixtral model has experts");
      r.expect_number("router_jitter_noise", 0.0, "no noise on the router's input");
      if (r.has("sliding_window") && r.integer("sliding_window") < m.seq_length) {
        r.fail("sliding_window", "is " + std::to_string(r.integer("sliding_window")) +
                                     ", below max_position_embeddings; valid: null");
      }
      return;
    case ModelFamily::kQwen3Moe:
      m.qk_layernorm = true;
      m.moe_ffn_hidden_size = r.integer("moe_intermediate_size", 768);
      r.expect_false("attention_bias", "no biases in attention");
      read_qwen_moe(r, m, 128);
      return;
    case ModelFamily::kQwen2Moe:
      m.add_qkv_bias = r.boolean("qkv_bias", true);
      m.moe_ffn_hidden_size = r.integer("moe_intermediate_size", 1408);
      if (m.moe_shared_expert_intermediate_size < 1) {
        r.fail("shared_expert_intermediate_size",
               "is below 1; tandem's Qwen2-MoE has a shared "
               "expert");
      }
      m.moe_shared_expert_gate = true;
      read_qwen_moe(r, m, 60);
      return;
    case ModelFamily::kDeepseekV3:
      read_deepseek_v3(r, m);
      return;
  }
}

// The Qwen MoE families' keys written from `model`.
void write_qwen_moe(nlohmann::ordered_json& j, const ModelConfig& model) {
  j["num_experts"] = model.num_experts;
  j["moe_intermediate_size"] = model.expert_ffn_size();
  j["norm_topk_prob"] = !model.moe_router_pre_softmax;
  j["decoder_sparse_step"] = 1;
  nlohmann::ordered_json dense = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < model.num_layers; ++l) {
    if (!model.is_moe_layer(l)) dense.push_back(l);
  }
  j["mlp_only_layers"] = dense;
  j["output_router_logits"] = false;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
}

// DeepSeek-V3's keys written from `model` (the family's checks hold: see family_of).
void write_deepseek_v3(nlohmann::ordered_json& j, const ModelConfig& model) {
  j["attention_bias"] = false;
  j["q_lora_rank"] = model.q_lora_rank > 0 ? nlohmann::ordered_json(model.q_lora_rank) : nullptr;
  j["kv_lora_rank"] = model.kv_lora_rank;
  j["qk_nope_head_dim"] = model.qk_head_dim;
  j["qk_rope_head_dim"] = model.qk_pos_emb_head_dim;
  j["qk_head_dim"] = model.qk_dim();
  j["v_head_dim"] = model.v_head_dim;
  j["rope_interleave"] = model.rotary_interleaved;
  j["n_routed_experts"] = model.num_experts;
  j["num_experts_per_tok"] = model.moe_router_topk;
  j["moe_intermediate_size"] = model.expert_ffn_size();
  j["n_shared_experts"] = model.moe_shared_expert_intermediate_size / model.expert_ffn_size();
  j["norm_topk_prob"] = model.moe_router_topk > 1;  // Megatron-LM's sigmoid router, as read
  j["routed_scaling_factor"] = model.moe_router_topk_scaling_factor;
  j["n_group"] = std::max<int64_t>(model.moe_router_num_groups, 1);
  j["topk_group"] = std::max<int64_t>(model.moe_router_group_topk, 1);
  int64_t dense = 0;
  while (dense < model.num_layers && !model.is_moe_layer(dense)) ++dense;
  j["first_k_dense_replace"] = dense;
  j["num_nextn_predict_layers"] = model.mtp_num_layers;
}

}  // namespace

std::string hf_config_json(const ModelConfig& model) {
  model.validate();
  const FamilyInfo& f = family_info(family_of(model));
  nlohmann::ordered_json j;
  j["architectures"] = {family_class_name(f.family)};
  j["model_type"] = f.model_type;
  for (const FamilyKey& key : family_keys(f)) {  // Note [config.json keys]
    const ModelField& field = field_named(key.option);
    std::visit([&](auto member) { j[field.hf_key] = model.*member; }, field.member);
  }
  // transformers takes YaRN's factor as max_position_embeddings / original_max_position_embeddings
  // (read_yarn): the span YaRN stretches to, whatever length the run trains at.
  if (model.rope_type == "yarn") {
    j["max_position_embeddings"] = std::llround(
        model.rotary_scaling_factor * static_cast<double>(model.rope_original_max_position));
  }
  // DeepseekV3Config's head_dim is the RoPE part's width.
  j["head_dim"] = model.multi_latent_attention ? model.qk_pos_emb_head_dim : model.head_dim();
  j["hidden_act"] = "silu";
  // RoPE in both forms, so transformers 4.x (rope_theta, rope_scaling) and 5.x
  // (rope_parameters) read the same frequencies.
  nlohmann::ordered_json scaling = nullptr;
  if (model.use_rope_scaling) {
    scaling = {{"rope_type", "llama3"},
               {"factor", model.rope_scaling_factor},
               {"low_freq_factor", model.rope_low_freq_factor},
               {"high_freq_factor", model.rope_high_freq_factor},
               {"original_max_position_embeddings", model.rope_original_max_position}};
  }
  const bool yarn = model.rope_type == "yarn";
  if (yarn) {
    scaling = {{"rope_type", "yarn"},
               {"factor", model.rotary_scaling_factor},
               {"original_max_position_embeddings", model.rope_original_max_position},
               {"beta_fast", model.yarn_beta_fast},
               {"beta_slow", model.yarn_beta_slow},
               {"mscale", model.yarn_mscale},
               {"mscale_all_dim", model.yarn_mscale_all_dim}};
  }
  j["rope_theta"] = model.rotary_base;
  j["rope_scaling"] = scaling;
  nlohmann::ordered_json params = {{"rope_theta", model.rotary_base},
                                   {"rope_type", model.use_rope_scaling ? "llama3"
                                                 : yarn                 ? "yarn"
                                                                        : "default"}};
  if (model.use_rope_scaling || yarn) {
    for (const auto& [k, v] : scaling.items()) params[k] = v;
  }
  j["rope_parameters"] = params;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = model.init_method_std;
  j["tie_word_embeddings"] = model.tied_embeddings();
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  // The multi-token prediction modules after the layers (DeepSeek-V3's key, which its writer
  // sets below; the other families' classes keep an unknown key as an attribute).
  if (model.has_mtp()) j["num_nextn_predict_layers"] = model.mtp_num_layers;
  switch (f.family) {
    case ModelFamily::kMixtral:
      j["num_local_experts"] = model.num_experts;
      j["output_router_logits"] = false;
      j["router_jitter_noise"] = 0.0;
      j["sliding_window"] = nullptr;
      break;
    case ModelFamily::kLlama:
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      break;
    case ModelFamily::kQwen3Moe:
      j["attention_bias"] = false;
      write_qwen_moe(j, model);
      break;
    case ModelFamily::kQwen2Moe:
      j["qkv_bias"] = model.add_qkv_bias;
      write_qwen_moe(j, model);
      break;
    case ModelFamily::kDeepseekV3:
      write_deepseek_v3(j, model);
      break;
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
  const FamilyInfo* family = nullptr;
  for (const FamilyInfo& f : kFamilies) {
    if (type == f.model_type) family = &f;
  }
  if (family == nullptr) r.fail("model_type", "is \"" + type + "\"; valid: " + valid_model_types());
  const std::string arch = family_class_name(family->family);
  if (r.has("architectures")) {
    const Json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != arch) {
      r.fail("architectures",
             "is " + a.dump() + "; for model_type \"" + type + "\" valid: [\"" + arch + "\"]");
    }
  }
  ModelConfig m;
  read_common(r, source, *family, m);
  read_family(r, *family, m);
  r.check_all_read(kNeutralKeys);
  try {
    m.validate();
  } catch (const Error& e) {
    throw Error("config '" + source + "': " + e.what());
  }
  TANDEM_ASSERT(family_of(m) == family->family, "config '", source, "' read as ", type,
                " gives a model of another family");
  return m;
}

std::vector<std::string> hf_config_unwritten_fields(const ModelConfig& model) {
  // The MTP settings too: config.json keeps no loss weight, and which modules a run trains is
  // the command line's (a checkpoint's num_nextn_predict_layers modules load with
  // --mtp-num-layers, Note [Multi-token prediction layers] in runtime/checkpoint.cc).
  // init_method_std: config.json's initializer_range is written from it but read as neutral
  // (an imported model's weights are loaded, not drawn).
  std::vector<std::string> out = {"moe_router_bias_update_rate", "moe_router_load_balancing_type",
                                  "mtp_num_layers", "mtp_loss_scaling_factor", "init_method_std"};
  if (model.multi_latent_attention) out.push_back("moe_aux_loss_coeff");  // DeepseekV3Config
  return out;
}

ModelConfig load_hf_config(const std::string& path) {
  return parse_hf_config(read_file(path, 16 << 20), path);
}

int64_t load_hf_mtp_layers(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_file(path, 16 << 20), nullptr, false);
  const auto type = j.is_object() ? j.find("model_type") : j.end();
  if (type == j.end()) return 0;
  const auto layers = j.find("num_nextn_predict_layers");
  // DeepseekV3Config's default is 1; the other families have the modules tandem wrote only.
  if (layers == j.end()) return *type == "deepseek_v3" ? 1 : 0;
  return layers->is_number_integer() ? std::max<int64_t>(0, layers->get<int64_t>()) : 0;
}

}  // namespace tandem::io
