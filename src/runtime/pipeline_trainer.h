// The trainer: one rank's training step on any layout of pipeline, expert and data
// parallelism, one process alone included. The rank runs its list of schedule actions over its
// stages for every micro-batch of a step, sends and receives between pipeline ranks, reduces the
// gradients over the data-parallel groups, and updates its weights.
//
// The step's parts, each a unit of its own:
//   StreamExecutor (stream_executor.h, combined.cc)  a stage's nodes on the rank's streams
//   Streams (streams.h: cpu_streams.h, device_streams.h)  the CPU's threads or the GPU's streams
//   GradReducer (grad_reduce.h)          gradient all-reduces and the global gradient norm
//   DeferredUpdate (deferred_update.h)   the optimizer update moved into the next step
//   ExpertRebalancer (expert_rebalance.h)  experts laid out anew between steps
//   StepMeter (step_meter.h)             the measured timeline and communication figures
// The tests hold it to a sequential oracle: the same model on one rank, micro-batch after
// micro-batch.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "data/dataset.h"
#include "model/chunk.h"
#include "runtime/deferred_update.h"
#include "runtime/expert_rebalance.h"
#include "runtime/grad_reduce.h"
#include "runtime/groups.h"
#include "runtime/stage.h"
#include "runtime/step.h"
#include "runtime/step_meter.h"
#include "runtime/stream_executor.h"
#include "runtime/streams.h"
#include "schedule/action.h"
#include "schedule/routing_file.h"

namespace tandem::runtime {

// Which part of the model a pipeline stage holds: its layers by stage_layer_counts (core/config.h,
// with TrainConfig's first and last stage counts); throws when they do not split.
model::ChunkSpec stage_spec(const ModelConfig& m, int32_t stage, int32_t num_stages,
                            const comm::ParallelLayout& layout, int rank, int64_t first_layers = 0,
                            int64_t last_layers = 0);

// What PipelineTrainer::evaluate measured: the mean over its batches of each batch's losses,
// which are the global batch's means over micro-batches as a step's are (StepResult).
struct EvalResult {
  double lm_loss = 0;   // mean cross-entropy
  double aux_loss = 0;  // mean of the summed router aux losses
  int64_t batches = 0;
  int64_t tokens = 0;  // over every batch
};

class PipelineTrainer {
 public:
  // `sched` must be validated; its stages are laid on pipeline ranks by its stage_rank map.
  PipelineTrainer(const ModelConfig& m, const TrainConfig& t, const schedule::Schedule& sched,
                  Groups& groups, const data::Dataset& data, DType dtype = DType::kF32,
                  CommOverlap overlap = CommOverlap::kOn);
  ~PipelineTrainer();
  PipelineTrainer(const PipelineTrainer&) = delete;
  PipelineTrainer& operator=(const PipelineTrainer&) = delete;

  // One step's forward and backward over this rank's micro-batches, then the gradient reduction.
  // Losses in the result are the global ones (reduced over all ranks).
  StepResult forward_backward(int64_t iteration);
  // One whole step: forward_backward, the global gradient norm, clipping and AdamW on every local
  // stage, judged as Note [Non-finite steps] (step.h) says; every rank takes the same decision
  // because the verdict is all-reduced (Note [Non-finite steps on several ranks] in
  // grad_reduce.cc).
  StepResult step();

  // Note [Forward-only evaluation]: the losses of `batches` global batches of `data` (batch b
  // holds the samples load_micro_batch gives step b) through the model as it stands after the
  // last step (a deferred update is finished first), forward only: this rank runs the
  // schedule's forwards (a pair's forward half alone) and the activations' sends and receives,
  // in the schedule's order, and drops each micro-batch's state once its output has gone on.
  // Nothing that training reads changes: no gradient (the fused loss node is given no gradient
  // buffer), no optimizer state, routing table, rebalancing count or measured timeline, so a run
  // that evaluates trains exactly as one that does not. Every rank must call it; every rank
  // returns the same values, reduced over the world as a step's losses are. The forwards keep
  // the schedule's order among themselves, and the actions dropped are backwards and gradient
  // messages, which no forward waits for: so what the schedule completes, this completes.
  EvalResult evaluate(const data::Dataset& data, int64_t batches);

