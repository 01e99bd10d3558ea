// Rebalancing experts between steps (TrainConfig::rebalance_experts, --rebalance-experts): the
// rows each expert took, a new placement of each MoE layer's experts (model/expert_placement.h),
// and the move of the weights and Adam moments of the experts that change rank.
//
// Note [Rebalancing experts]: with rebalance_experts = N > 0 (EP > 1), every N steps each MoE
// layer's experts are laid out anew from the rows they received over those steps, and the
// experts that change rank move (Note [Moving experts] in expert_rebalance.cc). A layer moves
// only when its most loaded expert rank gets lighter by more than 5% of the mean rank's rows, so
// a steady routing moves once and then stays, and noise moves nothing. The move is part of the
// step's time. It pays where the same experts stay hot (a trained router); a fresh router that
// learns fast moves its hot experts from one window to the next (docs/parallel.md).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/config.h"
#include "model/expert_placement.h"
#include "model/parameters.h"
#include "runtime/deferred_update.h"
#include "runtime/groups.h"
#include "runtime/stage.h"

namespace tandem::runtime {

// What one rebalancing did.
struct Rebalance {
  int layers = 0;  // MoE layers whose placement changed
  // Over the MoE layers, sum of each layer's most loaded expert rank over sum of the mean, in
  // the steps measured: with the old placement and with the new (1: even).
  double before = 1, after = 1;
  int64_t moved_bytes = 0;  // this rank sent to others (weights and Adam moments)
};

// A local expert's three matrices, one block of expert_block_numel() in the flat buffers.
struct ExpertBlock {
  int64_t layer, expert, offset;
};
std::vector<ExpertBlock> expert_blocks(const model::Parameters& params);
int64_t expert_block_numel(const ModelConfig& m);  // gate, up, down: adjacent entries

class ExpertRebalancer {
 public:
  // Throws when rebalancing is asked for without experts or expert parallelism.
  ExpertRebalancer(const ModelConfig& m, const TrainConfig& t, Groups& groups);

  // The rows this rank's experts took in one forward of stage s.
  void record(const StageRuntime& s, const model::MicroBatchState& state);
  // After step `iteration` (1-based): every rebalance_experts steps, places the experts anew
  // and moves those that change rank (the deferred update is finished first: the moments move
  // with the weights). Every rank must call it.
  void after_step(int64_t iteration, std::vector<StageRuntime>& stages, DeferredUpdate& deferred);
  // Set by the last after_step that re-placed experts, else empty.
  const std::optional<Rebalance>& last() const { return last_; }

 private:
  // Moves the experts to `to` and sets it on every stage; bytes sent to other ranks.
  int64_t move_experts(const model::ExpertPlacement& to, std::vector<StageRuntime>& stages);

  ModelConfig model_;
  int64_t every_ = 0;
  Groups* groups_;
  std::vector<int64_t> load_;  // [layer * E + expert]: rows this rank's experts took
  std::optional<Rebalance> last_;
};

}  // namespace tandem::runtime
