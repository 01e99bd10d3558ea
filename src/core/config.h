// Run configuration: the model (docs/model.md), training and parallel layout. Plain data with
// validation that names the bad value and what is valid. It lives in core, not model, because
// the planner (src/schedule) needs it and must not depend on the model's code.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/enum_names.h"
#include "core/lr_schedule.h"
#include "core/settings.h"

namespace tandem {

// What a training step does when its loss or gradient norm is NaN or Inf (--nan-policy): stop
// with an error naming the iteration, skip the update (no weight or optimizer change), or check
// nothing and update with those values (Megatron-LM's --no-check-for-nan-in-loss-and-grad).
enum class NonFinitePolicy : uint8_t { kStop, kSkip, kContinue };
inline constexpr EnumName<NonFinitePolicy> kNonFinitePolicyNames[] = {
    {NonFinitePolicy::kStop, "stop"},
    {NonFinitePolicy::kSkip, "skip"},
    {NonFinitePolicy::kContinue, "continue"}};
constexpr std::span<const EnumName<NonFinitePolicy>> enum_names(NonFinitePolicy) {
  return kNonFinitePolicyNames;
}

// How RoPE's frequencies are scaled (docs/model.md "Rotary position embedding"): not at all, as
// Llama 3 scales them for a context longer than the one it was trained at, or as YaRN does
// (DeepSeek-V3).
enum class RopeScaling : uint8_t { kNone, kLlama3, kYarn };

// RoPE's frequencies, as the ops take them: the base theta and the scaling.
struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 8.0;            // Llama 3: low frequencies divided by this
  double low_freq_factor = 1.0;   // Llama 3: wavelengths above original / low_freq_factor scaled
  double high_freq_factor = 4.0;  // Llama 3: below original / high_freq_factor kept
  int64_t original_max_position = 8192;  // Llama 3, YaRN: the context the model was trained at
  double beta_fast = 32.0;               // YaRN: rotations above which a frequency is kept
  double beta_slow = 1.0;                // YaRN: rotations below which it is divided by factor
  double mscale = 1.0;                   // YaRN: cos and sin scaled by attention_factor()
  double mscale_all_dim = 0.0;           // YaRN: see attention_factor() and mla_softmax_scale()
  // --rotary-interleaved (DeepSeek-V3's rope_interleave): the pairs rotated together are the
  // neighbouring columns (2i, 2i + 1), written out as rotate_half's (i, i + D/2).
  bool interleaved = false;

  RopeSpec() = default;
  explicit RopeSpec(double base) : theta(base) {}
};

// inv_freq[i] for i < head_dim / 2, in double: theta^(-2i / head_dim), then scaled as `rope`
// says (Llama 3: wavelengths 2 pi / inv_freq above original / low_freq_factor divided by factor,
// below original / high_freq_factor kept, interpolated between). Both backends rotate by these.
std::vector<double> rope_inv_freq(const RopeSpec& rope, int64_t head_dim);
// YaRN's m(s, x) = 0.1 x ln(s) + 1 for s > 1, else 1.
double yarn_mscale(double factor, double mscale);
// What cos and sin are multiplied by: YaRN's m(factor, mscale) / m(factor, mscale_all_dim)
// (m(factor, 1) when either is 0); 1 otherwise.
double rope_attention_factor(const RopeSpec& rope);

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
  RopeSpec rope() const;
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
  // The softmax's scale: 1/sqrt(qk_dim()), times YaRN's m(factor, mscale_all_dim)^2 with MLA.
  double softmax_scale() const;
  // Throws tandem::Error naming the first value that does not fit.
  void validate() const;

 private:
  void validate_moe_options() const;
  void validate_routing_options() const;
  void validate_v3_options() const;
  void validate_mtp_options() const;  // core/config_mtp.cc
};

// The transformers class a model is saved as (docs/model.md "Families"); its config.json keys
// and weight names are that class's.
enum class ModelFamily : uint8_t { kLlama, kMixtral, kQwen3Moe, kQwen2Moe, kDeepseekV3 };
const char* family_class_name(ModelFamily f);
// The family that expresses `m`; throws tandem::Error naming the setting no family has.
ModelFamily family_of(const ModelConfig& m);

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
};
const std::vector<ModelField>& model_fields();
// The checkpoint JSON key of a field: its name with '_' for '-'.
std::string field_json_key(const ModelField& f);

