// The node-times file: what a training run measures per node kind (`tandem train
// --node-times-out`) and the planner reads back (`tandem plan --node-times`), with the shape it
// was measured at. Its reader and writer are here together, below both the runtime and the
// planner (docs/schedules.md, "Cost models").
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/config.h"
#include "core/footprint.h"

namespace tandem::schedule {

// Per layer and micro-batch (forward, input-gradient and weight-gradient halves), in seconds.
struct NodePhaseTimes {
  double forward_s = 0;
  double backward_input_s = 0;
  double backward_weight_s = 0;
};

// Whether the node owns weights (and so has a weight-gradient half): all but dispatch, combine.
bool node_has_weights(NodeKind kind);
// Dispatch and combine are the all-to-all nodes; they run on the communication stream.
bool node_is_communication(NodeKind kind);

// The shape a node-times file was measured at (its "measured_at"): the model, the micro-batch,
// the expert- and tensor-parallel sizes and the activation element size of the run that wrote
// it. At a tensor-parallel size above 1 the model is one rank's shard (tensor_parallel_shard in
// core/config.h) and the attention and mlp times hold the tensor-parallel all-reduces.
// See Note [Node times at another shape] in node_scaling.cc.
struct MeasuredShape {
  ModelConfig model;
  int64_t micro_batch_size = 1;
  int64_t expert_parallel_size = 1;
  int64_t tensor_parallel_size = 1;  // "tensor-model-parallel-size"; absent: 1
  int64_t activation_elem_bytes = 2;
  std::string source;  // the file, for messages
};

// Times per node kind (and of one pipeline message) read from JSON; missing kinds stay empty.
struct NodeTimesTable {
  std::array<std::optional<NodePhaseTimes>, kNumNodeKinds> nodes;
  std::optional<double> p2p_s;
  // The times were measured with --recompute-experts: the experts' input-gradient half already
  // includes forming gate, up and act again (Note [Recompute in the plan] in pipeline_model.cc).
  bool recompute_experts = false;
  // The --recompute the times were measured with (its text, e.g. "mlp,shared_experts"): those
  // nodes' input-gradient halves hold their forward's work again; empty: none.
  std::string recompute;
  // The --moe-wgrad-merge the times were measured with (the experts' weight-gradient time is the
  // mean of its passes; Note [Merged expert weight gradients in the plan] in
  // simulator_state.cc); empty: not recorded (1).
  std::optional<int64_t> moe_wgrad_merge;
  // Seconds the deferred optimizer update took per weight (--defer-optimizer runs; Note
  // [Deferred update in the plan] in simulator.cc); empty: the roofline's estimate.
  std::optional<double> update_s_per_weight;
  // The gradient all-reduce's bus bandwidth, bytes/s, as measured beside the backward (Note
  // [Gradient reduction in the plan] in simulator.cc); empty: the link's.
  std::optional<double> grad_reduce_bus_bytes_per_s;
  // Seconds per weight of a step's end as measured (the host's step time past the
  // forward-backward and the all-reduce: the norm, the update unless deferred, the host's waits;
  // Note [The step's end in the plan] in simulator.cc), and whether that run deferred its update
  // (a plan uses the rate only for the same choice); empty: the memory bandwidth's estimate.
  std::optional<double> step_end_s_per_weight;
  bool defer_optimizer = false;
  // Where the times were measured; a plan of another shape scales them (node_scaling.h). Empty
  // (a file written by hand): the times are used as they are, whatever the shape.
  std::optional<MeasuredShape> measured_at;
  // The fixed seconds of a node at another shape, instead of the fit (node_scaling.h).
  std::optional<double> node_overhead_s;
  // The GPU's mean idle seconds before a node phase while the host issues it; empty: no gaps.
  // Note [Gaps between nodes] in pipeline_model.cc.
  std::optional<double> node_gap_s;
};
// Parses the node-times JSON (docs/schedules.md); throws tandem::Error naming `source` and key.
NodeTimesTable parse_node_times(std::string_view json_text, std::string_view source);
NodeTimesTable load_node_times(const std::string& path);

// The file's JSON for `table` (what parse_node_times reads back: the same table).
nlohmann::json node_times_json(const NodeTimesTable& table);

// {"micro-batch-size": 2, "expert-model-parallel-size": 1, "activation-bytes": 2, "model":
// {"num-layers": 8, ...}}: the option names of `tandem train`.
nlohmann::json measured_shape_json(const MeasuredShape& at);
// Throws tandem::Error naming `source` and the key when `j` is not such an object.
MeasuredShape parse_measured_shape(const nlohmann::json& j, std::string_view source);

}  // namespace tandem::schedule
