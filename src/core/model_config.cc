// The model's fields and their validation (model_config.h); each message names the value and
// what would be valid.
#include "core/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/families.h"

namespace tandem {

const std::vector<ModelField>& model_fields() {
  using M = ModelConfig;
  constexpr FieldBound kPositive = FieldBound::kPositive, kNonNegative = FieldBound::kNonNegative;
  static const std::vector<ModelField> fields = {
      {"num-layers", &M::num_layers, "L, the number of transformer layers", kPositive, true,
       "num_hidden_layers"},
      {"hidden-size", &M::hidden_size, "H, the width of the residual stream", kPositive, true,
       "hidden_size"},
      {"num-attention-heads", &M::num_attention_heads,
       "attention heads; head dim = hidden-size / heads unless --kv-channels sets it", kPositive,
       true, "num_attention_heads"},
      {"num-query-groups", &M::num_query_groups,
       "KV heads for grouped-query attention; divides num-attention-heads", kPositive, true,
       "num_key_value_heads",
       // Left out, the groups follow the heads (finalize_run_options in cli/options.cc).
       "--num-attention-heads, multi-head attention"},
      {"kv-channels", &M::kv_channels,
       "D, the head dim of q, k and v (even); 0: hidden-size / num-attention-heads", kNonNegative,
       false},
      {"ffn-hidden-size", &M::ffn_hidden_size,
       "F, the SwiGLU width of the dense MLP or of each expert", kPositive, true,
       "intermediate_size"},
      {"num-experts", &M::num_experts, "E, experts per MoE layer; 0 makes a dense model",
       kNonNegative},
      {"moe-router-topk", &M::moe_router_topk,
       "k, experts each token is routed to (1..num-experts)", kPositive, true,
       "num_experts_per_tok"},
      {"moe-aux-loss-coeff", &M::moe_aux_loss_coeff, "alpha, the weight of the load-balancing loss",
       kNonNegative, true, "router_aux_loss_coef"},
      {"vocab-size", &M::vocab_size,
       "V, the vocabulary size (>= 256 for the built-in task, whose tokens are bytes)", kPositive,
       true, "vocab_size"},
      {"seq-length", &M::seq_length, "T, tokens per sample", kPositive, true,
       "max_position_embeddings"},
      {"rotary-base", &M::rotary_base, "theta of the rotary position embedding", kPositive},
      {"use-rope-scaling", &M::use_rope_scaling,
       "scale RoPE's low frequencies as Llama 3 does (transformers' rope_type \"llama3\")",
       FieldBound::kAny, false},
      {"rope-scaling-factor", &M::rope_scaling_factor,
       "--use-rope-scaling: the low frequencies are divided by this", kPositive, false},
      {"rope-low-freq-factor", &M::rope_low_freq_factor,
       "--use-rope-scaling: wavelengths above original / this are scaled", kPositive, false},
      {"rope-high-freq-factor", &M::rope_high_freq_factor,
       "--use-rope-scaling: wavelengths below original / this are kept", kPositive, false},
      {"rope-original-max-position-embeddings", &M::rope_original_max_position,
       "--use-rope-scaling: the context length the model was first trained at", kPositive, false},
      {"norm-epsilon", &M::norm_epsilon, "eps added inside RMSNorm", kPositive, true,
       "rms_norm_eps"},
      {"qk-layernorm", &M::qk_layernorm,
       "RMSNorm of each head of q and k (gains of width D) before RoPE, as Qwen3", FieldBound::kAny,
       false},
      {"add-qkv-bias", &M::add_qkv_bias, "biases on the q, k and v products, as Qwen2",
       FieldBound::kAny, false},
      {"untie-embeddings-and-output-weights", &M::untie_embeddings_and_output_weights,
       "an LM head of its own; left out, the output layer is the embedding table (logits = h E^T), "
       "as Megatron-LM's default",
       FieldBound::kAny, false},
      {"moe-ffn-hidden-size", &M::moe_ffn_hidden_size,
       "each routed expert's SwiGLU width; 0: ffn-hidden-size (which the dense layers keep)",
       kNonNegative, false},
      {"moe-router-pre-softmax", &M::moe_router_pre_softmax,
       "routing weights: the softmax over all experts at the k chosen, not renormalised "
       "(transformers' norm_topk_prob false); off: the softmax over the k chosen",
       FieldBound::kAny, false},
      {"moe-shared-expert-intermediate-size", &M::moe_shared_expert_intermediate_size,
       "width of a SwiGLU every token of a MoE layer goes through beside its routed experts "
       "(a shared expert, as Qwen2-MoE); 0: none",
       kNonNegative, false, "shared_expert_intermediate_size"},
      {"moe-shared-expert-gate", &M::moe_shared_expert_gate,
       "scale the shared expert's output by sigmoid(x . w) of a learned w (Qwen2-MoE)",
       FieldBound::kAny, false},
      {"moe-layer-freq", &M::moe_layer_freq,
       "which layers have experts: N (layer l when l % N == 0) or a list of 0/1 per layer, "
       "[0,1,1,1]; the others are dense",
       FieldBound::kAny, false},
      {"multi-latent-attention", &M::multi_latent_attention,
       "multi-head latent attention (DeepSeek-V3): q, k and v from low-rank latents",
       FieldBound::kAny, false},
      {"q-lora-rank", &M::q_lora_rank,
       "--multi-latent-attention: the rank of q's latent; 0: q straight from the input",
       kNonNegative, false},
      {"kv-lora-rank", &M::kv_lora_rank,
       "--multi-latent-attention: the rank of the latent k and v are formed from", kPositive,
       false},
      {"qk-head-dim", &M::qk_head_dim,
       "--multi-latent-attention: the part of each q and k head without position", kPositive,
       false},
      {"qk-pos-emb-head-dim", &M::qk_pos_emb_head_dim,
       "--multi-latent-attention: the RoPE part of each q and k head (k's shared by the heads)",
       kPositive, false},
      {"v-head-dim", &M::v_head_dim, "--multi-latent-attention: the width of each value head",
       kPositive, false},
      {"rotary-interleaved", &M::rotary_interleaved,
       "RoPE rotates neighbouring columns (2i, 2i+1) (DeepSeek-V3's rope_interleave); MLA "
       "only; off: columns i and i + D/2, as Megatron-LM's MLA by default",
       FieldBound::kAny, false},
      {"rope-type", &M::rope_type,
       "rope, or yarn (YaRN's frequencies and attention scale; --multi-latent-attention only), "
       "with --rotary-scaling-factor and --rope-original-max-position-embeddings; left out, "
       "multi-latent attention takes yarn, as Megatron-LM's (at --rotary-scaling-factor 1 the "
       "plain RoPE)",
       FieldBound::kAny, false},
      {"init-method-std", &M::init_method_std,
       "the standard deviation of the weights' normal initialisation; the output projections "
       "(attention's o_proj, the feed-forwards' down_proj) take it / sqrt(2 num-layers), as "
       "Megatron-LM",
       kPositive, false},
      {"rotary-scaling-factor", &M::rotary_scaling_factor,
       "--rope-type yarn: YaRN's scaling factor s (Megatron-LM's); 1 leaves the frequencies "
       "and the attention scale as they are",
       kPositive, false},
      {"beta-fast", &M::yarn_beta_fast, "--rope-type yarn: YaRN's beta_fast", kPositive, false},
      {"beta-slow", &M::yarn_beta_slow, "--rope-type yarn: YaRN's beta_slow", kPositive, false},
      {"mscale", &M::yarn_mscale, "--rope-type yarn: YaRN's mscale", kNonNegative, false},
      {"mscale-all-dim", &M::yarn_mscale_all_dim, "--rope-type yarn: YaRN's mscale_all_dim",
       kNonNegative, false},
      {"moe-router-score-function", &M::moe_router_score_function,
       "softmax, or sigmoid (DeepSeek-V3: the weights are the chosen experts' sigmoid scores)",
       FieldBound::kAny, false},
      {"moe-router-enable-expert-bias", &M::moe_router_enable_expert_bias,
       "sigmoid router: a per-expert bias on the scores, for the selection only, moved after "
       "each step towards even load (aux-loss-free balancing)",
       FieldBound::kAny, false},
      {"moe-router-bias-update-rate", &M::moe_router_bias_update_rate,
       "--moe-router-enable-expert-bias: the step of each bias update", kNonNegative, false},
      {"moe-router-num-groups", &M::moe_router_num_groups,
       "sigmoid router: experts in this many groups, a token choosing among its best groups' "
       "experts only; 0: no groups",
       kNonNegative, false},
      {"moe-router-group-topk", &M::moe_router_group_topk,
       "--moe-router-num-groups: the groups each token chooses among", kNonNegative, false},
      {"moe-router-load-balancing-type", &M::moe_router_load_balancing_type,
       "the load-balancing loss weighted by --moe-aux-loss-coeff (Megatron-LM's): aux_loss (the "
       "switch loss over the micro-batch), seq_aux_loss (over each sequence), global_aux_loss "
       "(over the step's micro-batches so far on every data-parallel rank) or none",
       FieldBound::kAny, false},
      {"moe-router-topk-scaling-factor", &M::moe_router_topk_scaling_factor,
       "the routing weights are multiplied by this (DeepSeek-V3's routed_scaling_factor)",
       kPositive, false},
      {"moe-z-loss-coeff", &M::moe_z_loss_coeff,
       "the router's z-loss: this times the mean over tokens of logsumexp(logits)^2; 0: none",
       kNonNegative, false},
      {"moe-expert-capacity-factor", &M::moe_expert_capacity_factor,
       "each expert takes at most ceil(tokens x k / experts x this) rows of a micro-batch on a "
       "rank, dropping the rest by --moe-token-drop-policy; 0: dropless",
       kNonNegative, false},
      {"moe-token-drop-policy", &M::moe_token_drop_policy,
       "--moe-expert-capacity-factor: which rows an expert past its capacity drops: probs (the "
       "lowest routing weights) or position (the latest positions in the sequences)",
       FieldBound::kAny, false},
      {"moe-pad-expert-input-to-capacity", &M::moe_pad_expert_input_to_capacity,
       "--moe-expert-capacity-factor: every expert receives exactly its capacity of rows from "
       "each rank, zero rows filling the rest",
       FieldBound::kAny, false},
      {"moe-router-dtype", &M::moe_router_dtype,
       "the router's precision (logits, scores, losses): fp32 (tandem's router is fp32 on both "
       "backends; fp64 is not implemented)",
       FieldBound::kAny, false},
      {"mtp-num-layers", &M::mtp_num_layers,
       "D, multi-token prediction modules after the last layer (DeepSeek-V3's), module k "
       "predicting the token k + 1 ahead; 0: none",
       kNonNegative, false},
      {"mtp-loss-scaling-factor", &M::mtp_loss_scaling_factor,
       "--mtp-num-layers: the loss adds this times the mean of the MTP modules' losses",
       kNonNegative, false},
  };
  return fields;
}

std::string field_json_key(const ModelField& f) {
  std::string key = f.name;
  for (char& c : key) c = c == '-' ? '_' : c;
  return key;
}

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (!is_moe()) return false;
  if (moe_layer_freq == "1") return true;
  l = std::min(l, num_layers - 1);
  return moe_layer_pattern(moe_layer_freq, num_layers).at(static_cast<size_t>(l));
}

