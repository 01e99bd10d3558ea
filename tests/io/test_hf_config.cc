// HF config.json for MixtralForCausalLM / LlamaForCausalLM. Oracle: the key names and values of
// transformers' MixtralConfig and LlamaConfig (written out literally here) and docs/model.md's
// mapping from Megatron names to HF keys; round trips must give back the same ModelConfig.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/hf_config.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_query_groups, b.num_query_groups);
  EXPECT_EQ(a.ffn_hidden_size, b.ffn_hidden_size);
  EXPECT_EQ(a.num_experts, b.num_experts);
  if (a.is_moe()) {
    EXPECT_EQ(a.moe_router_topk, b.moe_router_topk);
    EXPECT_EQ(a.moe_aux_loss_coeff, b.moe_aux_loss_coeff);
  }
  EXPECT_EQ(a.rotary_base, b.rotary_base);
  EXPECT_EQ(a.norm_epsilon, b.norm_epsilon);
  EXPECT_EQ(a.seq_length, b.seq_length);
}

ModelConfig dense_config() {
  ModelConfig m;
  m.num_experts = 0;
  m.vocab_size = 32000;
  m.hidden_size = 512;
  m.num_attention_heads = 16;
  m.num_query_groups = 4;
  m.ffn_hidden_size = 1376;
  m.num_layers = 3;
  m.norm_epsilon = 1e-6;
  m.rotary_base = 500000.0;
  m.seq_length = 512;
  return m;
}

TEST(HfConfig, MixtralKeysAndRoundTrip) {
  ModelConfig m;
  m.num_experts = 8;
  m.moe_aux_loss_coeff = 0.02;
  const Json j = Json::parse(hf_config_json(m));
  EXPECT_EQ(j["architectures"], Json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["num_local_experts"], 8);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(j["output_router_logits"], false);
  EXPECT_EQ(j["vocab_size"], 256);
  EXPECT_EQ(j["hidden_size"], 256);
  EXPECT_EQ(j["intermediate_size"], 512);
  EXPECT_EQ(j["num_hidden_layers"], 4);
  EXPECT_EQ(j["num_attention_heads"], 8);
  EXPECT_EQ(j["num_key_value_heads"], 8);
  EXPECT_EQ(j["rms_norm_eps"], 1e-5);
  EXPECT_EQ(j["rope_theta"], 10000.0);
  EXPECT_EQ(j["max_position_embeddings"], 128);
  EXPECT_EQ(j["tie_word_embeddings"], true);  // Note [Tied embeddings]: tandem's default
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["hidden_act"], "silu");
  expect_same(parse_hf_config(hf_config_json(m), "mem"), m);
}

TEST(HfConfig, LlamaKeysAndRoundTrip) {
  const ModelConfig m = dense_config();
  const Json j = Json::parse(hf_config_json(m));
  EXPECT_EQ(j["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["mlp_bias"], false);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_FALSE(j.contains("num_local_experts"));
  EXPECT_EQ(j["num_key_value_heads"], 4);
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);
  expect_same(parse_hf_config(hf_config_json(m), "mem"), m);
}

TEST(HfConfig, SaveAndLoadThroughAFile) {
  const fs::path p = fs::temp_directory_path() / ("tandem_cfg_" + std::to_string(::getpid()));
  save_hf_config(p.string(), dense_config());
  expect_same(load_hf_config(p.string()), dense_config());
  fs::remove(p);
}

TEST(HfConfig, AbsentKeysTakeTheHfDefaults) {
  const ModelConfig m = parse_hf_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
          "num_hidden_layers":2,"num_attention_heads":4})",
      "mem");
  EXPECT_EQ(m.num_query_groups, 4);
  EXPECT_EQ(m.norm_epsilon, 1e-6);
  EXPECT_EQ(m.rotary_base, 10000.0);
  EXPECT_EQ(m.num_experts, 0);
}

void expect_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    parse_hf_config(text, "ckpt/config.json");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ckpt/config.json"), std::string::npos) << msg;
    for (const std::string& part : parts) {
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' lacks '" << part << "'";
    }
  }
}

