// Multi-rank training: this rank's communicators (ParallelLayout groups) and the pipeline
// trainer that runs the rank's list of schedule actions for every micro-batch of a step, then
// reduces gradients over data-parallel (dense) and expert-data-parallel (experts) groups.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/layout.h"
#include "core/config.h"
#include "data/dataset.h"
#include "model/chunk.h"
#include "runtime/device_streams.h"
#include "runtime/optimizer.h"
#include "runtime/stream.h"
#include "runtime/timeline.h"
#include "runtime/trainer.h"
#include "schedule/action.h"
#include "schedule/pipeline_model.h"

namespace tandem::runtime {

struct Groups {
  comm::ParallelLayout layout;
  int rank = 0;  // world rank
  // Host groups (MPI): CPU tensors, and the host-side reductions of every run (losses, norms).
  std::unique_ptr<comm::Communicator> world, pp, dp, ep, edp;
  // Device groups (NCCL; only for a GPU run, else null and the host groups serve): one per
  // group, and two for the pipeline, one per direction (Note [Pipeline streams on the GPU] in
  // distributed.cc).
  std::unique_ptr<comm::Communicator> pp_fwd_dev, pp_bwd_dev, dp_dev, ep_dev, edp_dev;
  // A second device expert group, for the second half of a combined pair under
  // CommOverlap::kSplit (Note [A stream pair per half] in combined.cc); made only for it (NCCL's
  // buffers take device memory).
  std::unique_ptr<comm::Communicator> ep2_dev;

  // Splits `world` into the layout's groups; every rank must call it. device: kCUDA also builds
  // the NCCL groups (cuda::initialize must have run), each waiting at most timeout_s for a peer
  // (--comm-timeout). second_expert_group: also ep2_dev (GPU, EP > 1), for CommOverlap::kSplit.
  static Groups make(std::unique_ptr<comm::Communicator> world, int pp, int ep,
                     Device device = Device::kCPU, bool second_expert_group = false,
                     double timeout_s = 120.0);
  comm::Communicator& pp_fwd() { return pp_fwd_dev ? *pp_fwd_dev : *pp; }
  comm::Communicator& pp_bwd() { return pp_bwd_dev ? *pp_bwd_dev : *pp; }
  comm::Communicator& dp_data() { return dp_dev ? *dp_dev : *dp; }
  comm::Communicator& ep_data() { return ep_dev ? *ep_dev : *ep; }
  comm::Communicator& ep2_data() { return ep2_dev ? *ep2_dev : ep_data(); }
  comm::Communicator& edp_data() { return edp_dev ? *edp_dev : *edp; }
};

// Which part of the model a pipeline stage holds; throws when the layers do not divide evenly.
model::ChunkSpec stage_spec(const ModelConfig& m, int32_t stage, int32_t num_stages,
                            const comm::ParallelLayout& layout, int rank);

struct StageRuntime {
  int32_t stage = 0;
  std::unique_ptr<model::Parameters> params;
  std::unique_ptr<model::ModelChunk> chunk;
  std::unique_ptr<AdamW> optimizer;
  std::vector<model::MicroBatchState> mbs;
  // Per node of chunk->nodes(): the end of the flat weights it and the nodes before it read
  // (node_weight_ends).
  std::vector<int64_t> weight_ends;
  // Note [Gradients reduced beside the backward] (grad_reduce.cc): the chunk's units (the
  // embedding, each layer, the head), each with the range of the flat buffers its nodes' weight
  // gradients fill, and each node's unit.
  struct GradUnit {
    std::string name;        // "embed", "layer 3" (global layer), "head": the trace's span
    int64_t begin = 0, end = 0;
    int64_t weighted_nodes = 0;  // its nodes that write weight gradients
    int64_t pending = 0;         // weight-gradient passes still to come this step
    bool reduced = false;        // this step's reduction issued
  };
  std::vector<GradUnit> grad_units;
  std::vector<int32_t> node_unit;
};

// The units of `params`' chunk `nodes` (Note [Gradients reduced beside the backward]): their
// weights' ranges by parameter name, and node_unit filled with each node's unit.
std::vector<StageRuntime::GradUnit> gradient_units(const model::Parameters& params,
                                                   const std::vector<model::NodeRef>& nodes,
                                                   std::vector<int32_t>& node_unit);

// Note [The update beside the first forward] (deferred_update.cc): for each node, in elements of
// the flat buffers, the end of the prefix of weights that it and the nodes before it read.
std::vector<int64_t> node_weight_ends(const model::Parameters& params,
                                      const std::vector<model::NodeRef>& nodes);

// Whether combined forward-backward actions run their all-to-all nodes on a communication
// stream of their own (a worker thread on the CPU, a high-priority CUDA stream on the GPU) or
// everything in order on the compute stream.
// kSplit (GPU only): as kOn, and the two halves of a pair each get a compute and a communication
// stream of their own (Note [A stream pair per half] in combined.cc).
enum class CommOverlap : uint8_t { kOff, kOn, kSplit };

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
  // stage. --nan-policy as in Trainer::step (Note [Non-finite steps] in trainer.h); every rank
  // takes the same decision because the verdict is all-reduced: the global loss, the global sum
  // of squares and a count of ranks whose local gradients (counted in the norm or not) are not
  // finite (Note [Non-finite steps on several ranks] in distributed.cc).
  StepResult step();