namespace {

// Note [Sizes that fit]: every size is an index somewhere (kernels index rows and columns with
// 32-bit integers), and the tensors' element counts are their products; a size past 2^31 - 1,
// or a model whose parameter count passes 2^47 (the flat buffers' offsets, with room), is
// refused before anything is built, rather than overflowing in a product or asking the
// allocator for more than any machine has.
constexpr long double kMaxParameters = static_cast<long double>(int64_t{1} << 47);

// Note [Sizes that fit], for counts: every layer and every expert of a layer is a named weight,
// a planned node and a view of its own, so their bookkeeping grows with the count whatever the
// widths; a count past any model's by orders of magnitude is refused at once instead of being
// built until the host runs out of memory.
constexpr int64_t kMaxLayers = int64_t{1} << 14;
constexpr int64_t kMaxExperts = int64_t{1} << 16;
constexpr int64_t kMaxExpertLayers = int64_t{1} << 20;  // MoE layers x experts

void check_counts(const ModelConfig& m) {
  TANDEM_CHECK(m.num_layers <= kMaxLayers, "--num-layers ", m.num_layers, " is too many: at most ",
               kMaxLayers, " (each layer is a named set of weights and planned node by node)");
  TANDEM_CHECK(m.num_experts <= kMaxExperts, "--num-experts ", m.num_experts,
               " is too many: at most ", kMaxExperts, " (each expert is a named set of weights)");
  TANDEM_CHECK(m.num_layers * m.num_experts <= kMaxExpertLayers, "--num-layers ", m.num_layers,
               " x --num-experts ", m.num_experts, " = ", m.num_layers * m.num_experts,
               " experts in all is too many: at most ", kMaxExpertLayers,
               " (each is a named set of weights)");
}

}  // namespace