TEST(HfConfig, BadConfigsNameTheKeyAndTheFile) {
  ModelConfig moe;
  moe.num_experts = 8;
  Json good = Json::parse(hf_config_json(moe));
  const auto with = [&](const std::string& key, const Json& value) {
    Json j = good;
    j[key] = value;
    return j.dump();
  };
  const auto without = [&](const std::string& key) {
    Json j = good;
    j.erase(key);
    return j.dump();
  };
  expect_error("not json", {"not a JSON object"});
  expect_error(without("hidden_size"), {"key 'hidden_size' is missing"});
  expect_error(with("hidden_size", "256"), {"key 'hidden_size'", "expected an integer"});
  expect_error(with("rope_theta", "big"), {"key 'rope_theta'", "expected a number"});
  expect_error(with("model_type", "gpt2"), {"key 'model_type'", "\"gpt2\""});
  expect_error(with("architectures", Json::array({"LlamaForCausalLM"})),
               {"key 'architectures'", "MixtralForCausalLM"});
  expect_error(with("tie_word_embeddings", "yes"), {"key 'tie_word_embeddings'"});
  // Note [Tied embeddings]: true ties the output layer, false or absent (every family's default
  // in transformers) unties it; an untied model writes false and reads back untied.
  EXPECT_TRUE(parse_hf_config(with("tie_word_embeddings", true), "mem").tied_embeddings());
  EXPECT_FALSE(parse_hf_config(with("tie_word_embeddings", false), "mem").tied_embeddings());
  EXPECT_FALSE(parse_hf_config(without("tie_word_embeddings"), "mem").tied_embeddings());
  ModelConfig untied = parse_hf_config(good.dump(), "mem");
  untied.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(Json::parse(hf_config_json(untied))["tie_word_embeddings"], false);
  EXPECT_FALSE(parse_hf_config(hf_config_json(untied), "mem").tied_embeddings());
  expect_error(with("hidden_act", "gelu"), {"key 'hidden_act'", "silu"});
  expect_error(with("rope_scaling", Json{{"type", "linear"}}),
               {"key 'rope_scaling.type'", "linear"});
  expect_error(with("rope_parameters", Json{{"rope_type", "yarn"}, {"factor", 4}}),
               {"key 'rope_parameters.rope_type'", "yarn"});
  expect_error(with("rope_parameters", Json{{"rope_type", "default"}, {"mscale", 2}}),
               {"key 'rope_parameters.mscale'"});
  expect_error(with("rope_parameters", Json{{"rope_type", "llama3"}, {"factor", 8}}),
               {"key 'rope_parameters.low_freq_factor' is missing"});
  expect_error(with("partial_rotary_factor", 0.5), {"key 'partial_rotary_factor'", "0.5"});
  expect_error(with("attention_dropout", 0.1), {"key 'attention_dropout'"});
  expect_error(with("head_dim", 63), {"--kv-channels 63", "odd"});
  expect_error(with("quantization_config", Json{{"bits", 4}}),
               {"key 'quantization_config'", "not a setting tandem knows"});
  expect_error(with("use_sliding_window", true), {"key 'use_sliding_window'"});
  expect_error(with("sliding_window", 16), {"key 'sliding_window'"});
  expect_error(with("num_local_experts", 0), {"key 'num_local_experts'"});
  expect_error(with("num_attention_heads", 7), {"--num-attention-heads 7"});
  expect_error(with("num_experts_per_tok", 9), {"--moe-router-topk 9"});
}

// DeepseekV3Config's keys (transformers' names and defaults written out here), the model they
// read as, and back; the settings tandem does not implement refused by key.
ModelConfig deepseek_v3_config() {
  ModelConfig m;
  m.num_experts = 8;
  m.num_query_groups = m.num_attention_heads;
  m.num_layers = 4;
  m.multi_latent_attention = true;
  m.q_lora_rank = 48;
  m.kv_lora_rank = 32;
  m.qk_head_dim = 16;
  m.qk_pos_emb_head_dim = 8;
  m.v_head_dim = 12;
  m.rotary_interleaved = true;
  m.moe_ffn_hidden_size = 64;
  m.moe_shared_expert_intermediate_size = 128;
  m.moe_router_score_function = "sigmoid";
  m.moe_router_enable_expert_bias = true;
  m.moe_router_num_groups = 4;
  m.moe_router_group_topk = 2;
  m.moe_router_topk_scaling_factor = 2.5;
  m.moe_aux_loss_coeff = 0;
  m.moe_layer_freq = "[0,1,1,1]";
  m.rope_type = "yarn";
  m.rotary_scaling_factor = 4;
  m.rope_original_max_position = 32;
  m.yarn_mscale = 1;
  m.yarn_mscale_all_dim = 1;
  return m;
}

