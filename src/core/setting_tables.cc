// The model's, training's, parallel and performance settings, one row each
// (Note [Every setting declared once] in core/settings.h). Megatron-LM's names mean what they mean
// there.
#include "core/setting_tables.h"

#include <variant>

namespace tandem {
namespace {

constexpr FieldBound kPositive = FieldBound::kPositive;
constexpr FieldBound kNonNegative = FieldBound::kNonNegative;

}  // namespace

Settings model_settings(ModelConfig& m) {
  Settings rows;
  for (const ModelField& f : model_fields()) {
    std::visit(
        [&](auto member) {
          rows.push_back({.name = f.name,
                          .ref = &(m.*member),
                          .help = f.help,
                          .bound = f.bound,
                          .default_text = f.default_text != nullptr ? f.default_text : "",
                          .saved = Saved::kFixed,
                          .in_every_checkpoint = f.in_every_checkpoint});
        },
        f.member);
  }
  return in_group(SettingGroup::kModel, std::move(rows));
}

Settings train_settings(TrainConfig& t) {
  return in_group(
      SettingGroup::kTraining,
      {
          {.name = "micro-batch-size",
           .ref = &t.micro_batch_size,
           .help = "samples per micro-batch",
           .bound = kPositive,
           .saved = Saved::kDefault},
          {.name = "global-batch-size",
           .ref = &t.global_batch_size,
           .help = "samples per optimizer step; a multiple of micro-batch-size",
           .bound = kPositive,
           .saved = Saved::kFixed},
          {.name = "train-iters",
           .ref = &t.train_iters,
           .help = "optimizer steps to run",
           .bound = kPositive,
           .saved = Saved::kRecorded},
          {.name = "train-samples",
           .ref = &t.train_samples,
           .help = "a run by samples instead of --train-iters: it runs train-samples / "
                   "global-batch-size steps and the schedule counts samples; 0: by --train-iters",
           .bound = kNonNegative,
           .saved = Saved::kRecorded,
           .in_every_checkpoint = false},
          {.name = "lr",
           .ref = &t.lr,
           .help = "peak learning rate, reached after the warm-up",
           .bound = kPositive,
           .saved = Saved::kDefault},
          {.name = "min-lr",
           .ref = &t.min_lr,
           .help = "the learning rate the decay ends at, and the floor of inverse-square-root",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "decoupled-lr",
           .ref = &t.decoupled_lr,
           .help = "the peak learning rate of the input embedding and the output layer, on the "
                   "schedule of --lr (Megatron-LM's; the other weights keep --lr)",
           .default_text = "none",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "decoupled-min-lr",
           .ref = &t.decoupled_min_lr,
           .help = "with --decoupled-lr: the learning rate the embedding's and output layer's "
                   "decay ends at",
           .default_text = "--min-lr",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-decay-style",
           .ref = enum_ref(&t.lr_decay_style),
           .help = "how the learning rate falls from --lr to --min-lr after the warm-up "
                   "(Megatron-LM's; docs/model.md \"Learning-rate schedule\")",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-wsd-decay-style",
           .ref = enum_ref(&t.lr_wsd_decay_style),
           .help = "--lr-decay-style WSD: the shape of the annealing phase at the decay's end",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-wsd-decay-iters",
           .ref = &t.lr_wsd_decay_iters,
           .help = "--lr-decay-style WSD: iterations of the annealing phase, the last of the decay "
                   "(needed with WSD; 0: none)",
           .metavar = "N",
           .default_text = "none",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-wsd-decay-samples",
           .ref = &t.lr_wsd_decay_samples,
           .help = "as --lr-wsd-decay-iters, in samples, for a run by --train-samples",
           .metavar = "N",
           .default_text = "none",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-warmup-iters",
           .ref = &t.lr_warmup_iters,
           .help = "iterations of linear learning-rate warm-up from --lr-warmup-init to --lr",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "lr-warmup-samples",
           .ref = &t.lr_warmup_samples,
           .help = "as --lr-warmup-iters, in samples, for a run by --train-samples",
           .bound = kNonNegative,
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-warmup-fraction",
           .ref = &t.lr_warmup_fraction,
           .help = "the warm-up as this share of the decay length, instead of "
                   "--lr-warmup-iters or --lr-warmup-samples",
           .default_text = "none",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-warmup-init",
           .ref = &t.lr_warmup_init,
           .help = "the learning rate the warm-up starts from: the first update's",
           .bound = kNonNegative,
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "lr-decay-iters",
           .ref = &t.lr_decay_iters,
           .help = "iterations the decay ends at (counted from the run's start); 0: "
                   "--train-iters",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "lr-decay-samples",
           .ref = &t.lr_decay_samples,
           .help = "as --lr-decay-iters, in samples, for a run by --train-samples; 0: "
                   "--train-samples",
           .bound = kNonNegative,
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "weight-decay",
           .ref = &t.weight_decay,
           .help = "AdamW weight decay on matrices",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "adam-beta1",
           .ref = &t.adam_beta1,
           .help = "AdamW beta1, in [0, 1)",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "adam-beta2",
           .ref = &t.adam_beta2,
           .help = "AdamW beta2, in [0, 1)",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "adam-eps",
           .ref = &t.adam_eps,
           .help = "AdamW epsilon",
           .bound = kPositive,
           .saved = Saved::kDefault},
          {.name = "clip-grad",
           .ref = &t.clip_grad,
           .help = "clip the global gradient norm to this; 0 turns it off",
           .bound = kNonNegative,
           .saved = Saved::kDefault},
          {.name = "seed",
           .ref = &t.seed,
           .help = "seed of initialisation and data order",
           .bound = kNonNegative,
           .saved = Saved::kFixed},
          {.name = "log-interval",
           .ref = &t.log_interval,
           .help = "steps between log lines",
           .bound = kPositive,
           .saved = Saved::kRecorded},
          {.name = "nan-policy",
           .ref = enum_ref(&t.non_finite_policy),
           .help = "when the loss or gradients are NaN or Inf: stop with an error naming the "
                   "iteration, skip that step's update, or continue with the update as it is (no "
                   "check)",
           .saved = Saved::kDefault},
          {.name = "no-check-for-nan-in-loss-and-grad",
           .ref = &t.no_check_for_nan,
           .help = "Megatron-LM's: no check of the loss and gradients, a NaN or Inf reaching the "
                   "weights; the same as --nan-policy continue"},
          {.name = "calculate-per-token-loss",
           .ref = &t.calculate_per_token_loss,
           .help = "Megatron-LM's: the step's loss is its tokens' summed loss over the global "
                   "batch's count of tokens with a loss, not the mean of the micro-batches' means "
                   "(the same value unless --eod-mask-loss drops tokens; docs/model.md)"},
          {.name = "reset-attention-mask",
           .ref = &t.reset_attention_mask,
           .help = "Megatron-LM's: each token attends only to the tokens of its own document, "
                   "documents ending at --eod-token-id (docs/data.md)",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "document-positions",
           .ref = &t.document_positions,
           .help = "RoPE positions restart at 0 after each --eod-token-id, as if each document "
                   "were a sample of its own (Megatron-LM's --reset-position-ids does not reach "
                   "its RoPE; docs/data.md)",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "eod-mask-loss",
           .ref = &t.eod_mask_loss,
           .help = "Megatron-LM's: no loss where the input is --eod-token-id; each "
                   "micro-batch's loss the mean over its other tokens (docs/data.md)",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "eod-token-id",
           .ref = &t.eod_token_id,
           .help = "the end-of-document id the document options split on: the id `tandem "
                   "convert --append-eod` appended; with --tokenizer-type NullTokenizer "
                   "--vocab-size, as Megatron-LM's",
           .default_text = "none",
           .saved = Saved::kDefault,
           .in_every_checkpoint = false},
          {.name = "device",
           .ref = enum_ref(&t.device),
           .help = "where to train: cpu (OpenBLAS, f32) or cuda (one GPU per process, bf16 "
                   "activations, f32 master weights; needs a binary built with CUDA)"},
          {.name = "recompute-experts",
           .ref = &t.recompute_experts,
           .help = "MoE: the experts keep only their input rows for the backward and form gate, "
                   "up and the SwiGLU again there (less activation memory, one more pass of the "
                   "gate and up products)"},
          {.name = "recompute",
           .ref = &t.recompute,
           .help = "the modules that keep only their input for the backward and form their "
                   "activations again there, a comma-separated list of Megatron-LM's names: "
                   "mlp (the dense SwiGLU), shared_experts (a MoE layer's shared expert); the "
                   "same values, less activation memory, one more pass of their gate and up "
                   "products (docs/memory.md)",
           .metavar = "MODULES",
           .default_text = "none"},
          {.name = "moe-wgrad-merge",
           .ref = &t.moe_wgrad_merge,
           .help = "MoE: sum the experts' weight gradients of this many micro-batches in one "
                   "product per expert (their rows gathered expert-major; the f32 gradients "
                   "read and written once per N micro-batches instead of every one; the tensors "
                   "of the waiting micro-batches stay until then: docs/memory.md); 1: each "
                   "micro-batch's own",
           .bound = kPositive},
          {.name = "offload-activations",
           .ref = &t.offload_activations,
           .help = "keep the tensors these nodes save for their backward in the host's memory "
                   "from the end of a layer's forward until one layer before its backward, "
                   "copied on streams of their own beside the compute (less device memory, the "
                   "same results): a comma-separated list of attention, experts, shared-expert, "
                   "combine, mlp (docs/memory.md)",
           .metavar = "KINDS",
           .default_text = "none"},
          {.name = "moe-router-force-load-balancing",
           .ref = &t.moe_router_force_balance,
           .help = "MoE, for benchmarks only (Megatron-LM's): the router's logits replaced by "
                   "random normal ones, the same on every layout, so the experts get even loads "
                   "on average; their gradient still trains the router"},
      });
}

Settings parallel_settings(ParallelConfig& p, TrainConfig& t) {
  return in_group(
      SettingGroup::kParallel,
      {
          {.name = "tensor-model-parallel-size",
           .ref = &p.tensor_model_parallel_size,
           .help = "TP, ranks each layer's matrices are split over (Megatron-LM's column- and "
                   "row-parallel layers); divides the heads, query groups, ffn-hidden-size and "
                   "the vocabulary. Its layout and rules are checked; runs with TP > 1 are "
                   "refused until its layers are built (docs/parallel.md)",
           .bound = kPositive},
          {.name = "sequence-parallel",
           .ref = &p.sequence_parallel,
           .help = "with TP > 1: the activations between the tensor-parallel layers split along "
                   "the sequence over the TP ranks (--seq-length a multiple of TP); with TP 1 it "
                   "splits nothing, as in Megatron-LM"},
          {.name = "pipeline-model-parallel-size",
           .ref = &p.pipeline_model_parallel_size,
           .help = "PP, pipeline stages",
           .bound = kPositive},
          {.name = "expert-model-parallel-size",
           .ref = &p.expert_model_parallel_size,
           .help = "EP, ranks the experts are spread over; divides num-experts",
           .bound = kPositive},
          {.name = "virtual-pipeline-model-parallel-size",
           .ref = &p.virtual_pipeline_model_parallel_size,
           .help = "model chunks per pipeline rank (>= 2 for interleaved-1f1b)",
           .bound = kPositive},
          {.name = "decoder-first-pipeline-num-layers",
           .ref = &t.first_stage_layers,
           .help = "layers of the first pipeline stage (the first model chunk with virtual "
                   "stages); the stages between the first and the last share the rest evenly, "
                   "for a layer count that does not split evenly (docs/parallel.md)",
           .bound = kNonNegative,
           .metavar = "N",
           .default_text = "an even share"},
          {.name = "decoder-last-pipeline-num-layers",
           .ref = &t.last_stage_layers,
           .help = "layers of the last pipeline stage (the last model chunk with virtual stages)",
           .bound = kNonNegative,
           .metavar = "N",
           .default_text = "an even share"},
          {.name = "schedule",
           .ref = &p.schedule,
           .help = "pipeline schedule",
           .choices = enum_name_list<ScheduleKind>()},
          {.name = "pair-first-forwards",
           .ref = &p.pair_first_forwards,
           .help = "combined-1f1b with one pipeline stage (expert parallelism): run the first "
                   "two forwards as one pair, (0F0;0F1), so the first forward's all-to-all "
                   "overlaps the second's compute; holds one more micro-batch's activations"},
          {.name = "comm-overlap",
           .ref = enum_ref(&p.comm_overlap),
           .help = "combined-1f1b and dualpipev with expert parallelism: run the expert "
                   "all-to-all on a communication stream of its own, overlapped with the other "
                   "micro-batch's compute (on), or in order on the compute stream (off); split "
                   "(GPUs): each micro-batch of a pair on a compute and a communication stream "
                   "of its own"},
          {.name = "defer-optimizer",
           .ref = &t.defer_optimizer,
           .help = "run each step's AdamW update layer by layer inside the next step's first "
                   "forward, just before it reads each layer's weights; on GPUs with expert "
                   "parallelism and --comm-overlap, that forward's all-to-all then runs beside "
                   "the update (the results do not change); --defer-optimizer=false: never",
           .default_text = "on with --device cuda, --expert-model-parallel-size > 1 and "
                           "--schedule combined-1f1b with --comm-overlap on or split, else off"},
          {.name = "overlap-grad-reduce",
           .ref = &t.overlap_grad_reduce,
           .help = "with data parallelism: all-reduce each layer's gradients as soon as the "
                   "step's backward has finished with that layer, beside the backward of the "
                   "layers below it, instead of all of them after the backward; "
                   "--overlap-grad-reduce=false: at the step's end"},
          {.name = "use-distributed-optimizer",
           .ref = &t.use_distributed_optimizer,
           .help = "with data parallelism: split each weight's Adam moments over the ranks that "
                   "replicate it (the data-parallel ranks; an expert's, its "
                   "expert-data-parallel ranks); gradients are reduce-scattered, each rank "
                   "updates its part and the weights are all-gathered; the results do not "
                   "change"},
          {.name = "overlap-param-gather",
           .ref = &t.overlap_param_gather,
           .help = "with --use-distributed-optimizer: all-gather each layer's updated weights "
                   "just before the next step's forward reads them, instead of right after the "
                   "update"},
          {.name = "rebalance-experts",
           .ref = &t.rebalance_experts,
           .help = "MoE with expert parallelism: every N steps, lay each layer's experts out "
                   "anew over the expert-parallel ranks so that each rank's experts take about "
                   "the same rows (measured over those N steps), moving their weights and Adam "
                   "moments; the results do not change; 0: never",
           .bound = kNonNegative,
           .metavar = "N"},
          {.name = "comm-timeout",
           .ref = &p.comm_timeout_s,
           .help = "seconds any rank waits for another before it stops with an error naming the "
                   "operation and the peer",
           .bound = kPositive},
          {.name = "distributed-timeout-minutes",
           .ref = &p.distributed_timeout_minutes,
           .help = "Megatron-LM's: the same bound in minutes (--comm-timeout 60 x N)",
           .bound = kNonNegative,
           .metavar = "N",
           .default_text = "none: --comm-timeout"},
      });
}

Settings tuning_settings(Tuning& t) {
  std::vector<std::string> grouped(std::begin(kExpertGroupedValues),
                                   std::end(kExpertGroupedValues));
  const char* variant = "(GPUs) the tile shape of the attention kernels of ";
  const char* variant_tail = ", by name or index (docs/cuda.md, bench/attention_timing)";
  return in_group(
      SettingGroup::kPerformance,
      {
          {.name = "gemm-tune",
           .ref = &t.gemm_tune,
           .help = "(GPUs) time up to 8 of cuBLASLt's candidates at a product's first call and "
                   "keep the fastest of those with the first choice's bits; "
                   "--gemm-tune=false: the first choice"},
          {.name = "expert-lanes",
           .ref = &t.expert_lanes,
           .help = "(GPUs) streams the experts' products of a node run on side by side; 1: in "
                   "order on the compute stream",
           .bound = kPositive,
           .most = static_cast<double>(kMaxExpertLanes),
           .metavar = "N"},
          {.name = "expert-grouped",
           .ref = &t.expert_grouped,
           .help = "(GPUs) which phases of the experts' products run as one call for all "
                   "experts: auto (when they average fewer than 512 rows each), none, forward, "
                   "input, or forward,input",
           .choices = grouped},
          {.name = "attention-forward-variant",
           .ref = &t.attention_forward,
           .help = std::string(variant) + "head dim 64's forward" + variant_tail,
           .metavar = "NAME",
           .default_text = "the first"},
          {.name = "attention-backward-variant",
           .ref = &t.attention_backward,
           .help = std::string(variant) +
                   "head dim 64's backward (and the backward form of "
                   "head dim 128)" +
                   variant_tail,
           .metavar = "NAME",
           .default_text = "the first"},
          {.name = "attention-forward128-variant",
           .ref = &t.attention_forward128,
           .help = std::string(variant) + "head dim 128's forward" + variant_tail,
           .metavar = "NAME",
           .default_text = "the first"},
          {.name = "attention-backward128-variant",
           .ref = &t.attention_backward128,
           .help = std::string(variant) + "head dim 128's deterministic backward" + variant_tail,
           .metavar = "NAME",
           .default_text = "the first"},
      });
}

}  // namespace tandem
