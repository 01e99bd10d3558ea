// What the simulator needs to know about the model cut into stages: each stage's nodes (with
// times and the bytes each saves for backward, from core/footprint.h), its pipeline message
// size, and each rank's parameter, gradient and optimizer bytes. With measured routing
// (RoutingCounts) an experts node's bytes differ per micro-batch; everything else is the same for
// every micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/footprint.h"
#include "planner/cost_model.h"
#include "schedule/action.h"
#include "schedule/routing_file.h"

namespace tandem::schedule {

// kReduce: the gradient all-reduce's own stream (Note [Gradient reduction in the plan] in
// simulator.cc), as the GPU runtime's DeviceStreams::reduce.
enum class Stream : uint8_t { kCompute, kComm, kReduce };

struct StageNode {
  NodeKind kind = NodeKind::kAttention;
  int32_t layer = -1;  // global layer index; -1 for embed and loss
  Stream stream = Stream::kCompute;
  int64_t saved_bytes = 0;         // node_saved_bytes(kind, cfg, shape)
  int64_t weight_saved_bytes = 0;  // node_weight_saved_bytes: held from I to W when split
  NodeWorkspace workspace;         // node_workspace_bytes: op temporaries of each phase (GPU)
  // Measured routing (experts nodes only): the two figures for each micro-batch, from its
  // received rows; empty: saved_bytes and weight_saved_bytes hold for every micro-batch.
  std::vector<int64_t> saved_bytes_by_mb, weight_saved_bytes_by_mb;
  // Experts nodes under --moe-wgrad-merge above 1 (Note [Merged expert weight gradients] in
  // model/nodes.h): expert_merge_bytes, likewise per micro-batch with measured routing.
  ExpertMergeBytes merge;
  std::vector<ExpertMergeBytes> merge_by_mb;
  NodePhaseTimes times;
  // Its saved tensors wait in host memory between the layer's forward and backward
  // (PlanInputs::offload_kinds; Note [Offload in the plan] in simulator_state.cc).
  bool offloaded = false;
  // Weights this node is the stage's first node to read (embedding; a layer's attention side
  // with its router; its experts or mlp; the final norm and LM head): what a deferred update
  // must have written before the node runs (Note [Deferred update in the plan] in simulator.cc).
  int64_t params = 0;
  // Of `times`, the first part of an all-to-all spent waiting for the group's slowest expert
  // rank (Note [Slowest expert rank] in routing_file.h): combine forward, dispatch backward.
  NodePhaseTimes wait;

  int64_t saved(int32_t mb) const {
    return saved_bytes_by_mb.empty() ? saved_bytes : saved_bytes_by_mb[mb];
  }
  int64_t weight_saved(int32_t mb) const {
    return weight_saved_bytes_by_mb.empty() ? weight_saved_bytes : weight_saved_bytes_by_mb[mb];
  }
  const ExpertMergeBytes& merge_bytes(int32_t mb) const {
    return merge_by_mb.empty() ? merge : merge_by_mb[mb];
  }
};

// One unit of a stage's gradients, all-reduced over the data-parallel groups in one piece (the
// runtime's StageRuntime::GradUnit: the embedding, a layer, the head;
// Note [Gradient reduction in the plan] in simulator.cc).
struct GradUnit {
  int32_t layer = -1;          // global layer; -1 for the embedding and the head
  int32_t weighted_nodes = 0;  // the unit's nodes with a weight gradient
  int64_t bytes = 0;           // f32 gradient bytes all-reduced (groups of more than one rank)
  double reduce_s = 0;         // the all-reduce's time (dense over DP, experts over DP / EP)
};

struct Stage {
  int32_t index = 0;
  int32_t rank = 0;
  int32_t first_layer = 0;
  int32_t num_layers = 0;
  // Index in `nodes` of each layer's attention, and one past the last layer's nodes: layer i is
  // nodes [layer_node[i], layer_node[i + 1]): attention, dispatch, [shared_expert,] experts,
  // combine for a MoE layer; attention, mlp for a dense one.
  std::vector<int32_t> layer_node;
  int32_t layer_size(int32_t i) const { return layer_node[i + 1] - layer_node[i]; }
  std::vector<StageNode> nodes;  // forward order: [embed], layers, [loss]
  int64_t num_params = 0;
  int64_t activation_bytes = 0;  // sum of saved_bytes: one micro-batch's activations (balanced
                                 // routing)
  int64_t message_bytes = 0;     // one pipeline message (activation or gradient)
  double message_s = 0;          // time of one pipeline message
  // Note [Document masks in the plan] (simulator_state.cc): one micro-batch's document masks on
  // the device; 0 without them.
  int64_t document_mask_bytes = 0;
  std::vector<GradUnit> grad_units;  // forward order: [embedding], layers, [head]
  std::vector<int32_t> node_unit;    // per node, its index in grad_units
  // Note [Tied embeddings] (model/parameters.h): on a last stage of several, the elements of its
  // copy of the embedding table (a distributed optimizer's piece of its own); else 0.
  int64_t tied_copy_params = 0;
  // Note [Tokens in the plan] (simulator_state.cc): the bytes a micro-batch's forward on this
  // stage allocates for its tokens before its first node, and of them the bytes held until
  // the step's end.
  int64_t tokens_loaded_bytes = 0;
  int64_t tokens_held_bytes = 0;