void check_dimension(const char* option, int64_t value) {
  TANDEM_CHECK(value <= kMaxDimension, option, " ", value, " is too large: at most ", kMaxDimension,
               " (sizes index tensors with 32-bit integers)");
}

// A value the f32 master weights and optimizer use: zero, or a normal f32 of either sign.
void check_f32(const char* option, double value) {
  const float f = static_cast<float>(value);
  TANDEM_CHECK(std::isfinite(value) && std::isfinite(f) && (value == 0 || f != 0), option, " ",
               value,
               " does not fit a 32-bit float (the optimizer computes in f32): "
               "use a value between 1.2e-38 and 3.4e38 in magnitude");
}

// The parameters of the whole model, in long double (no overflow for any validated sizes).
static long double parameter_count(const ModelConfig& m) {
  using L = long double;
  const L h = L(m.hidden_size), q = L(m.num_attention_heads) * L(m.head_dim()),
          kv = L(m.num_query_groups) * L(m.head_dim());
  L layer = 2 * h + 2 * h * q + 2 * h * kv;
  if (m.multi_latent_attention) {
    const L heads = L(m.num_attention_heads), qr = L(m.q_lora_rank), kvr = L(m.kv_lora_rank);
    const L qw = heads * L(m.qk_dim());
    layer = 2 * h + (qr > 0 ? h * qr + qr + qr * qw : h * qw) +
            h * (kvr + L(m.qk_pos_emb_head_dim)) + kvr +
            kvr * heads * L(m.qk_head_dim + m.v_head_dim) + heads * L(m.v_head_dim) * h;
  }
  const L dense = 3 * h * L(m.ffn_hidden_size);
  const L moe = h * L(m.num_experts) + L(m.num_experts) * 3 * h * L(m.expert_ffn_size()) +
                3 * h * L(m.moe_shared_expert_intermediate_size);
  layer += m.is_moe() ? std::max(dense, moe) : dense;
  return L(m.num_layers) * layer + 2 * L(m.vocab_size) * h + h;
}

