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
#include "schedule/node_times.h"

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

// Bytes one rank sends in one all-to-all (dispatch or combine) of one micro-batch:
// tokens * k * hidden * elem_bytes * (EP - 1) / EP (balanced routing).
double alltoall_bytes(const ModelConfig& cfg, const FootprintShape& shape, int64_t ep);
// Bytes of one pipeline message (activation or its gradient): tokens * hidden * elem_bytes.
int64_t p2p_bytes(const ModelConfig& cfg, const FootprintShape& shape);

// The forward work of a node (formulas in cost_model.cc).
NodeWork node_forward_work(NodeKind kind, const ModelConfig& cfg, const FootprintShape& shape,
                           int64_t ep, int64_t weight_elem_bytes);

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