  // This rank's stages, their weights up to date: a deferred update (TrainConfig::
  // defer_optimizer) is finished first, and weights still to be gathered (TrainConfig::
  // overlap_param_gather) are gathered, which every rank of the data-parallel groups must then
  // do too. The const overload leaves them as they are: its weights may still wait for the last
  // step's update or gather (finish_updates).
  std::vector<StageRuntime>& stages() {
    finish_updates();
    return stages_;
  }
  const std::vector<StageRuntime>& stages() const { return stages_; }
  // Note [The update beside the first forward] (deferred_update.cc): applies what is left of the
  // last step's deferred update on every stage (on the GPU, enqueued on the compute stream),
  // and gathers the weights still to be gathered (Note [Weights gathered beside the forward]
  // in distributed_optimizer.cc).
  void finish_updates();
  int64_t iteration() const { return iteration_; }
  // The position a restored checkpoint continues from (runtime/checkpoint_parallel.h).
  void set_iteration(int64_t iteration) { iteration_ = iteration; }
  const ModelConfig& model_config() const { return model_; }
  const TrainConfig& train_config() const { return train_; }
  Groups& groups() { return *groups_; }
  int64_t microbatches_per_rank() const { return num_mb_; }
  // Whether this run reduces gradients beside the backward
  // (Note [Gradients reduced beside the backward] in grad_reduce.cc).
  bool grad_reduce_overlapped() const { return reducer_->overlapped(); }

  // Test hook: called in step() after the gradient reduction with this rank's stages and the
  // 1-based iteration of the step, e.g. to poison one rank's gradient with NaN.
  using GradientHook = std::function<void(std::vector<StageRuntime>& stages, int64_t iteration)>;
  void set_after_backward_hook(GradientHook hook) { after_backward_ = std::move(hook); }

  // The last step's measurement on this rank (StepMeter): its timeline, the seconds the
  // all-to-all ran (busy), those the compute stream stood waiting for it (exposed) and, of
  // those, the part spent waiting for a later expert rank (GPU with EP > 1, else negative: Note
  // [Waiting for the slowest expert rank]); GPU only (else empty / 0): each node kind's mean
  // time per layer and micro-batch (the planner's --node-times) and the forward-backward time.
  const StepMeter& meter() const { return meter_; }
  const std::vector<Span>& timeline() const { return meter_.timeline(); }
  double step_start_seconds() const { return meter_.step_start_seconds(); }
  double comm_busy_seconds() const { return meter_.comm_busy_seconds(); }
  double comm_exposed_seconds() const { return meter_.comm_exposed_seconds(); }
  double comm_exposed_waiting_seconds() const { return meter_.comm_exposed_waiting_seconds(); }
  schedule::NodeTimesTable measured_node_times() const { return meter_.node_times(); }
  double measured_forward_backward_seconds() const { return meter_.forward_backward_seconds(); }
  // Note [Activation offload]: null without --offload-activations.
  ActivationOffload* offload() { return offload_.get(); }

  // Rows this rank's experts received in the last step for each (micro-batch, global layer) of
  // its own stages, -1 for the other layers; empty for a dense model. Note [Measured routing]
  // in planner/pipeline_model.h.
  const schedule::RoutingCounts& routing_counts() const { return routing_; }
  // The same table for this rank's whole pipeline (every layer), the planner's input for an
  // exact plan of this rank: gathered over the pipeline group, so every rank of the group must
  // call it.
  schedule::RoutingCounts pipeline_routing_counts();
  // Every rank's table of this rank's expert-parallel group, in group order (empty for a dense
  // model); every rank of the group must call it.
  std::vector<schedule::RoutingCounts> expert_group_routing_counts();

  // Note [Rebalancing experts] (expert_rebalance.h): set by the last step() when it re-placed
  // experts, else empty.
  const std::optional<Rebalance>& last_rebalance() const { return rebalancer_->last(); }
  // Every stage holds the whole model's placement (Parameters::spec()), the same in each.
  const model::ExpertPlacement& expert_placement() const {
    return stages_.front().params->spec().placement;
  }

