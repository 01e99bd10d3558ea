// Gradient reduction and the global gradient norm (grad_reduce.h).
//
// Note [Gradients reduced beside the backward]: a unit's gradients are final once every one of
// its nodes that writes weight gradients has done so for every micro-batch of the step: the
// host counts those passes as it issues them (num_mb per weighted node; schedules that split the
// weight gradient off, zb-h1 and dualpipev, count their W actions), so the rule holds for every
// schedule. Units are whole layers because a node may write the gradient of a weight another
// node reads (the router's, written by the attention node's backward, sits among the layer's MoE
// weights); a layer's nodes run from its last to its first, so the layer is final at its
// attention. A unit's all-reduce goes on the reduce stream after an event on the stream that ran
// its last weight gradient (on the GPU a low-priority stream beside the backward; on the CPU
// right after the action, on this thread, as MPI wants). Every data-parallel rank runs the same
// schedule, so each group sees its reductions in the same order everywhere, which is also what
// NCCL asks of communicators used at once. Each element is summed over the same ranks as at the
// step's end; with two ranks a sum has one order, so the values are bitwise those of reducing at
// the end; with more, the library's summation order may depend on the call's size (last bits).
#include "runtime/grad_reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "runtime/expert_rebalance.h"
#include "schedule/node_times.h"

