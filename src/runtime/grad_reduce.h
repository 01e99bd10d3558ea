// Gradient reduction over the data-parallel groups (dense weights) and the
// expert-data-parallel groups (experts), beside the backward or at the step's end, and the
// global gradient norm over every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/groups.h"
#include "runtime/stage.h"
#include "runtime/streams.h"

namespace tandem::runtime {

// Note [Gradients reduced beside the backward] (grad_reduce.cc): a unit of a chunk (the
// embedding, a layer, the head), the range of the flat buffers its nodes' weight gradients fill.
struct GradUnit {
  std::string name;  // "embed", "layer 3" (global layer), "head": the trace's span
  int64_t begin = 0, end = 0;
  int64_t weighted_nodes = 0;  // its nodes that write weight gradients
  int64_t pending = 0;         // weight-gradient passes still to come this step
  bool reduced = false;        // this step's reduction issued
};

// The units of `params`' chunk `nodes`: their weights' ranges by parameter name, and node_unit
// filled with each node's unit.
std::vector<GradUnit> gradient_units(const model::Parameters& params,
                                     const std::vector<model::NodeRef>& nodes,
                                     std::vector<int32_t>& node_unit);

// Neighbouring gradient entries reduced in one call (Note [Gradient runs] in grad_reduce.cc);
// expert: reduced over the expert-data-parallel group (only when ep > 1), else over the
// data-parallel group. tp_shard: each tensor-parallel rank holds its own part of these entries
// (Note [Tensor-parallel shards] in model/parameters.h); only at TP > 1.
struct GradRun {
  int64_t begin, count;
  bool expert;
  bool tp_shard = false;
};
std::vector<GradRun> gradient_runs(const model::Parameters& params, int ep);
// Note [Counted once] (step_figures.cc): whether `rank` counts `run` in the gradient norm and the
// step's figures: data-parallel rank 0 (expert-data-parallel rank 0 for an experts' run), and of
// a replicated run tensor-parallel rank 0 too.
bool counts_run(const GradRun& run, const comm::ParallelLayout& layout, int rank);

class GradReducer {
 public:
  GradReducer(const ModelConfig& m, const TrainConfig& t, Groups& groups, Streams& streams);
  // A stage of this rank: its units counted from now on.
  void add_stage(const StageRuntime& s);

  // Whether this run reduces beside the backward: TrainConfig::overlap_grad_reduce and a group
  // to reduce over.
  bool overlapped() const;
  // The step's counts set: num_mb weight-gradient passes for each weighted node of a unit.
  void begin_step(int64_t num_mb);
  // Node `node` of stage s wrote its weight gradient (on `stream`) for one micro-batch; a node
  // without weights counts for nothing. The unit's reduction is issued once that was its last.
  void weight_grad_issued(const StageRuntime& s, size_t node, StreamId stream);
  // Every gradient reduced before the step goes on: the reductions beside the backward awaited
  // on the compute stream, or all of them now; then the tied embedding's summed over the
  // embedding group (Note [The embedding group] in grad_reduce.cc).
  void end_step(const std::vector<StageRuntime>& stages);
  // Note [Non-finite steps on several ranks]: the global gradient norm, NaN when any rank's
  // own gradients are not finite; the same on every rank.
  double global_norm(const std::vector<StageRuntime>& stages);

 private:
  // The parts of unit u's gradients each group sums, and their bus bytes (SpanInfo::bus_bytes).
  // With the distributed optimizer `piece` is set: its gradients are reduce-scattered by
  // `shards` (Note [Distributed optimizer] in distributed_optimizer.cc), else all-reduced.
  struct Part {
    comm::Communicator* group;
    Tensor grads;
    double bus_bytes;
    ShardedWeights* shards = nullptr;
    const ShardPiece* piece = nullptr;
  };
  std::vector<Part> unit_parts(const StageRuntime& s, const GradUnit& u) const;
  // Every stage's gradients reduced over their groups now (no overlap).
  void reduce_now(const std::vector<StageRuntime>& stages);
  // Note [The embedding group]: the tied table's gradient summed with the other end's.
  void sum_shared_embedding(const std::vector<StageRuntime>& stages);
  struct StageUnits {
    int32_t stage;
    std::vector<GradUnit> units;
    std::vector<int32_t> node_unit;
  };
  StageUnits& units_of(const StageRuntime& s);

  ModelConfig model_;
  TrainConfig train_;
  Groups* groups_;
  Streams* streams_;
  std::vector<StageUnits> stages_;
};

}  // namespace tandem::runtime
