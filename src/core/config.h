// Run configuration: training and the parallel layout, with the model of core/model_config.h.
// Plain data with validation that names the bad value and what is valid. It lives in core, not
// runtime, because the planner (src/planner) needs it and must not depend on the runtime.
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
#include "core/model_config.h"
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
  // --calculate-per-token-loss (Megatron-LM's): the step's loss is the sum over the global
  // batch's tokens of weight 1 over their number, not the mean of the micro-batches' means (the
  // same value unless --eod-mask-loss drops tokens: Note [Per-token loss] in runtime/step.h).
  bool calculate_per_token_loss = false;
  Device device = Device::kCPU;  // --device cpu | cuda (one GPU per process)
  // Megatron-LM's document masking of packed samples (Note [Document masking] in
  // data/document_masks.h), on either device: --reset-attention-mask (each token attends within its
  // document), --document-positions (RoPE positions restart at each document) and --eod-mask-loss
  // (no loss where the input is the end-of-document token). eod_token_id is the id they split
  // on (--eod-token-id, or --vocab-size with --tokenizer-type NullTokenizer); -1: not known.
  bool reset_attention_mask = false;
  bool document_positions = false;
  bool eod_mask_loss = false;
  int64_t eod_token_id = -1;
  bool document_masking() const {
    return reset_attention_mask || document_positions || eod_mask_loss;
  }
  // How many of the three masks a micro-batch carries (each an i32 a token).
  int64_t document_mask_count() const {
    return int64_t{reset_attention_mask} + int64_t{document_positions} + int64_t{eod_mask_loss};
  }
  // --recompute-experts: the experts keep only their input rows from forward to backward and
  // form gate, up and the SwiGLU again there (Note [Recomputed experts] in model/ffn_nodes.cc).
  bool recompute_experts = false;
  // --recompute: the modules that keep only their input from forward to backward and form
  // their activations again there, comma-separated (Megatron-LM's names: mlp, shared_experts;
  // Note [Recomputed modules] in model/ffn_nodes.cc, parse_recompute in core/footprint.h);
  // empty: none. The values are the same either way.
  std::string recompute;
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
  int64_t tensor_model_parallel_size = 1;  // TP (Note [Tensor parallelism] in core/config_tp.cc)
  bool sequence_parallel = false;          // with TP > 1: activations split along the sequence
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
// Tensor (and sequence) parallelism's rules (core/config_tp.cc): TP divides the heads, the query
// groups, the FFN width, the vocabulary and (with --sequence-parallel) the sequence; what TP does
// not run yet is refused by name.
void check_tensor_parallel(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p);
// The model one tensor-parallel rank of `tp` computes (Note [Tensor parallelism] in
// core/config_tp.cc): heads/tp query heads, groups/tp key-value groups and an FFN of width
// ffn/tp, with the head width kept; hidden size, vocabulary and layers as the model's.
ModelConfig tensor_parallel_shard(const ModelConfig& m, int64_t tp);
// --comm-overlap's rules: split needs GPUs, and --moe-wgrad-merge needs one compute stream a
// micro-batch pair under expert parallelism.
void check_comm_overlap(const TrainConfig& t, int64_t ep, CommOverlap overlap);

}  // namespace tandem