namespace tandem::runtime {

std::vector<GradUnit> gradient_units(const model::Parameters& params,
                                     const std::vector<model::NodeRef>& nodes,
                                     std::vector<int32_t>& node_unit) {
  const int64_t layer_begin = params.spec().layer_begin;
  const auto layers = static_cast<size_t>(params.spec().layer_end - layer_begin);
  // Unit index by kind: 0 the embedding, 1 + l layer l, 1 + layers the head.
  std::vector<GradUnit> all(layers + 2);
  all[0].name = "embed";
  for (size_t l = 0; l < layers; ++l) {
    all[1 + l].name = "layer " + std::to_string(layer_begin + static_cast<int64_t>(l));
  }
  all[1 + layers].name = "head";
  std::vector<int64_t> numel(all.size(), 0);
  for (auto& u : all) u.begin = params.numel();
  const std::string prefix = "model.layers.";
  for (const model::ParamEntry& e : params.entries()) {
    size_t k = 1 + layers;  // model.norm and lm_head
    // The MTP modules (model.layers.{L + j}) are the head's (the loss node runs them).
    const bool layer = e.name.rfind(prefix, 0) == 0 &&
                       std::stoll(e.name.substr(prefix.size())) < params.config().num_layers;
    if (layer) {
      k = 1 + static_cast<size_t>(std::stoll(e.name.substr(prefix.size())) - layer_begin);
      TANDEM_ASSERT(k >= 1 && k <= layers, "weight ", e.name, " outside the chunk's layers");
    } else if (e.name.rfind("model.embed_tokens.", 0) == 0 && params.spec().has_embed) {
      k = 0;  // on a last stage, the table's copy is the head's (Note [Tied embeddings])
    }
    const int64_t n = shape_numel(e.shape);
    all[k].begin = std::min(all[k].begin, e.offset);
    all[k].end = std::max(all[k].end, e.offset + n);
    numel[k] += n;
  }
  std::vector<int32_t> index(all.size(), -1);
  std::vector<GradUnit> out;
  node_unit.clear();
  for (const model::NodeRef& node : nodes) {
    const size_t k = node.kind == NodeKind::kEmbed  ? 0
                     : node.kind == NodeKind::kLoss ? 1 + layers
                                                    : 1 + static_cast<size_t>(node.layer);
    TANDEM_ASSERT(k < all.size(), "node outside the chunk's units");
    if (index[k] < 0) {
      // One range each, and nothing else inside it: the flat buffers hold a unit's weights
      // side by side (Parameters' order: embedding, layers, head).
      TANDEM_ASSERT(numel[k] == all[k].end - all[k].begin, "unit ", all[k].name,
                    "'s weights are not contiguous");
      index[k] = static_cast<int32_t>(out.size());
      out.push_back(all[k]);
    }
    if (schedule::node_has_weights(node.kind)) ++out[static_cast<size_t>(index[k])].weighted_nodes;
    node_unit.push_back(index[k]);
  }
  return out;
}

GradReducer::GradReducer(const ModelConfig& m, const TrainConfig& t, Groups& groups,
                         Streams& streams)
    : model_(m), train_(t), groups_(&groups), streams_(&streams) {}

void GradReducer::add_stage(const StageRuntime& s) {
  StageUnits u;
  u.stage = s.stage;
  u.units = gradient_units(*s.params, s.chunk->nodes(), u.node_unit);
  stages_.push_back(std::move(u));
}

GradReducer::StageUnits& GradReducer::units_of(const StageRuntime& s) {
  for (StageUnits& u : stages_) {
    if (u.stage == s.stage) return u;
  }
  TANDEM_ASSERT(false, "stage ", s.stage, " has no gradient units");
  return stages_.front();
}

bool GradReducer::overlapped() const {
  const comm::ParallelLayout& L = groups_->layout;
  return train_.overlap_grad_reduce && (L.dp() > 1 || (L.ep > 1 && L.edp() > 1));
}

void GradReducer::begin_step(int64_t num_mb) {
  for (StageUnits& s : stages_) {
    for (GradUnit& u : s.units) {
      u.pending = u.weighted_nodes * num_mb;
      u.reduced = false;
    }
  }
}

// Note [Gradient runs]: the gradients are reduced (and their norm summed) over runs of
// neighbouring entries of the flat buffer that share a group, not entry by entry: one call (or
// one sum-of-squares readback) per run instead of one per tensor. With one expert rank the
// experts' group is the data-parallel group itself, so the whole buffer is one run; with EP > 1
// a layer makes about two (its dense tensors, its experts).
std::vector<GradRun> gradient_runs(const model::Parameters& params, int ep) {
  std::vector<GradRun> runs;
  for (const model::ParamEntry& e : params.entries()) {
    const bool expert = e.shard == model::ParamShard::kExpert && ep > 1;
    const bool tp_shard = params.spec().tp > 1 && e.tp_split != model::TpSplit::kReplicated;
    const int64_t n = shape_numel(e.shape);
    if (!runs.empty() && runs.back().expert == expert && runs.back().tp_shard == tp_shard &&
        runs.back().begin + runs.back().count == e.offset) {
      runs.back().count += n;
    } else {
      runs.push_back({e.offset, n, expert, tp_shard});
    }
  }
  return runs;
}

bool counts_run(const GradRun& run, const comm::ParallelLayout& layout, int rank) {
  const int first = run.expert ? layout.edp_rank(rank) : layout.dp_rank(rank);
  return first == 0 && (run.tp_shard || layout.tp_rank(rank) == 0);
}

std::vector<GradReducer::Part> GradReducer::unit_parts(const StageRuntime& s,
                                                       const GradUnit& u) const {
  const comm::ParallelLayout& L = groups_->layout;
  std::vector<Part> parts;
  auto bus = [](const Tensor& grads, int64_t n, double passes) {
    return static_cast<double>(grads.nbytes()) * passes * static_cast<double>(n - 1) /
           static_cast<double>(n);
  };
  if (s.shards) {  // Note [Distributed optimizer]: the unit's pieces, reduce-scattered
    for (const ShardPiece& p : s.shards->pieces()) {
      if (p.begin < u.begin || p.begin >= u.end || p.ranks <= 1) continue;
      const Tensor grads = s.params->flat_grads().narrow_rows(p.begin, p.count);
      parts.push_back({p.expert ? &groups_->edp_data() : &groups_->dp_data(), grads,
                       bus(grads, p.ranks, 1.0), s.shards.get(), &p});
    }
    return parts;
  }
  for (const GradRun& run : gradient_runs(*s.params, groups_->layout.ep)) {  // Note [Gradient runs]
    const int64_t begin = std::max(run.begin, u.begin);
    const int64_t end = std::min(run.begin + run.count, u.end);
    const int64_t n = run.expert ? L.edp() : L.dp();
    if (begin >= end || n <= 1) continue;
    const Tensor grads = s.params->flat_grads().narrow_rows(begin, end - begin);
    parts.push_back(
        {run.expert ? &groups_->edp_data() : &groups_->dp_data(), grads, bus(grads, n, 2.0)});
  }
  return parts;
}

void GradReducer::weight_grad_issued(const StageRuntime& s, size_t node, StreamId stream) {
  // Only nodes with weights count (GradUnit::weighted_nodes).
  if (!overlapped() || !schedule::node_has_weights(s.chunk->nodes()[node].kind)) return;
  StageUnits& units = units_of(s);
  GradUnit& u = units.units[static_cast<size_t>(units.node_unit[node])];
  TANDEM_ASSERT(u.pending > 0, "unit ", u.name, " of stage ", s.stage,
                " got more weight gradients than the step's micro-batches");
  if (--u.pending > 0) return;
  std::vector<Part> parts = unit_parts(s, u);
  SpanInfo span;
  span.track = "reduce";
  span.name = "reduce " + u.name;
  for (const Part& p : parts) span.bus_bytes += p.bus_bytes;
  streams_->wait(StreamId::kReduce, streams_->mark(stream), stream, std::string());
  streams_->run(StreamId::kReduce, std::move(span), [parts = std::move(parts)] {
    for (const Part& p : parts) {
      if (p.piece) {
        p.shards->reduce_scatter(*p.piece);
      } else {
        p.group->all_reduce_sum(p.grads);
      }
    }
  });
  u.reduced = true;
}

void GradReducer::end_step(const std::vector<StageRuntime>& stages) {
  if (overlapped()) {  // Note [Gradients reduced beside the backward]
    for (const StageUnits& s : stages_) {
      for (const GradUnit& u : s.units) {
        TANDEM_ASSERT(u.reduced, "unit ", u.name, " of stage ", s.stage, " still waits for ",
                      u.pending, " weight-gradient passes at the step's end");
      }
    }
    streams_->wait_all(StreamId::kCompute, StreamId::kReduce);
  } else {
    reduce_now(stages);
  }
  sum_shared_embedding(stages);
}

void GradReducer::reduce_now(const std::vector<StageRuntime>& stages) {
  const comm::ParallelLayout& L = groups_->layout;
  for (const StageRuntime& s : stages) {
    if (s.shards) {  // Note [Distributed optimizer]
      for (const ShardPiece& p : s.shards->pieces()) s.shards->reduce_scatter(p);
      continue;
    }
    for (const GradRun& run :
         gradient_runs(*s.params, groups_->layout.ep)) {  // Note [Gradient runs]
      comm::Communicator& group = run.expert ? groups_->edp_data() : groups_->dp_data();
      if ((run.expert ? L.edp() : L.dp()) > 1) {
        group.all_reduce_sum(s.params->flat_grads().narrow_rows(run.begin, run.count));
      }
    }
  }
}

// Note [The embedding group]: with tied embeddings over several pipeline stages
// (Note [Tied embeddings] in model/parameters.h) the first stage's table and the last stage's copy
// each have the gradient of one use; Megatron-LM sums the two between the ranks that hold them (its
// embedding group) after the data-parallel reduction and before the norm and the optimizer, and
// so does this. Each side then holds S0 + S1 (one sum of two values, the same either way round),
// so the copies take the same update and stay bitwise equal. The ranks are the pipeline ranks of
// the first and the last stage with the same data-parallel and expert coordinates
// (Groups::embedding), or one rank holding both (DualPipeV's V), which adds them itself. With the
// distributed optimizer only this rank's part of the reduce-scattered piece holds a sum; the
// table is a piece of its own on both stages (shard_pieces), so the two parts are the same rows.
void GradReducer::sum_shared_embedding(const std::vector<StageRuntime>& stages) {
  std::vector<Tensor> mine;
  for (const StageRuntime& s : stages) {
    const model::ParamEntry* e = s.params->shared_embedding();
    if (e == nullptr) continue;
    int64_t begin = e->offset, count = shape_numel(e->shape);
    if (s.shards) {
      const ShardPiece& p = s.shards->piece_at(begin);
      TANDEM_ASSERT(p.begin == begin && p.count == count, "the embedding table is not a piece");
      begin = p.own_begin;
      count = p.own_count;
    }
    mine.push_back(s.params->flat_grads().narrow_rows(begin, count));
  }
  if (mine.empty()) return;
  if (mine.size() == 2) {  // both ends on this rank
    ops::axpy(mine[0], mine[1], 1.0);
    mine[1].copy_from(mine[0]);
    return;
  }
  TANDEM_ASSERT(groups_->embedding != nullptr, "a tied stage without its embedding group");
  if (mine[0].numel() > 0) groups_->embedding_data().all_reduce_sum(mine[0]);
}

// Note [Non-finite steps on several ranks]: the step's verdict must be the same on every rank,
// or some ranks would update and others not. The norm counts each gradient once (dense ones on
// data-parallel rank 0, experts on expert-data-parallel rank 0), so a NaN in a copy that is not
// counted would go unseen; each rank therefore also adds a flag, 1 when any of its own gradients
// is not finite, and the flags are summed with the norm in one all-reduce. The result (NaN when
// any flag is set) is the same on every rank, and so is the global loss.
// Note [Norm from the parts]: with the distributed optimizer each rank holds the sums of its own
// parts of the pieces only (Note [Distributed optimizer] in distributed_optimizer.cc), and each
// element of the model lies in one rank's part, so each rank counts its parts and the world's
// all-reduce adds them. The rest of its flat gradients (its own unsummed ones) still sets the
// flag: a value that is not finite there makes the owner's sum not finite too.
// Note [Norm by expert]: experts that move between ranks (Note [Rebalancing experts]) would
// change which rank's partial sum holds each expert's squares, and so the norm's last bits (and
// the clipping's). With rebalancing on, each expert's squares go to a slot of its own, by layer
// and global id, in the all-reduce (one rank fills each slot, so the sum there is exact), and the
// slots are added in that order: the norm does not depend on the placement.
double GradReducer::global_norm(const std::vector<StageRuntime>& stages) {
  const comm::ParallelLayout& L = groups_->layout;
  const bool by_expert = train_.rebalance_experts > 0;
  double sq = 0, non_finite = 0;
  std::vector<double> experts(by_expert ? model_.num_layers * model_.num_experts : 0, 0.0);
  // Every sum is enqueued before the first is read (one wait for the GPU, not one per sum),
  // then added in the same order as ever. slot: -1 the dense part, -2 none, else experts[slot].
  struct Part {
    ops::PendingScalar value;
    int64_t slot;
  };
  std::vector<Part> parts;
  for (const StageRuntime& s : stages) {
    const Tensor& g = s.params->flat_grads();
    // Note [Tied embeddings]: the last stage's copy of the table is not counted (its flag is).
    const model::ParamEntry* copy = s.params->tied_copy();
    const int64_t copy_begin = copy ? copy->offset : 0;
    const int64_t copy_end = copy ? copy->offset + shape_numel(copy->shape) : 0;
    const auto add = [&](int64_t begin, int64_t end, int64_t slot) {
      const int64_t cuts[4] = {begin, std::clamp(copy_begin, begin, end),
                               std::clamp(copy_end, begin, end), end};
      for (int k = 0; k < 3; ++k) {
        if (cuts[k] >= cuts[k + 1]) continue;
        parts.push_back({ops::sum_squares_start(g.narrow_rows(cuts[k], cuts[k + 1] - cuts[k])),
                         k == 1 ? -2 : slot});
      }
    };
    if (s.shards) {  // Note [Norm from the parts]
      for (const ShardPiece& p : s.shards->pieces()) {
        const int64_t own_end = p.own_begin + p.own_count, end = p.begin + p.count;
        const int64_t cuts[4] = {p.begin, p.own_begin, own_end, end};
        for (int k = 0; k < 3; ++k) {
          if (cuts[k] < cuts[k + 1]) add(cuts[k], cuts[k + 1], k == 1 ? -1 : -2);
        }
      }
      continue;
    }
    for (const GradRun& run :
         gradient_runs(*s.params, groups_->layout.ep)) {  // Note [Gradient runs]
      if (run.expert && by_expert) continue;              // below, expert by expert
      add(run.begin, run.begin + run.count, counts_run(run, L, groups_->rank) ? -1 : -2);
    }
    if (!by_expert) continue;
    for (const ExpertBlock& b : expert_blocks(*s.params)) {
      const int64_t slot =
          L.edp_rank(groups_->rank) == 0 ? b.layer * model_.num_experts + b.expert : -2;
      parts.push_back(
          {ops::sum_squares_start(g.narrow_rows(b.offset, expert_block_numel(model_))), slot});
    }
  }
  for (Part& p : parts) {
    const double part = p.value.get();
    if (!std::isfinite(part)) non_finite = 1;
    if (p.slot == -1) sq += part;
    if (p.slot >= 0) experts[static_cast<size_t>(p.slot)] = part;
  }
  Tensor t = Tensor::empty({2 + static_cast<int64_t>(experts.size())}, DType::kF64,
                           MemCategory::kOther, "grad_norm");
  t.data<double>()[0] = sq;
  t.data<double>()[1] = non_finite;
  std::copy(experts.begin(), experts.end(), t.data<double>() + 2);
  groups_->world->all_reduce_sum(t);
  if (t.data<double>()[1] > 0) return std::numeric_limits<double>::quiet_NaN();
  double total = t.data<double>()[0];
  for (size_t i = 0; i < experts.size(); ++i) total += t.data<double>()[2 + i];
  return std::sqrt(total);
}

}  // namespace tandem::runtime