  // This rank's stages, their weights up to date: a deferred update (TrainConfig::
  // defer_optimizer) is finished first. The const overload leaves it as it is: its weights may
  // still wait for the last step's update (finish_updates).
  std::vector<StageRuntime>& stages() {
    finish_updates();
    return stages_;
  }
  const std::vector<StageRuntime>& stages() const { return stages_; }
  // Note [The update beside the first forward] (deferred_update.cc): applies what is left of the
  // last step's deferred update on every stage (on the GPU, enqueued on the compute stream).
  void finish_updates();
  int64_t iteration() const { return iteration_; }
  // The position a restored checkpoint continues from (runtime/checkpoint_parallel.h).
  void set_iteration(int64_t iteration) { iteration_ = iteration; }
  const ModelConfig& model_config() const { return model_; }
  const TrainConfig& train_config() const { return train_; }
  Groups& groups() { return *groups_; }

  // Test hook: called in step() after the gradient reduction with this rank's stages and the
  // 1-based iteration of the step, e.g. to poison one rank's gradient with NaN.
  using GradientHook = std::function<void(std::vector<StageRuntime>& stages, int64_t iteration)>;
  void set_after_backward_hook(GradientHook hook) { after_backward_ = std::move(hook); }
  int64_t microbatches_per_rank() const { return num_mb_; }
  // Whether this run reduces gradients beside the backward
  // (Note [Gradients reduced beside the backward] in grad_reduce.cc):
  // TrainConfig::overlap_grad_reduce and a group to reduce over.
  bool grad_reduce_overlapped() const;
  // The last step's measured timeline on this rank, and its communication figures: seconds the
  // all-to-all tasks ran, and seconds the compute stream stood waiting for them (exposed). On
  // the GPU these come from CUDA events (Note [Measured on the GPU] in device_streams.h).
  const std::vector<Span>& timeline() const { return spans_; }
  // GPU only (else empty / 0): the last step's mean time of each node kind on this rank per
  // layer and micro-batch (the planner's --node-times), and its measured forward-backward time
  // (from the step's start to the end of its last span, before the gradient reduction).
  const schedule::NodeTimesTable& measured_node_times() const { return node_times_; }
  double measured_forward_backward_seconds() const { return fb_seconds_; }
  double comm_busy_seconds() const { return comm_busy_s_; }
  double comm_exposed_seconds() const { return comm_exposed_s_; }
  // GPU with EP > 1 (else negative): of comm_exposed_seconds, the part spent waiting for a
  // later rank of the expert group (Note [Waiting for the slowest expert rank]).
  double comm_exposed_waiting_seconds() const { return comm_waiting_s_; }
  // Steady-clock seconds at which the last step started (the timeline's zero).
  double step_start_seconds() const;
  // Rows this rank's experts received in the last step for each (micro-batch, global layer) of
  // its own stages, -1 for the other layers; empty for a dense model. Note [Measured routing]
  // in schedule/pipeline_model.h.
  const schedule::RoutingCounts& routing_counts() const { return routing_; }
  // The same table for this rank's whole pipeline (every layer), the planner's input for an
  // exact plan of this rank: gathered over the pipeline group, so every rank of the group must
  // call it.
  schedule::RoutingCounts pipeline_routing_counts();
  // Every rank's table of this rank's expert-parallel group, in group order (empty for a dense
  // model); every rank of the group must call it.
  std::vector<schedule::RoutingCounts> expert_group_routing_counts();

  // Note [Rebalancing experts]: with TrainConfig::rebalance_experts = N > 0 (EP > 1), every N
  // steps the trainer lays each MoE layer's experts out anew (model/expert_placement.h) from the
  // rows they received over those steps, and moves the weights and Adam moments of the experts
  // that change rank (Note [Moving experts] in expert_rebalance.cc). A layer moves only when its
  // most loaded expert rank gets lighter by more than 5% of the mean rank's rows, so a steady
  // routing moves once and then stays, and noise moves nothing. The move is part of the step's
  // time. It pays where the same experts stay hot (a trained router); a fresh router that learns
  // fast moves its hot experts from one window to the next (docs/parallel.md).
  struct Rebalance {
    int layers = 0;         // MoE layers whose placement changed
    // Over the MoE layers, sum of each layer's most loaded expert rank over sum of the mean, in
    // the steps measured: with the old placement and with the new (1: even).
    double before = 1, after = 1;
    int64_t moved_bytes = 0;  // this rank sent to others (weights and Adam moments)
  };
  // Set by the last step() when it re-placed experts, else empty.
  const std::optional<Rebalance>& last_rebalance() const { return last_rebalance_; }
  // Every stage holds the whole model's placement (Parameters::spec()), the same in each.
  const model::ExpertPlacement& expert_placement() const {
    return stages_.front().params->spec().placement;
  }

