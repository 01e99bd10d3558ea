// Which expert sits at which place of the expert-parallel order, per MoE layer, and the choice of
// a placement that evens out the experts' measured load over the expert-parallel ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::model {

// Note [Expert placement]: expert-parallel rank r holds the experts at places
// [r * E/EP, (r + 1) * E/EP) of each MoE layer. Contiguous (the default), place p holds expert p;
// a placement may lay them out in any order, per layer, so that the experts that receive the most
// rows are spread over the ranks (DeepSeek's EPLB without the redundant copies). The attention
// node sorts its routed rows by place instead of expert (ops::moe_permutation's expert_slot), so
// each destination's rows stay one block; the experts node runs its local places in order. An
// expert's rows and their order are the same at any place, and so is every sum over them, so a
// run's results do not depend on the placement, bit for bit (tests/dist test_expert_placement).
// Parameters name each local expert by its global id (model.layers.L.block_sparse_moe.experts.X),
// so checkpoints do not depend on it either.
struct ExpertPlacement {
  // By global layer: the expert at each place. Fewer entries than layers, or an empty entry:
  // those layers are contiguous.
  std::vector<std::vector<int32_t>> layers;

  bool contiguous(int64_t layer) const;
  int32_t expert_at(int64_t layer, int64_t place) const;
  // Each expert's place in `layer` (of `num_experts`).
  std::vector<int32_t> places(int64_t layer, int64_t num_experts) const;
};

// Throws tandem::Error unless every entry of `p` is a permutation of [0, num_experts) and there
// are at most num_layers entries.
void check_placement(const ExpertPlacement& p, int64_t num_layers, int64_t num_experts);

// The rows each rank's experts take: load[e] summed over the experts at its places.
std::vector<int64_t> rank_loads(const std::vector<int32_t>& experts_at,
                                const std::vector<int64_t>& load, int64_t ranks);

// A placement of one layer's experts (load[e]: rows expert e took) on `ranks` ranks of
// E / ranks places each whose most loaded rank carries little: the heaviest experts first, each
// to the least loaded rank with a free place, then swaps between the most loaded rank and
// another while one lowers the larger of the two. Each rank's experts in ascending order.
// Deterministic (ties go to the lower index), so every rank computes the same placement.
std::vector<int32_t> balance_experts(const std::vector<int64_t>& load, int64_t ranks);

}  // namespace tandem::model