TEST(HfConfig, DeepseekV3KeysAndRoundTrip) {
  const ModelConfig m = deepseek_v3_config();
  const Json j = Json::parse(hf_config_json(m));
  EXPECT_EQ(j["architectures"], Json::array({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "deepseek_v3");
  EXPECT_EQ(j["q_lora_rank"], 48);
  EXPECT_EQ(j["kv_lora_rank"], 32);
  EXPECT_EQ(j["qk_nope_head_dim"], 16);
  EXPECT_EQ(j["qk_rope_head_dim"], 8);
  EXPECT_EQ(j["qk_head_dim"], 24);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["v_head_dim"], 12);
  EXPECT_EQ(j["n_shared_experts"], 2);
  EXPECT_EQ(j["moe_intermediate_size"], 64);
  EXPECT_EQ(j["n_group"], 4);
  EXPECT_EQ(j["topk_group"], 2);
  EXPECT_EQ(j["routed_scaling_factor"], 2.5);
  EXPECT_EQ(j["first_k_dense_replace"], 1);
  EXPECT_EQ(j["norm_topk_prob"], true);
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "yarn");
  EXPECT_EQ(j["rope_parameters"]["mscale_all_dim"], 1.0);
  const ModelConfig r = parse_hf_config(j.dump(), "config.json");
  expect_same(m, r);
  EXPECT_TRUE(r.multi_latent_attention && r.rotary_interleaved && r.sigmoid_router());
  EXPECT_EQ(r.q_lora_rank, 48);
  EXPECT_EQ(r.v_head_dim, 12);
  EXPECT_EQ(r.moe_shared_expert_intermediate_size, 128);
  EXPECT_EQ(r.moe_layer_freq, "[0,1,1,1]");
  EXPECT_EQ(r.rope_type, "yarn");
  EXPECT_EQ(r.rope_original_max_position, 32);
  EXPECT_EQ(r.yarn_mscale_all_dim, 1.0);
  EXPECT_EQ(r.moe_router_topk_scaling_factor, 2.5);
  // Without q's latent: q_lora_rank null.
  ModelConfig noq = m;
  noq.q_lora_rank = 0;
  const Json jn = Json::parse(hf_config_json(noq));
  EXPECT_TRUE(jn["q_lora_rank"].is_null());
  EXPECT_EQ(parse_hf_config(jn.dump(), "config.json").q_lora_rank, 0);
}

// Megatron-LM's MLA rotates columns i and i + D/2 unless told otherwise; transformers' DeepSeek-V3
// does the same with rope_interleave false.
TEST(HfConfig, DeepseekV3WithoutInterleavedRopeRoundTrips) {
  ModelConfig m = deepseek_v3_config();
  m.rotary_interleaved = false;
  const Json j = Json::parse(hf_config_json(m));
  EXPECT_EQ(j["rope_interleave"], false);
  const ModelConfig back = parse_hf_config(j.dump(), "config.json");
  EXPECT_FALSE(back.rotary_interleaved);
  expect_same(back, m);
}

TEST(HfConfig, DeepseekV3SettingsTandemDoesNotImplementAreRefusedByKey) {
  const Json good = Json::parse(hf_config_json(deepseek_v3_config()));
  const auto with = [&](const std::string& key, const Json& value) {
    Json j = good;
    j[key] = value;
    return j.dump();
  };
  const auto with_rope = [&](const std::string& key, const Json& value) {
    Json j = good;
    j["rope_scaling"] = nullptr;
    j["rope_parameters"][key] = value;
    return j.dump();
  };
  expect_error(with("head_dim", 16), {"key 'head_dim'", "qk_rope_head_dim"});
  expect_error(with("qk_head_dim", 20), {"key 'qk_head_dim'"});
  expect_error(with("attention_bias", true), {"key 'attention_bias'"});
  expect_error(with("first_k_dense_replace", 4), {"key 'first_k_dense_replace'"});
  expect_error(with("aux_loss_alpha", 0.001), {"key 'aux_loss_alpha'", "not a setting"});
  expect_error(with("n_group", 3), {"--moe-router-num-groups 3"});
  // Megatron-LM's sigmoid router normalises the weights of k > 1 experts, never of one.
  expect_error(with("norm_topk_prob", false), {"key 'norm_topk_prob'", "more than one"});
  expect_error(with_rope("factor", 8.0), {"key 'rope_parameters.factor'", "128 / 32"});
  expect_error(with_rope("attention_factor", 1.2), {"key 'rope_parameters.attention_factor'"});
  expect_error(with_rope("truncate", false), {"key 'rope_parameters.truncate'"});
  // Multi-token prediction layers: read and left out, as transformers' forward does.
  EXPECT_NO_THROW(parse_hf_config(with("num_nextn_predict_layers", 1), "config.json"));
}