void ModelConfig::validate() const {
  for (const auto& [option, value] :
       {std::pair{"--vocab-size", vocab_size},
        {"--hidden-size", hidden_size},
        {"--num-layers", num_layers},
        {"--num-attention-heads", num_attention_heads},
        {"--num-query-groups", num_query_groups},
        {"--ffn-hidden-size", ffn_hidden_size},
        {"--num-experts", num_experts},
        {"--moe-router-topk", moe_router_topk},
        {"--seq-length", seq_length},
        {"--kv-channels", kv_channels},
        {"--moe-ffn-hidden-size", moe_ffn_hidden_size},
        {"--moe-shared-expert-intermediate-size", moe_shared_expert_intermediate_size},
        {"--rope-original-max-position-embeddings", rope_original_max_position}}) {
    check_dimension(option, value);
  }
  check_counts(*this);
  TANDEM_CHECK(vocab_size >= 2, "--vocab-size ", vocab_size, " is invalid: need at least 2");
  TANDEM_CHECK(hidden_size >= 1, "--hidden-size ", hidden_size, " is invalid: need at least 1");
  TANDEM_CHECK(num_layers >= 1, "--num-layers ", num_layers, " is invalid: need at least 1");
  TANDEM_CHECK(num_attention_heads >= 1, "--num-attention-heads ", num_attention_heads,
               " is invalid: need at least 1");
  TANDEM_CHECK(kv_channels >= 0, "--kv-channels ", kv_channels,
               " is invalid: use 0 for hidden-size / num-attention-heads or a positive head dim");
  if (kv_channels == 0) {
    TANDEM_CHECK(hidden_size % num_attention_heads == 0, "--num-attention-heads ",
                 num_attention_heads, " does not divide --hidden-size ", hidden_size,
                 ": choose a number of heads that divides the hidden size, or set --kv-channels");
    TANDEM_CHECK(head_dim() % 2 == 0, "head dimension ", head_dim(), " (--hidden-size ",
                 hidden_size, " / --num-attention-heads ", num_attention_heads,
                 ") is odd: rotary embeddings need an even head dimension");
  } else {
    TANDEM_CHECK(kv_channels % 2 == 0, "--kv-channels ", kv_channels,
                 " is odd: rotary embeddings need an even head dimension");
  }
  TANDEM_CHECK(num_query_groups >= 1 && num_attention_heads % num_query_groups == 0,
               "--num-query-groups ", num_query_groups, " does not divide --num-attention-heads ",
               num_attention_heads, ": it must be a divisor of the number of heads");
  TANDEM_CHECK(ffn_hidden_size >= 1, "--ffn-hidden-size ", ffn_hidden_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(num_experts >= 0, "--num-experts ", num_experts,
               " is invalid: use 0 for a dense model or a positive count");
  if (num_experts > 0) {
    TANDEM_CHECK(moe_router_topk >= 1 && moe_router_topk <= num_experts, "--moe-router-topk ",
                 moe_router_topk, " is invalid: it must be between 1 and --num-experts (",
                 num_experts, ")");
  }
  TANDEM_CHECK(moe_aux_loss_coeff >= 0, "--moe-aux-loss-coeff ", moe_aux_loss_coeff,
               " is invalid: it must be >= 0");
  validate_moe_options();
  validate_v3_options();
  validate_mtp_options();
  TANDEM_CHECK(rotary_base > 1, "--rotary-base ", rotary_base, " is invalid: it must be > 1");
  if (use_rope_scaling) {
    TANDEM_CHECK(rope_scaling_factor >= 1, "--rope-scaling-factor ", rope_scaling_factor,
                 " is invalid: it must be >= 1");
    TANDEM_CHECK(rope_low_freq_factor > 0 && rope_high_freq_factor > rope_low_freq_factor,
                 "--rope-low-freq-factor ", rope_low_freq_factor, " and --rope-high-freq-factor ",
                 rope_high_freq_factor, " are invalid: need 0 < low < high");
    TANDEM_CHECK(rope_original_max_position >= 1, "--rope-original-max-position-embeddings ",
                 rope_original_max_position, " is invalid: need at least 1");
  }
  TANDEM_CHECK(norm_epsilon > 0, "--norm-epsilon ", norm_epsilon, " is invalid: it must be > 0");
  TANDEM_CHECK(seq_length >= 2, "--seq-length ", seq_length, " is invalid: need at least 2");
  const long double params = parameter_count(*this);
  TANDEM_CHECK(params <= kMaxParameters, "the model has ", static_cast<double>(params),
               " parameters (--num-layers ", num_layers, ", --hidden-size ", hidden_size,
               ", --num-experts ", num_experts, " ...): at most 2^47 (",
               static_cast<double>(kMaxParameters), ") are possible");
  family_of(*this);  // a model transformers has a class for
}

// MLA, YaRN and the sigmoid router's settings (DeepSeek-V3).
void ModelConfig::validate_v3_options() const {
  TANDEM_CHECK(rope_type == "rope" || rope_type == "yarn", "--rope-type ", rope_type,
               " is invalid: valid: rope, yarn");
  TANDEM_CHECK(moe_router_score_function == "softmax" || moe_router_score_function == "sigmoid",
               "--moe-router-score-function ", moe_router_score_function,
               " is invalid: valid: softmax, sigmoid");
  if (rope_type == "yarn") {
    TANDEM_CHECK(rotary_scaling_factor >= 1, "--rotary-scaling-factor ", rotary_scaling_factor,
                 " is invalid with --rope-type yarn: it must be >= 1");
    TANDEM_CHECK(rope_original_max_position >= 1, "--rope-original-max-position-embeddings ",
                 rope_original_max_position, " is invalid: need at least 1");
  }
  if (multi_latent_attention) {
    struct Size {
      const char* option;
      int64_t value, least;
    };
    for (const Size& z : {Size{"--q-lora-rank", q_lora_rank, 0},
                          {"--kv-lora-rank", kv_lora_rank, 1},
                          {"--qk-head-dim", qk_head_dim, 1},
                          {"--qk-pos-emb-head-dim", qk_pos_emb_head_dim, 2},
                          {"--v-head-dim", v_head_dim, 1}}) {
      check_dimension(z.option, z.value);
      TANDEM_CHECK(z.value >= z.least, z.option, " ", z.value, " is invalid: need at least ",
                   z.least);
    }
    TANDEM_CHECK(qk_pos_emb_head_dim % 2 == 0, "--qk-pos-emb-head-dim ", qk_pos_emb_head_dim,
                 " is odd: rotary embeddings need an even width");
    TANDEM_CHECK(num_query_groups == num_attention_heads, "--num-query-groups ", num_query_groups,
                 " is invalid with --multi-latent-attention: every head has its own k and v, so "
                 "it must equal --num-attention-heads (",
                 num_attention_heads, ")");
  }
  if (moe_router_group_topk > 0 || moe_router_num_groups > 0) {
    const int64_t g = moe_router_num_groups;
    TANDEM_CHECK(g >= 1 && num_experts % g == 0 && num_experts / g >= 2, "--moe-router-num-groups ",
                 g, " is invalid: it must divide --num-experts (", num_experts,
                 ") into groups of at least 2 experts");
    TANDEM_CHECK(moe_router_group_topk >= 1 && moe_router_group_topk <= g &&
                     moe_router_topk <= moe_router_group_topk * (num_experts / g),
                 "--moe-router-group-topk ", moe_router_group_topk,
                 " is invalid: it must lie in [1, --moe-router-num-groups (", g,
                 ")], with enough experts in the chosen groups for --moe-router-topk ",
                 moe_router_topk);
  }
  if (!sigmoid_router()) {
    TANDEM_CHECK(!moe_router_enable_expert_bias && moe_router_num_groups == 0,
                 moe_router_enable_expert_bias ? "--moe-router-enable-expert-bias"
                                               : "--moe-router-num-groups",
                 " needs --moe-router-score-function sigmoid");
  }
}

// Megatron-LM's routing options (docs/model.md "Load balancing", "Expert capacity").
void ModelConfig::validate_routing_options() const {
  const std::string& type = moe_router_load_balancing_type;
  TANDEM_CHECK(
      type == "aux_loss" || type == "seq_aux_loss" || type == "global_aux_loss" || type == "none",
      "--moe-router-load-balancing-type ", type,
      " is invalid: valid: aux_loss, seq_aux_loss, global_aux_loss, none");
  TANDEM_CHECK(moe_router_dtype == "fp32", "--moe-router-dtype ", moe_router_dtype,
               " is not available: tandem's router computes its logits, scores and losses in "
               "fp32 (on the GPU from bf16 products accumulated in fp32, as Megatron-LM's fp32 "
               "router); valid: fp32");
  TANDEM_CHECK(moe_token_drop_policy == "probs" || moe_token_drop_policy == "position",
               "--moe-token-drop-policy ", moe_token_drop_policy,
               " is invalid: valid: probs, position");
  const double factor = moe_expert_capacity_factor;
  TANDEM_CHECK(factor == 0 || is_moe(), "--moe-expert-capacity-factor ", factor,
               " caps the rows of each expert, but --num-experts is 0 (a dense model): set "
               "--num-experts or leave the capacity out");
  TANDEM_CHECK(
      factor > 0 || (moe_token_drop_policy == "probs" && !moe_pad_expert_input_to_capacity),
      moe_pad_expert_input_to_capacity ? "--moe-pad-expert-input-to-capacity"
                                       : "--moe-token-drop-policy position",
      " needs an expert capacity: set --moe-expert-capacity-factor");
  // A capacity above the micro-batch's tokens (k x factor > E) would pad an expert past every
  // token it could receive; Megatron-LM cannot run it either.
  TANDEM_CHECK(!moe_pad_expert_input_to_capacity || static_cast<double>(moe_router_topk) * factor <=
                                                        static_cast<double>(num_experts),
               "--moe-pad-expert-input-to-capacity with --moe-expert-capacity-factor ", factor,
               ": the capacity, tokens x --moe-router-topk (", moe_router_topk, ") / experts (",
               num_experts, ") x the factor, would exceed the tokens; use a factor of at most ",
               static_cast<double>(num_experts) / static_cast<double>(moe_router_topk));
}

void ModelConfig::validate_moe_options() const {
  TANDEM_CHECK(moe_ffn_hidden_size >= 0, "--moe-ffn-hidden-size ", moe_ffn_hidden_size,
               " is invalid: use 0 for --ffn-hidden-size or a positive width");
  TANDEM_CHECK(moe_shared_expert_intermediate_size >= 0, "--moe-shared-expert-intermediate-size ",
               moe_shared_expert_intermediate_size,
               " is invalid: use 0 for no shared expert or a positive width");
  TANDEM_CHECK(!moe_shared_expert_gate || moe_shared_expert_intermediate_size > 0,
               "--moe-shared-expert-gate gates a shared expert, and there is none: set "
               "--moe-shared-expert-intermediate-size");
  validate_routing_options();
  if (!is_moe()) {
    // Settings of the experts mean nothing without them: a mistake, not a no-op.
    const char* moe_only = moe_ffn_hidden_size > 0 ? "--moe-ffn-hidden-size"
                           : moe_shared_expert_intermediate_size > 0
                               ? "--moe-shared-expert-intermediate-size"
                           : moe_router_pre_softmax         ? "--moe-router-pre-softmax"
                           : moe_layer_freq != "1"          ? "--moe-layer-freq"
                           : moe_z_loss_coeff > 0           ? "--moe-z-loss-coeff"
                           : moe_expert_capacity_factor > 0 ? "--moe-expert-capacity-factor"
                                                            : nullptr;
    TANDEM_CHECK(moe_only == nullptr, moe_only,
                 " is set for a dense model (--num-experts 0): "
                 "set --num-experts, or leave it out");
    return;
  }
  const std::vector<bool> pattern = moe_layer_pattern(moe_layer_freq, num_layers);
  TANDEM_CHECK(std::find(pattern.begin(), pattern.end(), true) != pattern.end(),
               "--moe-layer-freq ", moe_layer_freq,
               " makes every layer dense: give at least one MoE layer, or use --num-experts 0");
}

}  // namespace tandem