 private:
  StageRuntime& local(int32_t stage);
  bool is_local(int32_t stage) const;
  // routing_ of every rank of `group`, in group order (collective).
  std::vector<schedule::RoutingCounts> gather_routing(comm::Communicator& group);
  model::NodeContext context(const StageRuntime& s) const;
  void run_action(const schedule::Action& a, int64_t iteration);
  void forward(int32_t stage, int32_t mb, int64_t iteration);
  model::MicroBatchState& prepare_forward(int32_t stage, int32_t mb, int64_t iteration);
  void finish_forward(StageRuntime& s, int32_t mb, const model::MicroBatchState& state);
  model::MicroBatchState& prepare_backward(int32_t stage, int32_t mb);
  // One half of a pair (FB or FF), its input in place (combined.cc).
  struct PairHalf {
    schedule::Action action;  // kForward, kBackward (with its weight halves) or kBackwardInput
    StageRuntime* stage;
    model::MicroBatchState* state;
    model::NodeContext context;
  };
  using PairHalves = std::array<PairHalf, 2>;
  PairHalves prepare_pair(const schedule::Action& a, int64_t iteration);
  // finish_forward of each forward half, first to second (the plain actions' order).
  void finish_pair_forwards(const PairHalves& h);
  // Neighbouring gradient entries reduced in one call (Note [Gradient runs]); expert: reduced
  // over the expert-data-parallel group (only when EP > 1).
  struct GradRun {
    int64_t begin, count;
    bool expert;
  };
  std::vector<GradRun> gradient_runs(const model::Parameters& params) const;
  // Note [The update beside the first forward] (deferred_update.cc): what of stage s's deferred
  // update lies before element `end`, now (CPU) or on the compute stream of `half` (GPU, timed).
  void update_weights(StageRuntime& s, int64_t end, int half = 0);
  // The unpaired first forward on the GPU with its all-to-all on the communication stream and the
  // deferred update beside it.
  void forward_beside_update_on_device(StageRuntime& s, model::MicroBatchState& state, int32_t mb);
  void run_combined(const schedule::Action& a, int64_t iteration);
  void run_combined_on_device(const schedule::Action& a, int64_t iteration);
  // issue(half, node) issues a node of half 0 (the forward) or half 1 (the backward), prepare(
  // half, node) what of a forward's node may run ahead of it (Chunk::prepare_forward_node);
  // overlapped: the two streams really run side by side (Note [Issue order] in combined.cc).
  template <typename Issue, typename Prepare>
  void issue_pairs(const struct Units& fu, const struct Units& bu, Issue& issue, Prepare& prepare,
                   bool overlapped);
  // The pair's nodes: issue_pairs for FB, issue_forward_pairs for FF.
  template <typename Issue, typename Prepare>
  void issue_pair_nodes(const schedule::Action& a, const PairHalves& h, Issue& issue,
                        Prepare& prepare, bool overlapped);
  // The same for two forwards (Note [Paired forwards] in schedule/action.h).
  template <typename Issue, typename Prepare>
  void issue_forward_pairs(const struct Units& u0, const struct Units& u1, Issue& issue,
                           Prepare& prepare, bool overlapped);
  // A plain compute action's nodes (F, B, I or W), in the chunk's order; on the GPU each between
  // timing events.
  void run_nodes(StageRuntime& s, model::MicroBatchState& state, int32_t mb,
                 schedule::ActionKind kind);
  // One micro-batch's chain of nodes on the GPU: the stream its last node ran on and the event
  // its successor waits for (combined.cc).
  struct DeviceChain {
    DeviceStream stream;
    DeviceEvent done;
  };
  // Node i of `s` for micro-batch mb, the part `kind` names (F; B with or without its weight
  // gradient; W), timed: on the communication stream if overlap and it is dispatch or combine,
  // else on the compute stream, after the chain's event; the chain then ends at this node, or
  // with overlap at its input gradient (Note [Weight gradients off the chain] in combined.cc).
  // half: which of DeviceStreams' stream pairs (0, or 1 for a pair's second half under
  // CommOverlap::kSplit).
  void issue_node_on_device(StageRuntime& s, model::MicroBatchState& state,
                            const model::NodeContext& c, size_t i, schedule::ActionKind kind,
                            int32_t mb, bool overlap, DeviceChain& chain,
                            int half = 0);
  // Chunk::prepare_forward_node of node i on the communication stream, after the chain's event,
  // timed as the first part of that node (Note [Counts ahead of the rows] in moe_exchange.cc).
  void prepare_node_on_device(StageRuntime& s, model::MicroBatchState& state,
                              const model::NodeContext& c, size_t i, int32_t mb,
                              DeviceChain& chain, int half = 0);
  // Records every tensor the layer holds as used on the communication stream
  // (Note [Nodes on the communication stream] in combined.cc).
  void record_on_comm(const model::LayerActs& layer, int half);
  // The compute stream waits for the chain's last node (measured when that was an all-to-all).
  void join_chain(const DeviceChain& chain, const std::string& what);
  // The trace entry of one node of micro-batch mb ("F3 attention", "W3 experts"); dispatch and
  // combine count as all-to-all only with EP > 1 (else they only hand tensors over).
  DeviceStreams::SpanInfo node_span(NodeKind kind, NodePhase phase, int32_t mb,
                                    bool on_comm_stream, int half = 0) const;
  void record_span(const char* stream, NodeKind kind, bool forward, int32_t mb,
                   std::chrono::steady_clock::time_point start);
  void record_action_span(const schedule::Action& a, std::chrono::steady_clock::time_point start);
  void backward(int32_t stage, int32_t mb, model::WeightGrad wg);
  void weights(int32_t stage, int32_t mb);
  void communicate(const schedule::Action& a);
  void communicate_on_device(const schedule::Action& a);
  void reduce_gradients();
  // Note [Gradients reduced beside the backward] (grad_reduce.cc): the step's counts set; a
  // node's weight gradient issued (on the GPU: on `stream`; a node without weights counts for
  // nothing), reducing its unit once that was the unit's last; on the CPU the units made ready
  // by the action just run.
  void begin_grad_units();
  void weight_grad_issued(StageRuntime& s, size_t node, DeviceStream stream = nullptr);
  void reduce_ready_units();
  // All-reduces the unit's gradients; returns their bus bytes (SpanInfo::bus_bytes).
  double reduce_unit(StageRuntime& s, StageRuntime::GradUnit& u);
  std::vector<std::pair<StageRuntime*, size_t>> ready_units_;  // CPU: (stage, unit)
  double global_grad_norm();