// transformers 5.x writes the base inside rope_parameters and no rope_theta at the top; 4.x the
// other way round, with rope_scaling beside it. Both forms read the same model.
TEST(HfConfig, RopeInBothFormsAndLlama3Scaling) {
  const std::string base = R"({"model_type":"llama","vocab_size":100,"hidden_size":64,
      "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,)";
  const ModelConfig v5 = parse_hf_config(
      base + R"("rope_parameters":{"rope_theta":50000.0,"rope_type":"default"}})", "v5");
  EXPECT_EQ(v5.rotary_base, 50000.0);
  EXPECT_FALSE(v5.use_rope_scaling);
  const ModelConfig v4 =
      parse_hf_config(base + R"("rope_theta":50000.0,"rope_scaling":null})", "v4");
  EXPECT_EQ(v4.rotary_base, 50000.0);
  const std::string llama3 = R"({"factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                             R"("original_max_position_embeddings":8192,"rope_type":"llama3")";
  const ModelConfig s5 = parse_hf_config(
      base + R"("rope_parameters":)" + llama3 + R"(,"rope_theta":500000.0}})", "v5");
  const ModelConfig s4 =
      parse_hf_config(base + R"("rope_theta":500000.0,"rope_scaling":)" + llama3 + "}}", "v4");
  for (const ModelConfig& m : {s5, s4}) {
    EXPECT_EQ(m.rotary_base, 500000.0);
    EXPECT_TRUE(m.use_rope_scaling);
    EXPECT_EQ(m.rope_scaling_factor, 32.0);
    EXPECT_EQ(m.rope_low_freq_factor, 1.0);
    EXPECT_EQ(m.rope_high_freq_factor, 4.0);
    EXPECT_EQ(m.rope_original_max_position, 8192);
  }
  // Written with both forms, read back the same; Mixtral's base defaults to 1e6.
  expect_same(parse_hf_config(hf_config_json(s5), "rt"), s5);
  EXPECT_EQ(parse_hf_config(hf_config_json(s5), "rt").rope_scaling_factor, 32.0);
  const ModelConfig mixtral = parse_hf_config(
      R"({"model_type":"mixtral","vocab_size":100,"hidden_size":64,"intermediate_size":128,
          "num_hidden_layers":2,"num_attention_heads":4})",
      "mem");
  EXPECT_EQ(mixtral.rotary_base, 1e6);
}

// head_dim is the head width, independent of hidden_size / heads (null: derived).
TEST(HfConfig, HeadDimIsKvChannels) {
  Json j = Json::parse(hf_config_json(dense_config()));
  j["head_dim"] = 64;
  const ModelConfig m = parse_hf_config(j.dump(), "mem");
  EXPECT_EQ(m.kv_channels, 64);
  EXPECT_EQ(m.head_dim(), 64);
  EXPECT_EQ(m.q_width(), 16 * 64);
  EXPECT_EQ(parse_hf_config(hf_config_json(m), "rt").kv_channels, 64);
  j["head_dim"] = nullptr;
  EXPECT_EQ(parse_hf_config(j.dump(), "mem").kv_channels, 0);
  j["head_dim"] = 32;  // = 512 / 16
  EXPECT_EQ(parse_hf_config(j.dump(), "mem").kv_channels, 0);
}

// Keys that do not change the math are read past; the rest of an unknown config is refused.
TEST(HfConfig, NeutralKeysAreAcceptedUnknownOnesRefused) {
  Json j = Json::parse(hf_config_json(ModelConfig{}));
  j["bos_token_id"] = 1;
  j["eos_token_id"] = Json::array({2, 3});
  j["transformers_version"] = "5.17.0";
  j["dtype"] = "bfloat16";
  j["max_length"] = 20;
  EXPECT_NO_THROW(parse_hf_config(j.dump(), "mem"));
  j["my_new_setting"] = 3;
  expect_error(j.dump(), {"key 'my_new_setting'", "3"});
}

}  // namespace
}  // namespace tandem::io