 private:
  StageRuntime& local(int32_t stage);
  bool is_local(int32_t stage) const;
  model::NodeContext context(const StageRuntime& s) const;
  void run_action(const schedule::Action& a, int64_t iteration);
  // The stage, state and context of a compute action or a pair's half, its input in place.
  NodeWork prepare(const schedule::Action& a, int64_t iteration);
  model::MicroBatchState& prepare_forward(int32_t stage, int32_t mb, int64_t iteration);
  model::MicroBatchState& prepare_backward(int32_t stage, int32_t mb);
  // A finished forward's LM loss (last stage) and layers' aux losses, kept for the step's end.
  void keep_losses(const NodeWork& w);
  void finish_forward(const NodeWork& w);
  void communicate(const schedule::Action& a);
  Tensor message_to_send(Tensor& src, bool activation);
  // The sends delivered so far let go of their buffers; the rest are waited for at the end.
  void drop_delivered_sends();
  // After action `index` of the step's list: on the GPU drop_delivered_sends; on the CPU the
  // sends send_releases names for it (Note [Send buffers released when known delivered] in
  // schedule/send_release.cc).
  void release_sends(size_t index);
  void wait_for_sends();
  // Note [The loss summed as one rank sums it]: lm, this rank's summed LM losses; aux, its
  // layers' aux losses by (micro-batch, layer), [num_mb * L], zero where it holds none.
  StepResult global_losses(double lm, double mtp, const Tensor& aux);
  void apply_update(StepResult& r, bool finite);
  void measure_on_device(double step_seconds);
  // Waits for the step's forwards' losses (pending_lm_, pending_aux_), then empties both.
  // lm: this rank's summed LM losses; the aux tensor is global_losses' input.
  // mtp: this rank's summed MTP terms (pending_mtp_).
  double take_pending_losses(Tensor& aux, double& mtp);
  // Note [Per-token loss] (step.h): the loss node's divisor of global batch `iteration` of
  // data_, formed once per batch; -1 without --calculate-per-token-loss.
  double step_per_token_divisor(int64_t iteration);
  // global_aux_loss's running totals of every local stage back to 0.
  void zero_aux_totals();
  // One global batch of evaluate(): `actions` are this rank's forward-only actions.
  StepResult evaluate_batch(const std::vector<schedule::Action>& actions, int64_t batch);
  // routing_ of every rank of `group`, in group order (collective).
  std::vector<schedule::RoutingCounts> gather_routing(comm::Communicator& group);

  ModelConfig model_;
  TrainConfig train_;
  schedule::Schedule sched_;
  Groups* groups_;
  const data::Dataset* data_;
  int64_t num_mb_ = 0;     // micro-batches per data-parallel rank
  double loss_scale_ = 1;  // 1 / micro-batches of the whole global batch
  // step_per_token_divisor's last batch (of data, iteration) and its divisor.
  const data::Dataset* per_token_data_ = nullptr;
  int64_t per_token_iteration_ = -1;
  double per_token_divisor_ = -1;
  int64_t iteration_ = 0;
  std::vector<StageRuntime> stages_;
  // The step's parts, each built on the ones before it.
  std::unique_ptr<Streams> streams_;
  std::unique_ptr<DeferredUpdate> deferred_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ExpertRebalancer> rebalancer_;
  std::unique_ptr<ActivationOffload> offload_;  // null without --offload-activations
  std::unique_ptr<StreamExecutor> executor_;
  StepMeter meter_;
  // The step's sends in flight, and each finished forward's loss (last stage) and layers' aux
  // losses, in the order the forwards finished, summed at the step's end
  // (Note [Reads to the host ahead of use]).
  struct InFlight {
    size_t action;  // its SEND's index in the rank's list
    std::unique_ptr<comm::PendingSend> send;
  };
  std::vector<InFlight> pending_;
  size_t action_index_ = 0;  // the step's action now running
  // Per action of this rank's list, the sends whose buffers go after it on the CPU.
  std::vector<std::vector<int32_t>> releases_;
  std::vector<ops::PendingScalar> pending_lm_;
  // The last stage's MTP modules' losses of the step, each weighted by mtp_weight_.
  std::vector<ops::PendingScalar> pending_mtp_;
  double mtp_weight_ = 0;
  // Each forward's layers' aux losses: its micro-batch, its stage's first layer, the losses.
  struct PendingAux {
    int64_t microbatch, first_layer;
    std::vector<ops::PendingScalar> layers;
  };
  std::vector<PendingAux> pending_aux_;
  schedule::RoutingCounts routing_;  // this step's, this rank's layers
  GradientHook after_backward_;
};

}  // namespace tandem::runtime