struct TrainConfig {
  int64_t micro_batch_size = 8;
  int64_t global_batch_size = 16;
  int64_t train_iters = 300;
  double lr = 3e-3;
  // The learning-rate schedule (Note [Learning-rate schedule] in core/lr_schedule.h), with
  // Megatron-LM's defaults: no warm-up, a linear decay to 0 over the run.
  double min_lr = 0.0;
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;  // 0: decay over train_iters
  LrDecayStyle lr_decay_style = LrDecayStyle::kLinear;
  LrWsdDecayStyle lr_wsd_decay_style = LrWsdDecayStyle::kExponential;
  int64_t lr_wsd_decay_iters = -1;  // WSD's annealing iterations; -1: not given
  double lr_warmup_init = 0.0;      // the rate the warm-up starts from
  double lr_warmup_fraction = -1;   // the warm-up as a share of the decay; -1: not given
  // --decoupled-lr / --decoupled-min-lr (Megatron-LM's): the peak and final rates of the input
  // embedding and the output layer, on the same schedule as the rest
  // (Note [Decoupled learning rate] in core/lr_schedule.h); -1: not given (then --lr, --min-lr).
  double decoupled_lr = -1;
  double decoupled_min_lr = -1;
  // --train-samples: a run by samples (0: by iterations); train_iters is then
  // train_samples / global_batch_size and the schedule's lengths are in samples.
  int64_t train_samples = 0;
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;       // 0: decay over train_samples
  int64_t lr_wsd_decay_samples = -1;  // -1: not given
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;
  uint64_t seed = 1234;
  int64_t log_interval = 10;
  NonFinitePolicy non_finite_policy = NonFinitePolicy::kStop;
  // --no-check-for-nan-in-loss-and-grad (Megatron-LM's): --nan-policy continue.
  bool no_check_for_nan = false;
  // --calculate-per-token-loss (Megatron-LM's): the step's loss is the sum over its tokens over
  // the number of tokens of the global batch, not the mean of the micro-batches' means (every
  // token counts, so the two are the same value: Note [Per-token loss] in runtime/step.h).
  bool calculate_per_token_loss = false;
  Device device = Device::kCPU;  // --device cpu | cuda (one GPU per process)
  // Megatron-LM's document masking of packed samples (Note [Document masking] in
  // data/document_masks.h), on the CPU: --reset-attention-mask (each token attends within its
  // document), --reset-position-ids (RoPE positions restart at each document) and --eod-mask-loss
  // (no loss where the input is the end-of-document token). eod_token_id is the id they split
  // on (--eod-token-id, or --vocab-size with --tokenizer-type NullTokenizer); -1: not known.
  bool reset_attention_mask = false;
  bool reset_position_ids = false;
  bool eod_mask_loss = false;
  int64_t eod_token_id = -1;
  bool document_masking() const {
    return reset_attention_mask || reset_position_ids || eod_mask_loss;
  }
  // --recompute-experts: the experts keep only their input rows from forward to backward and
  // form gate, up and the SwiGLU again there (Note [Recomputed experts] in model/ffn_nodes.cc).
  bool recompute_experts = false;
  // --moe-wgrad-merge: the experts' weight gradients of this many micro-batches summed in one
  // product per expert (Note [Merged expert weight gradients] in model/nodes.h); 1: each
  // micro-batch's own products.
  int64_t moe_wgrad_merge = 1;
  // --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (Megatron-LM's
  // names): the layers of the first and of the last pipeline stage (0: an even share); the other
  // stages share the rest evenly (stage_layer_counts below).
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  // --offload-activations: the node kinds whose saved tensors wait in host memory between a
  // layer's forward and its backward, comma-separated (Note [Activation offload] in
  // runtime/activation_offload.h; parse_offload_kinds in core/footprint.h); empty: none.
  std::string offload_activations;
  // --moe-router-force-load-balancing (benchmarks only, as Megatron-LM's flag of that name): the
  // router's logits are replaced by random normal ones, the same on every layout, so every
  // expert (and expert rank) receives about the same rows; their gradient still trains the
  // router (Note [Forced load balancing] in model/attention_node.cc).
  bool moe_router_force_balance = false;
  // --rebalance-experts N: every N steps, lay each MoE layer's experts out anew over the
  // expert-parallel ranks from the rows they received (Note [Rebalancing experts] in
  // runtime/expert_rebalance.h); 0: never. The results do not change, only which rank runs which.
  int64_t rebalance_experts = 0;
  // --defer-optimizer (pipeline trainer): each step's AdamW update runs layer by layer inside
  // the next step's first forward, just before that forward reads each layer's weights (Note
  // [Deferred update] in runtime/optimizer.cc); the values are those of updating at the step's
  // end.
  bool defer_optimizer = false;
  // --overlap-grad-reduce (pipeline trainer, data-parallel or expert-data-parallel groups of more
  // than one rank): each unit's gradients (a layer, the embedding, the head) are all-reduced as
  // soon as the step's last weight gradient of that unit is issued, beside the rest of the
  // backward, instead of all at the step's end (Note [Gradients reduced beside the backward] in
  // runtime/grad_reduce.cc).
  bool overlap_grad_reduce = true;
  // --use-distributed-optimizer (pipeline trainer, Megatron-LM's): the Adam moments of each
  // weight split over the ranks that replicate it, the gradients reduce-scattered instead of
  // all-reduced, each rank updating its part and the weights all-gathered after
  // (Note [Distributed optimizer] in runtime/distributed_optimizer.cc).
  bool use_distributed_optimizer = false;
  // --overlap-param-gather (with use_distributed_optimizer): the weights gathered just before
  // the next step's forward reads them instead of right after the update
  // (Note [Weights gathered beside the forward] in runtime/distributed_optimizer.cc).
  bool overlap_param_gather = false;

