// The distributed optimizer (--use-distributed-optimizer, Megatron-LM's): the Adam moments of
// each weight split over the ranks that replicate it, the gradients reduce-scattered, each rank
// updating its part, the weights all-gathered after (Note [Distributed optimizer] in
// distributed_optimizer.cc). One ShardedWeights per pipeline stage of the rank.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/chunk.h"
#include "model/parameters.h"
#include "runtime/groups.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {

// One unit's weights (the embedding, a layer, the head) that one group replicates: a range of
// the flat buffers, cut into one part per rank of the group.
struct ShardPiece {
  int64_t begin = 0, count = 0;  // in the flat buffers
  bool expert = false;           // over the expert-data-parallel group, else the data-parallel one
  int ranks = 1, rank = 0;       // the group's size and this rank's place in it
  int64_t slice = 0;  // ceil(count / ranks): each rank's part (the last ones' may be shorter)
  int64_t own_begin = 0, own_count = 0;  // this rank's part, in the flat buffers
  int64_t state_at = 0;                  // its moments' first element in the optimizer's buffers
};

// The pieces of a stage's weights in flat order: its gradient units (grad_reduce.h) cut where
// their gradient runs change group; state_at counts `slice` elements for each piece, so every rank
// of a group keeps as many moments.
std::vector<ShardPiece> shard_pieces(const model::Parameters& params,
                                     const std::vector<model::NodeRef>& nodes,
                                     const comm::ParallelLayout& layout, int rank);
// The elements of each moment a rank keeps for `pieces`: the sum of their slices.
int64_t shard_state_numel(const std::vector<ShardPiece>& pieces);

class ShardedWeights {
 public:
  ShardedWeights(model::Parameters& params, std::vector<ShardPiece> pieces, Groups& groups);

  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  // The piece that starts at flat element `begin` (one must).
  const ShardPiece& piece_at(int64_t begin) const;
  // What AdamW updates: this rank's part of each piece.
  std::vector<OwnedRange> owned() const;
  int64_t state_numel() const { return shard_state_numel(pieces_); }

  // The sum of piece p's gradients over its group, into this rank's part of the flat gradients
  // (the rest keeps this rank's own, unsummed, which no one reads). The group's ranks call it
  // in the same order.
  void reduce_scatter(const ShardPiece& p);
  // Note [Weights gathered beside the forward]: the weights all-gathered after the update, the
  // pieces that begin before `end` and still wait; collective over their groups.
  void gather_until(int64_t end);
  void gather_all() { gather_until(params_->numel()); }
  // Every piece waits to be gathered (the update has written only this rank's parts).
  void set_gather_pending() { gathered_ = 0; }
  // Whether some piece that begins before `end` still waits.
  bool gather_pending(int64_t end) const {
    return gathered_ < pieces_.size() && pieces_[gathered_].begin < end;
  }
  // One moment of the optimizer's (exp_avg or exp_avg_sq), whole: every piece all-gathered into
  // a buffer laid out as the flat weights (kOther; collective over the groups).
  Tensor whole_state(const Tensor& state) const;

 private:
  comm::Communicator& group(const ShardPiece& p) const;
  // out[0, p.count) = every rank's part of `mine` (p.slice elements, this rank's part first
  // copied into a padded buffer), in group order.
  void all_gather_piece(const Tensor& out, const Tensor& mine, const ShardPiece& p) const;

  model::Parameters* params_;
  std::vector<ShardPiece> pieces_;
  Groups* groups_;
  size_t gathered_;  // pieces [0, gathered_) hold every rank's updated weights
};

}  // namespace tandem::runtime