  ModelConfig model_;
  TrainConfig train_;
  schedule::Schedule sched_;
  Groups* groups_;
  const data::Dataset* data_;
  int64_t num_mb_ = 0;     // micro-batches per data-parallel rank
  double loss_scale_ = 1;  // 1 / micro-batches of the whole global batch
  std::vector<StageRuntime> stages_;
  std::vector<std::unique_ptr<comm::PendingSend>> pending_;
  double lm_sum_ = 0, aux_sum_ = 0;
  // Each finished forward's loss (last stage) and layers' aux losses, in the order the forwards
  // finished; summed at the step's end (Note [Reads to the host ahead of use]).
  std::vector<ops::PendingScalar> pending_lm_;
  std::vector<std::vector<ops::PendingScalar>> pending_aux_;
  int64_t iteration_ = 0;
  CommOverlap overlap_ = CommOverlap::kOn;
  std::unique_ptr<CpuStream> compute_stream_, comm_stream_;  // CPU runs
  std::unique_ptr<DeviceStreams> dev_;                       // GPU runs; null on the CPU
  schedule::NodeTimesTable node_times_;
  double fb_seconds_ = 0;
  std::mutex spans_mutex_;
  std::vector<Span> spans_;
  std::chrono::steady_clock::time_point step_start_;
  double comm_busy_s_ = 0, comm_exposed_s_ = 0, comm_waiting_s_ = -1;
  schedule::RoutingCounts routing_;  // this step's, this rank's layers
  GradientHook after_backward_;
  // Note [Rebalancing experts] (expert_rebalance.cc).
  void record_expert_load(const StageRuntime& s, const model::MicroBatchState& state);
  void rebalance_experts();
  // Moves the experts to `to` and sets it on every stage; bytes sent to other ranks.
  int64_t move_experts(const model::ExpertPlacement& to);
  // A local expert's three matrices, one block of expert_block_numel() in the flat buffers.
  struct ExpertBlock {
    int64_t layer, expert, offset;
  };
  std::vector<ExpertBlock> expert_blocks(const model::Parameters& params) const;
  int64_t expert_block_numel() const;
  std::vector<int64_t> expert_load_;  // [layer * E + expert]: rows this rank's experts took
  std::optional<Rebalance> last_rebalance_;
};

}  // namespace tandem::runtime
