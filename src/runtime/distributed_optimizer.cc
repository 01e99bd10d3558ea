// The distributed optimizer (distributed_optimizer.h).
//
// Note [Distributed optimizer]: with --use-distributed-optimizer (Megatron-LM's) the ranks that
// hold copies of the same weights (the data-parallel group for dense weights, the
// expert-data-parallel group for experts when EP > 1) split those weights' optimizer state
// between them instead of each keeping all of it. A stage's flat buffers are cut into pieces:
// each gradient unit (the embedding, a layer, the head: the ranges the reduction beside the
// backward works on, Note [Gradients reduced beside the backward] in grad_reduce.cc) cut again
// where the group changes (a MoE layer's dense weights, then its experts). A piece of n elements
// over a group of r ranks is cut into r parts of ceil(n / r) elements, the last ones shorter or
// empty; rank i of the group owns part i. Each rank keeps Adam's two moments for its parts only
// (ceil(n / r) elements each per piece, padding included, so every rank of a group keeps as many
// and the planner's figure is exact: Note [Distributed optimizer in the plan] in
// planner/pipeline_model.h). A step then:
//  1. reduce-scatters each piece's gradients over its group (where the all-reduce was: beside the
//     backward, or at the step's end), so each rank holds the sum of its parts only;
//  2. takes the global norm from the parts (each element of the model is owned by one rank of
//     the world), Note [Norm from the parts] in grad_reduce.cc;
//  3. runs AdamW on its parts (AdamW with OwnedRanges);
//  4. all-gathers each piece's weights from their owners: right after the update, or with
//     --overlap-param-gather just before the next step's forward reads them
//     (Note [Weights gathered beside the forward]).
// The f32 master weights stay whole on every rank (on the CPU they are what the forward reads;
// on the GPU the gather refreshes the bf16 copy of the parts it brings, Note [Compute copy]);
// what a rank saves is two moments of (r - 1) / r of the replicated weights.
// Results: AdamW reads and writes each element alone, so each element's update is the plain
// optimizer's once its summed gradient and the clipping coefficient are. With two ranks a sum
// has one order, so the reduce-scatter's sums are the all-reduce's bit for bit; with more, the
// library may add in another order (last bits). The norm adds the same squares grouped by
// parts, so it may differ in its last bits, and the clipping coefficient with it; the update
// rounds that coefficient to f32. tests/dist/test_distributed_optimizer.cc checks the weights
// and moments bit for bit against the plain optimizer's where the groups have two ranks.
//
// Note [Weights gathered beside the forward]: after the update each rank's flat weights hold
// its own parts updated and the others' stale. Each piece is gathered before anything reads it:
// with --overlap-param-gather, DeferredUpdate::update (the hook the deferred update uses, before
// each forward node's weights are read; deferred_update.h) gathers the pieces before the node's
// weights end, so a piece travels just before its layer's forward rather than all at the
// step's end; whatever reads the weights between steps (evaluation, a checkpoint, the stages()
// accessor) gathers the rest first. Every rank of a group runs the same schedule, so each
// group sees its gathers in the same order. A gather runs on the compute stream (on the CPU
// inline on the host thread); a pair action gathers its stages' pieces before it starts, as on
// the CPU no collective may run beside the communication thread's (MPI_THREAD_SERIALIZED).
#include "runtime/distributed_optimizer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"
#include "runtime/grad_reduce.h"

