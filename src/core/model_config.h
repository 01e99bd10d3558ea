// The model's configuration (docs/model.md): plain data, one table of its fields, and
// validation that names the bad value and what is valid. It lives in core, not model, because
// the planner (src/planner) needs it and must not depend on the model's code. RoPE's settings
// are in core/rope.h, the transformers classes a model is saved as in core/families.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/enum_names.h"
#include "core/rope.h"
#include "core/settings.h"

namespace tandem {

// Note [Sizes that fit] (core/model_config.cc): the largest value of any size (tensors are
// indexed with 32-bit integers), and the checks every option's value passes: throw
// tandem::Error naming `option` and the value.
inline constexpr int64_t kMaxDimension = (int64_t{1} << 31) - 1;
void check_dimension(const char* option, int64_t value);
// A value the f32 master weights and optimizer use: zero, or a normal f32 of either sign.
void check_f32(const char* option, double value);

// Which layers of `num_layers` have experts, from a --moe-layer-freq value ("N" or "[0,1,...]");
// throws tandem::Error naming the value and what is valid.
std::vector<bool> moe_layer_pattern(const std::string& freq, int64_t num_layers);

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 256;
  int64_t num_layers = 4;
  int64_t num_attention_heads = 8;
  int64_t num_query_groups = 8;
  int64_t ffn_hidden_size = 512;
  int64_t num_experts = 0;  // 0: dense (Llama), Megatron's default
  int64_t moe_router_topk = 2;
  double moe_aux_loss_coeff = 0.0;
  double rotary_base = 10000.0;
  // --use-rope-scaling and its factors: Llama 3's RoPE frequency scaling (RopeSpec).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  double norm_epsilon = 1e-5;
  int64_t seq_length = 128;
  // --kv-channels: the head dim D of q, k and v; 0: hidden_size / num_attention_heads.
  int64_t kv_channels = 0;
  // --qk-layernorm: RMSNorm of each head of q and of k (gains [D]) before RoPE (Qwen3).
  bool qk_layernorm = false;
  // --add-qkv-bias: biases on the q, k and v products (Qwen2).
  bool add_qkv_bias = false;
  // --untie-embeddings-and-output-weights: the LM head a weight of its own. Off (Megatron-LM's
  // default) the output layer is the embedding table (Note [Tied embeddings] in
  // model/parameters.h).
  bool untie_embeddings_and_output_weights = false;
  // --moe-ffn-hidden-size: each routed expert's SwiGLU width; 0: ffn-hidden-size. The dense
  // layers of a MoE model keep ffn-hidden-size.
  int64_t moe_ffn_hidden_size = 0;
  // --moe-router-pre-softmax: the routing weights are the softmax over all experts at the k
  // chosen, not renormalised (transformers' norm_topk_prob false); off: the softmax over the k
  // chosen logits (Mixtral; norm_topk_prob true).
  bool moe_router_pre_softmax = false;
  // --moe-shared-expert-intermediate-size: the width of a SwiGLU every token of a MoE layer
  // goes through beside its routed experts (Qwen2-MoE); 0: none.
  int64_t moe_shared_expert_intermediate_size = 0;
  // --moe-shared-expert-gate: the shared expert's output scaled by sigmoid(n2 . w), w: [H]
  // (Qwen2-MoE's shared_expert_gate).
  bool moe_shared_expert_gate = false;
  // --moe-layer-freq: which layers are MoE (the rest dense, of width ffn-hidden-size): "N",
  // layer l is MoE when l % N == 0 (Megatron's 1:N); or a list of 0/1 a layer, "[0,1,1,1]".
  std::string moe_layer_freq = "1";
  // --multi-latent-attention (DeepSeek-V3, docs/model.md "Multi-head latent attention"): q from
  // a low-rank latent (q_lora_rank > 0) or directly; k and v from a compressed latent of width
  // kv_lora_rank; each head's q and k a part without position (qk_head_dim) and a RoPE part
  // (qk_pos_emb_head_dim, k's shared by the heads); values of width v_head_dim.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;  // 0: q = n1 @ Wq
  int64_t kv_lora_rank = 512;
  int64_t qk_head_dim = 128;  // Megatron's name: the part without position
  int64_t qk_pos_emb_head_dim = 64;
  int64_t v_head_dim = 128;
  // --rope-type yarn and its settings (DeepSeek-V3's rope_scaling); "rope": plain or Llama 3's.
  std::string rope_type = "rope";
  // --rotary-interleaved: RopeSpec::interleaved (DeepSeek-V3's rope_interleave); MLA only.
  bool rotary_interleaved = false;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double yarn_mscale = 1.0;
  double yarn_mscale_all_dim = 0.0;
  // YaRN's scaling factor (Megatron-LM's --rotary-scaling-factor); 1 leaves the frequencies as
  // they are.
  double rotary_scaling_factor = 1.0;
  // The standard deviation of the weights' normal initialisation (Megatron-LM's
  // --init-method-std); the output projections take it / sqrt(2 num_layers).
  double init_method_std = 0.02;
  // --moe-router-score-function: "softmax" (Mixtral, Qwen) or "sigmoid" (DeepSeek-V3: sigmoid
  // scores, weights the selected ones' scores, normalised unless --moe-router-pre-softmax).
  std::string moe_router_score_function = "softmax";
  // --moe-router-enable-expert-bias: a per-expert bias added to the sigmoid scores for the
  // selection only, moved after each step by --moe-router-bias-update-rate towards even load
  // (Note [Expert bias] in runtime/expert_bias.h).
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // --moe-router-num-groups, --moe-router-group-topk: experts in groups, each token choosing
  // among the experts of its group-topk best groups only; 0: no groups.
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  // --moe-router-topk-scaling-factor: the routing weights multiplied by this.
  double moe_router_topk_scaling_factor = 1.0;
  // --moe-router-load-balancing-type (Megatron-LM's, docs/model.md "Load balancing"): the switch
  // loss over the micro-batch ("aux_loss"), over each sequence ("seq_aux_loss"), over the
  // step's micro-batches so far on every data-parallel rank ("global_aux_loss"), or none
  // ("none"); weighted by moe_aux_loss_coeff.
  std::string moe_router_load_balancing_type = "aux_loss";
  // --moe-z-loss-coeff: the router's z-loss, coeff * mean over tokens of logsumexp(logits)^2
  // (ST-MoE, as Megatron-LM); 0: none.
  double moe_z_loss_coeff = 0.0;
  // --moe-expert-capacity-factor: each expert takes at most ceil(N k / E * factor) of a
  // micro-batch's N tokens on a rank, the rest of its rows dropped by
  // --moe-token-drop-policy ("probs": the lowest routing weights; "position": the latest
  // positions); 0: dropless (docs/model.md "Expert capacity").
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";
  // --moe-pad-expert-input-to-capacity: every expert receives exactly its capacity of rows from
  // each rank, zero rows filling what the router did not send.
  bool moe_pad_expert_input_to_capacity = false;
  // --moe-router-dtype: the precision of the router's logits, scores and losses; fp32 (tandem
  // computes the router in fp32 on both backends); fp64 is refused.
  std::string moe_router_dtype = "fp32";
  // --mtp-num-layers D: DeepSeek-V3's multi-token prediction modules after the last layer, module
  // k predicting the token k + 1 ahead (docs/model.md "Multi-token prediction"); 0: none.
  int64_t mtp_num_layers = 0;
  // --mtp-loss-scaling-factor: the MTP losses' weight; the loss adds this times their mean.
  double mtp_loss_scaling_factor = 0.1;

