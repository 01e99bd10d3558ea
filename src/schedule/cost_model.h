// Cost of each schedule node: FLOPs and bytes from the config (a roofline against a device
// description), per-node times read from a JSON file, or uniform unit costs for theory checks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/config.h"
#include "core/enum_names.h"
#include "core/footprint.h"

namespace tandem::schedule {

enum class CostModelKind : uint8_t {
  kUniform,    // every F costs 1, every B 2 (I and W 1 each), communication 0
  kRoofline,   // max(FLOPs / matrix rate, bytes / memory bandwidth); latency + bytes / link
  kNodeTimes,  // per-node times from a JSON file (docs/schedules.md)
};
// The cost models' names (Note [One name table per enumeration] in core/enum_names.h); --cost-model
// takes the first two, the file model is chosen by giving --node-times FILE.
inline constexpr EnumName<CostModelKind> kCostModelNames[] = {
    {CostModelKind::kRoofline, "roofline"},
    {CostModelKind::kUniform, "uniform"},
    {CostModelKind::kNodeTimes, "node-times"}};
constexpr std::span<const EnumName<CostModelKind>> enum_names(CostModelKind) {
  return kCostModelNames;
}
// The values --cost-model takes.
inline constexpr EnumName<CostModelKind> kCostModelOptionNames[] = {kCostModelNames[0],
                                                                    kCostModelNames[1]};
std::string_view cost_model_name(CostModelKind kind);

// A device and its links. Defaults are roughly one H200 with NVLink.
struct DeviceDesc {
  double matrix_flops_per_s = 790e12;  // dense bf16 matrix rate actually reached
  double memory_bytes_per_s = 4.3e12;  // HBM bandwidth
  double link_bytes_per_s = 350e9;     // effective per-GPU link bandwidth (all-to-all and P2P)
  double link_latency_s = 5e-6;        // per message
  int64_t weight_elem_bytes = 2;       // bytes per weight element read by the matrix products
  // Page-locked host memory to the device or back, each direction (PCIe Gen5 x16 in practice):
  // offloaded activations' copies (Note [Offload in the plan] in simulator_state.cc).
  double host_copy_bytes_per_s = 50e9;
};

// The work of one node's forward for one micro-batch on one rank.
struct NodeWork {
  double flops = 0;         // multiply-adds count 2
  double memory_bytes = 0;  // weights read + activations read and written (an estimate)
  double comm_bytes = 0;    // bytes this rank sends in the node's all-to-all
};

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

// Bytes one rank sends in one all-to-all (dispatch or combine) of one micro-batch:
// tokens * k * hidden * elem_bytes * (EP - 1) / EP (balanced routing).
double alltoall_bytes(const ModelConfig& cfg, const FootprintShape& shape, int64_t ep);
// Bytes of one pipeline message (activation or its gradient): tokens * hidden * elem_bytes.
int64_t p2p_bytes(const ModelConfig& cfg, const FootprintShape& shape);

// The forward work of a node (formulas in cost_model.cc).
NodeWork node_forward_work(NodeKind kind, const ModelConfig& cfg, const FootprintShape& shape,
                           int64_t ep, int64_t weight_elem_bytes);

// The shape a node-times file was measured at (its "measured_at"): the model, the micro-batch,
// the expert-parallel size and the activation element size of the run that wrote it.
// See Note [Node times at another shape] in node_scaling.cc.
struct MeasuredShape {
  ModelConfig model;
  int64_t micro_batch_size = 1;
  int64_t expert_parallel_size = 1;
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

struct CostModel {
  CostModelKind kind = CostModelKind::kRoofline;
  DeviceDesc device;
  NodeTimesTable table;  // kNodeTimes only
};

// Times of one node (roofline or table; not for kUniform, which the stage builder spreads per
// action). Backward halves: the input half repeats the forward's work, the weight half too
// (all-to-all nodes: the input half is the reverse all-to-all, no weight half; embed: no input
// half). Throws if the table lacks a kind the model needs.
NodePhaseTimes node_times(const CostModel& cost, NodeKind kind, const ModelConfig& cfg,
                          const FootprintShape& shape, int64_t ep);

// Time of one pipeline message of `bytes` (0 for kUniform).
double p2p_time(const CostModel& cost, int64_t bytes);

// Time of one all-reduce of `bytes` over `ranks` ranks (0 for one rank or kUniform): a ring moves
// 2 (n-1)/n of the bytes over each rank's link at the bus bandwidth (the table's
// grad_reduce_bus_bytes_per_s, else the link's) in 2 (n-1) steps of one latency each.
double all_reduce_time(const CostModel& cost, int64_t bytes, int64_t ranks);

}  // namespace tandem::schedule