namespace tandem::runtime {

std::vector<ShardPiece> shard_pieces(const model::Parameters& params,
                                     const std::vector<model::NodeRef>& nodes,
                                     const comm::ParallelLayout& layout, int rank) {
  std::vector<int32_t> node_unit;
  std::vector<GradUnit> units = gradient_units(params, nodes, node_unit);
  std::sort(units.begin(), units.end(),
            [](const GradUnit& a, const GradUnit& b) { return a.begin < b.begin; });
  const std::vector<GradRun> runs = gradient_runs(params, layout.ep);
  // Note [The embedding group] (grad_reduce.cc): a tied table shared with another stage is a
  // piece of its own, so both stages cut it into the same parts.
  const model::ParamEntry* shared = params.shared_embedding();
  std::vector<int64_t> cuts;
  if (shared != nullptr) cuts = {shared->offset, shared->offset + shape_numel(shared->shape)};
  std::vector<ShardPiece> pieces;
  int64_t state_at = 0;
  const auto add = [&](int64_t begin, int64_t end, bool expert) {
    ShardPiece p;
    p.begin = begin;
    p.count = end - begin;
    p.expert = expert;
    p.ranks = expert ? layout.edp() : layout.dp();
    p.rank = expert ? layout.edp_rank(rank) : layout.dp_rank(rank);
    p.slice = (p.count + p.ranks - 1) / p.ranks;
    const int64_t own = std::min(p.count, p.slice * p.rank);
    p.own_begin = p.begin + own;
    p.own_count = std::min(p.count, own + p.slice) - own;
    p.state_at = state_at;
    state_at += p.slice;
    pieces.push_back(p);
  };
  for (const GradUnit& u : units) {
    for (const GradRun& run : runs) {
      int64_t begin = std::max(run.begin, u.begin);
      const int64_t end = std::min(run.begin + run.count, u.end);
      for (int64_t c : cuts) {
        if (c <= begin || c >= end) continue;
        add(begin, c, run.expert);
        begin = c;
      }
      if (begin < end) add(begin, end, run.expert);
    }
  }
  return pieces;
}

int64_t shard_state_numel(const std::vector<ShardPiece>& pieces) {
  int64_t n = 0;
  for (const ShardPiece& p : pieces) n += p.slice;
  return n;
}

ShardedWeights::ShardedWeights(model::Parameters& params, std::vector<ShardPiece> pieces,
                               Groups& groups)
    : params_(&params), pieces_(std::move(pieces)), groups_(&groups), gathered_(pieces_.size()) {}

std::vector<OwnedRange> ShardedWeights::owned() const {
  std::vector<OwnedRange> out;
  for (const ShardPiece& p : pieces_) {
    if (p.own_count > 0) out.push_back({p.own_begin, p.own_count, p.state_at});
  }
  return out;
}

const ShardPiece& ShardedWeights::piece_at(int64_t begin) const {
  for (const ShardPiece& p : pieces_) {
    if (p.begin == begin) return p;
  }
  TANDEM_ASSERT(false, "no piece starts at ", begin);
  return pieces_.front();
}

comm::Communicator& ShardedWeights::group(const ShardPiece& p) const {
  return p.expert ? groups_->edp_data() : groups_->dp_data();
}

void ShardedWeights::reduce_scatter(const ShardPiece& p) {
  if (p.ranks == 1) return;
  const Tensor grads = params_->flat_grads().narrow_rows(p.begin, p.count);
  const DType dt = grads.dtype();
  const Device device = params_->device();
  Tensor in = grads;
  if (p.count != p.slice * p.ranks) {  // the last parts padded with zeros
    in = Tensor::zeros({p.slice * p.ranks}, dt, MemCategory::kCommunication, "rs.in", device);
    in.narrow_rows(0, p.count).copy_from(grads);
  }
  const Tensor out = Tensor::empty({p.slice}, dt, MemCategory::kCommunication, "rs.out", device);
  group(p).reduce_scatter_sum(out, in);
  if (p.own_count > 0) {
    params_->flat_grads()
        .narrow_rows(p.own_begin, p.own_count)
        .copy_from(out.narrow_rows(0, p.own_count));
  }
}

void ShardedWeights::all_gather_piece(const Tensor& out, const Tensor& mine,
                                      const ShardPiece& p) const {
  const DType dt = out.dtype();
  const Device device = params_->device();
  const Tensor in = Tensor::zeros({p.slice}, dt, MemCategory::kCommunication, "ag.in", device);
  if (p.own_count > 0) in.narrow_rows(0, p.own_count).copy_from(mine.narrow_rows(0, p.own_count));
  if (p.count == p.slice * p.ranks) {
    group(p).all_gather(out.narrow_rows(0, p.count), in);
    return;
  }
  const Tensor all =
      Tensor::empty({p.slice * p.ranks}, dt, MemCategory::kCommunication, "ag.out", device);
  group(p).all_gather(all, in);
  out.narrow_rows(0, p.count).copy_from(all.narrow_rows(0, p.count));
}

void ShardedWeights::gather_until(int64_t end) {
  const Tensor& w = params_->flat_params();
  for (; gather_pending(end); ++gathered_) {
    const ShardPiece& p = pieces_[gathered_];
    if (p.ranks == 1) continue;
    all_gather_piece(w.narrow_rows(p.begin, p.count), w.narrow_rows(p.own_begin, p.own_count), p);
    // Note [Compute copy] (model/parameters.h): the update wrote the bf16 copy of this rank's
    // part; the others' parts are rounded here, as convert rounds them there.
    const Tensor& copy = params_->flat_compute();
    if (copy.defined()) {
      ops::convert(copy.narrow_rows(p.begin, p.count), w.narrow_rows(p.begin, p.count));
    }
  }
}

Tensor ShardedWeights::whole_state(const Tensor& state) const {
  const Tensor whole = Tensor::zeros({params_->numel()}, state.dtype(), MemCategory::kOther,
                                     "adam.whole", params_->device());
  for (const ShardPiece& p : pieces_) {
    const Tensor mine = state.narrow_rows(p.state_at, p.slice);
    if (p.ranks == 1) {
      whole.narrow_rows(p.begin, p.count).copy_from(mine.narrow_rows(0, p.count));
    } else {
      all_gather_piece(whole.narrow_rows(p.begin, p.count), mine, p);
    }
  }
  return whole;
}

}  // namespace tandem::runtime