  // Micro-batches per data-parallel rank in one step.
  int64_t num_microbatches(int64_t data_parallel_size = 1) const {
    return global_batch_size / (micro_batch_size * data_parallel_size);
  }
  void validate(int64_t data_parallel_size = 1) const;
};

// Note [Uneven stages]: the layers of each of `stages` pipeline stages (the schedule's stages,
// pipeline size x virtual stages, in stage order), for the trainer and the planner alike. With
// first and last 0, layers / stages each (they must divide). A nonzero `first` gives stage 0
// that many, a nonzero `last` the last stage that many, and the stages between share the rest
// evenly (they must divide it; with two stages and both given, first + last must be the layers).
// Every stage holds at least one layer. Throws tandem::Error naming the options and what is
// valid. A model whose layer count has no even split over the stages (DeepSeek-V3's 61) trains
// on a pipeline this way, as with Megatron-LM's options of the same names.
std::vector<int64_t> stage_layer_counts(int64_t layers, int64_t stages, int64_t first = 0,
                                        int64_t last = 0);

enum class ScheduleKind : uint8_t {
  kGpipe,
  k1f1b,
  kInterleaved1f1b,
  kCombined1f1b,
  kZbH1,
  kDualPipeV,
};
constexpr int kNumScheduleKinds = 6;
// --schedule's names, the pipeline schedules of src/schedule/generators.h
// (Note [One name table per enumeration] in core/enum_names.h).
inline constexpr EnumName<ScheduleKind> kScheduleKindNames[] = {
    {ScheduleKind::kGpipe, "gpipe"},
    {ScheduleKind::k1f1b, "1f1b"},
    {ScheduleKind::kInterleaved1f1b, "interleaved-1f1b"},
    {ScheduleKind::kCombined1f1b, "combined-1f1b"},
    {ScheduleKind::kZbH1, "zb-h1"},
    {ScheduleKind::kDualPipeV, "dualpipev"},
};
static_assert(std::size(kScheduleKindNames) == kNumScheduleKinds);
constexpr std::span<const EnumName<ScheduleKind>> enum_names(ScheduleKind) {
  return kScheduleKindNames;
}

// --comm-overlap: where a combined action's all-to-all runs (runtime/stream_executor.h issues
// it). Whether combined forward-backward actions run their all-to-all nodes on a communication
// stream of their own (a worker thread on the CPU, a high-priority CUDA stream on the GPU) or
// everything in order on the compute stream. kSplit (GPU only): as kOn, and the two halves of a
// pair each get a compute and a communication stream of their own (Note [A stream pair per half]
// in runtime/combined.cc).
enum class CommOverlap : uint8_t { kOff, kOn, kSplit };
inline constexpr EnumName<CommOverlap> kCommOverlapNames[] = {
    {CommOverlap::kOn, "on"}, {CommOverlap::kOff, "off"}, {CommOverlap::kSplit, "split"}};
constexpr std::span<const EnumName<CommOverlap>> enum_names(CommOverlap) {
  return kCommOverlapNames;
}

struct ParallelConfig {
  int64_t pipeline_model_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  int64_t virtual_pipeline_model_parallel_size = 1;
  std::string schedule = "1f1b";     // a name of kScheduleKindNames
  bool pair_first_forwards = false;  // combined-1f1b, one stage: (0F0;0F1) first
  CommOverlap comm_overlap = CommOverlap::kOn;
  double comm_timeout_s = 120;  // --comm-timeout: the bound on every wait for another rank
  // --distributed-timeout-minutes (Megatron-LM's): comm_timeout_s in minutes; 0: not given.
  int64_t distributed_timeout_minutes = 0;
};

// Note [Layout rules]: the rules the model's, training's and parallel settings keep across one
// another, each written once. The command line applies all of them (validate_layout, from
// cli::validate_run_options); the trainer and the planner, which tests and benchmarks build
// without the command line, apply the ones their inputs carry (the check_* below). Each throws
// tandem::Error naming the options and values.
void validate_layout(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p);
// Multi-token prediction on the layout (core/config_mtp.cc): one pipeline chunk.
void check_mtp_layout(const ModelConfig& m, int64_t pipeline_chunks);
// And on the schedule: no overlapped pairs (combined-1f1b) with expert ranks when the modules'
// layers are MoE.
void check_mtp_overlap(const ModelConfig& m, int64_t expert_parallel_size, bool paired_actions);
// The experts split evenly over `ep` expert-parallel ranks (a dense model only over one).
void check_expert_split(const ModelConfig& m, int64_t ep);
// --comm-overlap's rules: split needs GPUs, and --moe-wgrad-merge needs one compute stream a
// micro-batch pair under expert parallelism.
void check_comm_overlap(const TrainConfig& t, int64_t ep, CommOverlap overlap);

}  // namespace tandem
