// Validation of the run configuration; each message names the value and what would be valid.
#include "core/config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/families.h"

namespace tandem {

std::vector<int64_t> stage_layer_counts(int64_t layers, int64_t stages, int64_t first,
                                        int64_t last) {
  const char* kFirst = "--decoder-first-pipeline-num-layers";
  const char* kLast = "--decoder-last-pipeline-num-layers";
  TANDEM_CHECK(first >= 0 && last >= 0, first < 0 ? kFirst : kLast, " ", first < 0 ? first : last,
               " is invalid: give a layer count >= 1, or 0 for an even share");
  TANDEM_CHECK(stages >= 1 && layers >= stages, "--num-layers ", layers, " is fewer than the ",
               stages,
               " pipeline stages (pipeline size x virtual stages): every stage needs a "
               "layer");
  if (first == 0 && last == 0) {
    TANDEM_CHECK(layers % stages == 0, "--num-layers ", layers, " does not divide into ", stages,
                 " pipeline stages (pipeline size x virtual stages): use a multiple of ", stages,
                 ", or give the first or last stage its own count with ", kFirst, " / ", kLast);
    return std::vector<int64_t>(static_cast<size_t>(stages), layers / stages);
  }
  TANDEM_CHECK(stages >= 2, first ? kFirst : kLast, " ", first ? first : last,
               " sets one pipeline stage's layers, but there is one stage: give "
               "--pipeline-model-parallel-size >= 2 or leave it out");
  const int64_t fixed = (first > 0) + (last > 0);
  const int64_t rest = layers - first - last, between = stages - fixed;
  const std::string given =
      detail::concat(first ? kFirst : "", first ? " " : "", first ? std::to_string(first) : "",
                     first && last ? " and " : "", last ? kLast : "", last ? " " : "",
                     last ? std::to_string(last) : "");
  TANDEM_CHECK(between == 0 ? rest == 0 : rest >= between && rest % between == 0, given, " leave ",
               rest, " of --num-layers ", layers, " to ", between, " other stage(s) of ", stages,
               between == 0 ? ": with two stages the two counts must add up to the layers"
                            : ": they must share them evenly, at least one layer each");
  std::vector<int64_t> counts(static_cast<size_t>(stages), between > 0 ? rest / between : 0);
  if (first > 0) counts.front() = first;
  if (last > 0) counts.back() = last;
  return counts;
}

// Megatron-LM's document options (Note [Document masking] in data/document_masks.h): each needs
// the end-of-document id.
static void validate_document_masking(const TrainConfig& t) {
  for (const auto& [option, on] : {std::pair{"--reset-attention-mask", t.reset_attention_mask},
                                   {"--document-positions", t.document_positions},
                                   {"--eod-mask-loss", t.eod_mask_loss}}) {
    if (!on) continue;
    TANDEM_CHECK(t.eod_token_id >= 0, option,
                 " needs the end-of-document id: give --eod-token-id N (the id `tandem convert "
                 "--append-eod` appended, which its summary prints), or --tokenizer-type "
                 "NullTokenizer, whose end-of-document id is --vocab-size (docs/data.md)");
  }
}

void TrainConfig::validate(int64_t data_parallel_size) const {
  TANDEM_CHECK(micro_batch_size >= 1, "--micro-batch-size ", micro_batch_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(global_batch_size >= 1, "--global-batch-size ", global_batch_size,
               " is invalid: need at least 1");
  TANDEM_CHECK(
      global_batch_size % (micro_batch_size * data_parallel_size) == 0, "--global-batch-size ",
      global_batch_size, " is not a multiple of --micro-batch-size ", micro_batch_size,
      data_parallel_size > 1 ? " x data-parallel size " : "",
      data_parallel_size > 1 ? std::to_string(data_parallel_size) : std::string(),
      ": valid global batch sizes are multiples of ", micro_batch_size * data_parallel_size);
  TANDEM_CHECK(train_iters >= 1, "--train-iters ", train_iters, " is invalid: need at least 1");
  TANDEM_CHECK(lr > 0, "--lr ", lr, " is invalid: it must be > 0");
  for (const auto& [option, value] : {std::pair{"--lr", lr},
                                      {"--min-lr", min_lr},
                                      {"--decoupled-lr", decoupled_lr},
                                      {"--decoupled-min-lr", decoupled_min_lr},
                                      {"--weight-decay", weight_decay},
                                      {"--adam-beta1", adam_beta1},
                                      {"--adam-beta2", adam_beta2},
                                      {"--adam-eps", adam_eps},
                                      {"--clip-grad", clip_grad}}) {
    check_f32(option, value);
  }
  for (const auto& [option, value] : {std::pair{"--micro-batch-size", micro_batch_size},
                                      {"--global-batch-size", global_batch_size}}) {
    check_dimension(option, value);
  }
  validate_lr_schedule(*this);
  validate_document_masking(*this);
  TANDEM_CHECK(weight_decay >= 0, "--weight-decay ", weight_decay, " is invalid: it must be >= 0");
  TANDEM_CHECK(adam_beta1 >= 0 && adam_beta1 < 1, "--adam-beta1 ", adam_beta1,
               " is invalid: it must be in [0, 1)");
  TANDEM_CHECK(adam_beta2 >= 0 && adam_beta2 < 1, "--adam-beta2 ", adam_beta2,
               " is invalid: it must be in [0, 1)");
  TANDEM_CHECK(adam_eps > 0, "--adam-eps ", adam_eps, " is invalid: it must be > 0");
  TANDEM_CHECK(clip_grad >= 0, "--clip-grad ", clip_grad,
               " is invalid: it must be >= 0 (0 turns clipping off)");
  TANDEM_CHECK(log_interval >= 1, "--log-interval ", log_interval, " is invalid: need at least 1");
  TANDEM_CHECK(moe_wgrad_merge >= 1, "--moe-wgrad-merge ", moe_wgrad_merge,
               " is invalid: need at least 1 (micro-batches per expert weight-gradient product)");
  TANDEM_CHECK(!overlap_param_gather || use_distributed_optimizer,
               "--overlap-param-gather gathers the weights the distributed optimizer updated: it "
               "needs --use-distributed-optimizer");
  if (!use_distributed_optimizer) return;
  TANDEM_CHECK(!defer_optimizer,
               "--use-distributed-optimizer and --defer-optimizer do not combine: the deferred "
               "update would have to gather each layer's weights after updating them; use "
               "--overlap-param-gather to gather them beside the next forward, or "
               "--defer-optimizer=false");
  TANDEM_CHECK(rebalance_experts == 0, "--use-distributed-optimizer and --rebalance-experts ",
               rebalance_experts,
               " do not combine: moving an expert would move its Adam moments, which the "
               "distributed optimizer splits over other ranks; use --rebalance-experts 0");
}

void check_expert_split(const ModelConfig& m, int64_t ep) {
  if (m.is_moe()) {
    TANDEM_CHECK(m.num_experts % ep == 0, "--expert-model-parallel-size ", ep,
                 " does not divide --num-experts ", m.num_experts,
                 ": choose a divisor of the number of experts");
  } else {
    TANDEM_CHECK(ep == 1, "--expert-model-parallel-size ", ep,
                 " needs experts, but --num-experts is 0 (a dense model): use 1");
  }
}

void check_comm_overlap(const TrainConfig& t, int64_t ep, CommOverlap overlap) {
  TANDEM_CHECK(overlap != CommOverlap::kSplit || t.device == Device::kCUDA,
               "--comm-overlap split gives each micro-batch of a pair GPU streams of its own; it "
               "needs --device cuda (it is cpu), or use on");
  // Note [Merged expert weight gradients] (model/nodes.h): a group's products read the tensors
  // of its earlier micro-batches on the compute stream of its last; every weight gradient runs
  // on the one compute stream but under kSplit, where a pair's second half has its own.
  TANDEM_CHECK(t.moe_wgrad_merge == 1 || overlap != CommOverlap::kSplit || ep == 1,
               "--moe-wgrad-merge ", t.moe_wgrad_merge,
               " with --comm-overlap split: the second half of a pair runs on a compute stream of "
               "its own; use --comm-overlap on or off, or --moe-wgrad-merge 1");
}

void validate_layout(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p) {
  m.validate();
  t.validate(1);  // the data-parallel size is checked against the layout at the start
  // Note [Sizes that fit] (core/model_config.cc): a micro-batch's tokens index rows too.
  TANDEM_CHECK(t.micro_batch_size <= kMaxDimension / m.seq_length, "--micro-batch-size ",
               t.micro_batch_size, " x --seq-length ", m.seq_length,
               " tokens a micro-batch is too many: at most 2^31 - 1");
  const std::optional<ScheduleKind> kind = parse_enum<ScheduleKind>(p.schedule);
  TANDEM_CHECK(kind.has_value(), "--schedule ", p.schedule,
               " is invalid: it must be one of: ", enum_choices<ScheduleKind>());
  check_expert_split(m, p.expert_model_parallel_size);
  check_tensor_parallel(m, t, p);
  const int64_t chunks = p.pipeline_model_parallel_size * p.virtual_pipeline_model_parallel_size;
  check_mtp_layout(m, chunks);
  check_mtp_overlap(m, p.expert_model_parallel_size, *kind == ScheduleKind::kCombined1f1b);
  TANDEM_CHECK(m.num_layers >= chunks, "--num-layers ", m.num_layers, " is fewer than the ", chunks,
               " model chunks (--pipeline-model-parallel-size x "
               "--virtual-pipeline-model-parallel-size): each chunk needs at least one layer");
  TANDEM_CHECK(!p.pair_first_forwards ||
                   (*kind == ScheduleKind::kCombined1f1b && p.pipeline_model_parallel_size == 1 &&
                    p.virtual_pipeline_model_parallel_size == 1),
               "--pair-first-forwards pairs the first two forwards of combined-1f1b with one "
               "stage; it needs --schedule combined-1f1b (it is ",
               p.schedule, "), --pipeline-model-parallel-size 1 (it is ",
               p.pipeline_model_parallel_size,
               ") and --virtual-pipeline-model-parallel-size 1 (it is ",
               p.virtual_pipeline_model_parallel_size, ")");
  TANDEM_CHECK(t.rebalance_experts == 0 || (m.is_moe() && p.expert_model_parallel_size > 1),
               "--rebalance-experts ", t.rebalance_experts,
               " moves experts between expert-parallel ranks; it needs --num-experts > 0 (it is ",
               m.num_experts, ") and --expert-model-parallel-size > 1 (it is ",
               p.expert_model_parallel_size, "), or 0 (never)");
  check_comm_overlap(t, p.expert_model_parallel_size, p.comm_overlap);
  TANDEM_CHECK(t.moe_wgrad_merge == 1 || m.is_moe(), "--moe-wgrad-merge ", t.moe_wgrad_merge,
               " merges the experts' weight gradients; the model has no experts (--num-experts "
               "0): leave it at 1");
  TANDEM_CHECK(
      *kind != ScheduleKind::kInterleaved1f1b || p.virtual_pipeline_model_parallel_size >= 2,
      "--schedule interleaved-1f1b needs --virtual-pipeline-model-parallel-size >= 2 "
      "(it is ",
      p.virtual_pipeline_model_parallel_size, ")");
}

}  // namespace tandem