  bool is_moe() const { return num_experts > 0; }
  // Whether layer l (of the whole model) has experts; parses moe_layer_freq (validate() has
  // checked it). The MTP modules' layers (l >= num_layers) are of the last layer's kind.
  bool is_moe_layer(int64_t l) const;
  // The routed experts' SwiGLU width.
  int64_t expert_ffn_size() const {
    return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size;
  }
  bool has_shared_expert() const { return is_moe() && moe_shared_expert_intermediate_size > 0; }
  int64_t head_dim() const {
    return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
  }
  RopeSpec rope() const;  // core/rope.cc
  // q's and k's head width: head_dim(), or with MLA qk_head_dim + qk_pos_emb_head_dim.
  int64_t qk_dim() const {
    return multi_latent_attention ? qk_head_dim + qk_pos_emb_head_dim : head_dim();
  }
  // v's head width: head_dim(), or with MLA v_head_dim.
  int64_t v_dim() const { return multi_latent_attention ? v_head_dim : head_dim(); }
  int64_t q_width() const { return num_attention_heads * qk_dim(); }
  int64_t kv_width() const { return num_query_groups * qk_dim(); }
  // The attention's output width (Wo's input): heads * v_dim().
  int64_t attn_out_width() const { return num_attention_heads * v_dim(); }
  bool sigmoid_router() const { return moe_router_score_function == "sigmoid"; }
  // A load-balancing loss is added (a type other than none, with a coefficient above 0).
  bool has_balance_loss() const {
    return is_moe() && moe_aux_loss_coeff > 0 && moe_router_load_balancing_type != "none";
  }
  bool has_global_balance_loss() const {
    return has_balance_loss() && moe_router_load_balancing_type == "global_aux_loss";
  }
  // Experts have a capacity (--moe-expert-capacity-factor above 0): rows past it are dropped.
  bool has_expert_capacity() const { return is_moe() && moe_expert_capacity_factor > 0; }
  bool has_mtp() const { return mtp_num_layers > 0; }
  // The output layer is the embedding table (Note [Tied embeddings] in model/parameters.h).
  bool tied_embeddings() const { return !untie_embeddings_and_output_weights; }
  // The softmax's scale: 1/sqrt(qk_dim()), times YaRN's m(factor, mscale_all_dim)^2 with MLA.
  double softmax_scale() const;  // core/rope.cc
  // Throws tandem::Error naming the first value that does not fit.
  void validate() const;

 private:
  void validate_moe_options() const;
  void validate_routing_options() const;
  void validate_v3_options() const;
  void validate_mtp_options() const;  // core/config_mtp.cc
};

// Note [One table of model fields]: every ModelConfig field is spelled once, in model_fields():
// its Megatron-style name is the command-line option (--name), the TOML key, and, with '_' for
// '-', the key of a checkpoint's JSON; its hf_key the key of a Hugging Face config.json. The
// command line (train and plan alike), the config file, checkpoints, config.json, the node-times
// file's measured_at and the cross-rank agreement check all walk this table.
struct ModelField {
  const char* name;
  std::variant<int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
               std::string ModelConfig::*>
      member;
  const char* help;
  FieldBound bound = FieldBound::kAny;
  // False for fields a checkpoint may lack (written before the field existed): they then take
  // the default, which is the model those checkpoints hold.
  bool in_every_checkpoint = true;
  // The transformers config.json key that holds the field, the same in every family that has it
  // (Note [config.json keys] in io/hf_config.cc); nullptr: the families' code maps it.
  const char* hf_key = nullptr;
  // What --help shows as the default where a run left without the field gets another value
  // than the record's (Setting::default_text); nullptr: the value.
  const char* default_text = nullptr;
};
const std::vector<ModelField>& model_fields();
// The checkpoint JSON key of a field: its name with '_' for '-'.
std::string field_json_key(const ModelField& f);

}  // namespace tandem