  bool has_embed() const { return !nodes.empty() && nodes.front().kind == NodeKind::kEmbed; }
  bool has_loss() const { return !nodes.empty() && nodes.back().kind == NodeKind::kLoss; }
};

struct RankMemory {
  int64_t param_bytes = 0;         // fp32 master weights (and the expert bias's load tally)
  int64_t grad_bytes = 0;          // fp32 gradients
  int64_t optimizer_bytes = 0;     // two fp32 Adam moments (of its parts: distributed optimizer)
  int64_t compute_copy_bytes = 0;  // GPU: the bf16 copy of the weights the products read
  int64_t static_bytes() const {
    return param_bytes + grad_bytes + optimizer_bytes + compute_copy_bytes;
  }
};

// The inputs of the plan that are not the schedule.
struct PlanInputs {
  ModelConfig model;
  int64_t micro_batch_size = 1;
  int64_t expert_parallel_size = 1;
  // ParallelConfig::tensor_model_parallel_size: `model` is then one rank's shard, and the
  // tensor-parallel all-reduces are timed (Note [Tensor-parallel all-reduces in the plan] in
  // pipeline_model.cc).
  int64_t tensor_parallel_size = 1;
  int64_t activation_elem_bytes = 4;  // the FootprintShape element size (4: f32)
  // The GPU trainer's layout (docs/cuda.md): f32 statistics beside bf16 activations, the fused
  // LM head, and a bf16 copy of every weight besides the f32 masters.
  bool gpu = false;
  bool recompute_experts = false;  // TrainConfig::recompute_experts
  uint32_t recompute = 0;          // parse_recompute(TrainConfig::recompute)
  // TrainConfig::moe_wgrad_merge (Note [Merged expert weight gradients in the plan] in
  // simulator_state.cc).
  int64_t moe_wgrad_merge = 1;
  // TrainConfig::first_stage_layers / last_stage_layers (Note [Uneven stages] in
  // core/config.h); 0: an even share.
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  // TrainConfig::offload_activations as parse_offload_kinds' bits (core/footprint.h); 0: none.
  uint32_t offload_kinds = 0;
  CostModel cost;
  RoutingCounts routing;  // measured rows per experts node; empty: balanced (N k)
  // Per global layer, this rank's experts' pace and its wait for the expert group's slowest
  // rank (Note [Slowest expert rank] in routing_file.h); empty: balanced.
  std::vector<ExpertPace> expert_pace;
  // TrainConfig::defer_optimizer (Note [Deferred update in the plan] in simulator.cc).
  bool defer_optimizer = false;
  // Ranks per pipeline stage (comm::ParallelLayout::dp(): the dense part's data-parallel size,
  // expert parallelism carved out of it); 0: the expert-parallel size, no replicas beyond the
  // expert ranks. Its gradient all-reduce and TrainConfig::overlap_grad_reduce:
  // Note [Gradient reduction in the plan] in simulator.cc.
  int64_t data_parallel_size = 0;
  bool overlap_grad_reduce = true;
  // TrainConfig::use_distributed_optimizer: each rank keeps the Adam moments of its part of the
  // replicated weights only (Note [Distributed optimizer in the plan] below).
  bool distributed_optimizer = false;
  // How many of Megatron-LM's document masks the run forms (TrainConfig's
  // --reset-attention-mask, --document-positions, --eod-mask-loss: 0 to 3), each 4 bytes a token
  // (Note [Document masks in the plan] in simulator_state.cc).
  int64_t document_masks = 0;
  bool eod_mask_loss = false;  // TrainConfig::eod_mask_loss (FootprintShape::loss_mask)
};

struct PipelineModel {
  std::vector<Stage> stages;
  std::vector<RankMemory> ranks;
  FootprintShape shape;  // one micro-batch on one rank
  CostModelKind cost_kind = CostModelKind::kRoofline;
  int64_t expert_parallel_size = 1;  // with 1, dispatch and combine are no all-to-all
  int64_t moe_wgrad_merge = 1;       // PlanInputs::moe_wgrad_merge
  // Note [Deferred update in the plan] (simulator.cc): each stage's first forward updates the
  // weights it reads, at update_s_per_param seconds a weight (0: not deferred, or uniform costs).
  bool defer_optimizer = false;
  double update_s_per_param = 0;
  // Note [Gradient reduction in the plan] (simulator.cc).
  int64_t data_parallel_size = 1;  // resolved: at least the expert-parallel size
  bool overlap_grad_reduce = true;
  // Note [The step's end in the plan] (simulator.cc): seconds per weight of the work after the
  // forward-backward and the all-reduce, the gradient norm's read and (not deferred) the update.
  double step_end_s_per_param = 0;
  double host_copy_bytes_per_s = 50e9;  // DeviceDesc::host_copy_bytes_per_s
  // The CPU trainer's plan (PlanInputs::gpu off), where the host runs each piece of work as it
  // comes: a RECV takes its buffer after the compute before it, a full B runs a node's weight
  // gradient right after its input gradient and before the next node, and a send's buffer goes
  // where the sender's list proves it delivered
  // (Note [Send buffers released when known delivered] in schedule/send_release.cc); on the GPU
  // when its transfer ends.
  bool cpu_trainer = false;
};

// PlanInputs::data_parallel_size, 0 (the default) read as the expert-parallel size. Throws
// tandem::Error naming it when it is not a multiple of the expert-parallel size.
int64_t resolved_data_parallel_size(const PlanInputs& in);

// The most node runs (micro-batches x the stages' nodes) a plan simulates: a few seconds and
// about a gigabyte of spans and memory events, past any schedule a run takes.
constexpr int64_t kMaxPlannedNodeRuns = int64_t{1} << 22;

// Throws tandem::Error naming the counts when simulating `microbatches` micro-batches through the
// model's nodes (embed, every layer's, loss) would pass kMaxPlannedNodeRuns.
void check_planned_node_runs(const ModelConfig& cfg, int64_t microbatches);

// Layers split over stages by stage_layer_counts (core/config.h), as the pipeline trainer splits
// them. Throws tandem::Error if they do not split, EP does not divide the experts, or the
// simulation would pass kMaxPlannedNodeRuns.
PipelineModel build_pipeline_model(const Schedule& schedule, const PlanInputs& in);

// Note [Distributed optimizer in the plan]: the weights of a stage whose Adam moments one rank
// keeps with the distributed optimizer (runtime/distributed_optimizer.cc): per gradient unit, its
// weights over the data-parallel size and, with EP > 1, its experts' over the
// expert-data-parallel size, each rounded up (every rank keeps as many: the last parts are
// padded).
int64_t sharded_optimizer_params(const Stage& stage, int64_t data_parallel_size, int64_t ep);

// Parameters of one stage: embedding on stage 0, layers (experts divided by EP), final norm and
// LM head on the last stage.
int64_t stage_params(const ModelConfig& cfg, int32_t first_layer, int32_t num_layers, bool first,
                     bool last, int64_t ep);

}  // namespace tandem::schedule
