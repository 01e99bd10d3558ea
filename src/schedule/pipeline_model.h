// What the simulator needs to know about the model cut into stages: each stage's nodes (with
// times and the bytes each saves for backward, from core/footprint.h), its pipeline message
// size, and each rank's parameter, gradient and optimizer bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/footprint.h"
#include "schedule/action.h"
#include "schedule/cost_model.h"

namespace tandem::schedule {

enum class Stream : uint8_t { kCompute, kComm };

struct StageNode {
  NodeKind kind = NodeKind::kAttention;
  int32_t layer = -1;  // global layer index; -1 for embed and loss
  Stream stream = Stream::kCompute;
  int64_t saved_bytes = 0;  // node_saved_bytes(kind, cfg, shape)
  int64_t weight_saved_bytes = 0;  // node_weight_saved_bytes: held from I to W when split
  NodePhaseTimes times;
};

struct Stage {
  int32_t index = 0;
  int32_t rank = 0;
  int32_t first_layer = 0;
  int32_t num_layers = 0;
  int32_t first_layer_node = 0;  // index in `nodes` of the first layer's attention
  int32_t nodes_per_layer = 0;   // 4 (MoE: attention, dispatch, experts, combine) or 2 (dense)
  std::vector<StageNode> nodes;  // forward order: [embed], layers, [loss]
  int64_t num_params = 0;
  int64_t activation_bytes = 0;  // sum of saved_bytes: one micro-batch's activations
  int64_t message_bytes = 0;     // one pipeline message (activation or gradient)
  double message_s = 0;          // time of one pipeline message

  bool has_embed() const { return !nodes.empty() && nodes.front().kind == NodeKind::kEmbed; }
  bool has_loss() const { return !nodes.empty() && nodes.back().kind == NodeKind::kLoss; }
};

struct RankMemory {
  int64_t param_bytes = 0;      // fp32 master weights
  int64_t grad_bytes = 0;       // fp32 gradients
  int64_t optimizer_bytes = 0;  // two fp32 Adam moments
  int64_t static_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
};

// The inputs of the plan that are not the schedule.
struct PlanInputs {
  ModelConfig model;
  int64_t micro_batch_size = 1;
  int64_t expert_parallel_size = 1;
  int64_t activation_elem_bytes = 4;  // the FootprintShape element size (4: f32)
  CostModel cost;
};

struct PipelineModel {
  std::vector<Stage> stages;
  std::vector<RankMemory> ranks;
  FootprintShape shape;  // one micro-batch on one rank
  CostModelKind cost_kind = CostModelKind::kRoofline;
};

// Layers split evenly over stages, L / S each (as the pipeline trainer does). Throws
// tandem::Error if S does not divide L or EP does not divide the experts.
PipelineModel build_pipeline_model(const Schedule& schedule, const PlanInputs& in);

// Parameters of one stage: embedding on stage 0, layers (experts divided by EP), final norm and
// LM head on the last stage.
int64_t stage_params(const ModelConfig& cfg, int32_t num_layers, bool first, bool last, int64_t ep);

}  // namespace tandem::schedule
