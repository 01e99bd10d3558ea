// Rebalancing experts between steps (expert_rebalance.h).
//
// Note [Moving experts]: every rank takes the same decision, from the loads summed over the whole
// world (so the expert-data-parallel replicas, whose tokens differ, keep the same placement and
// their expert gradients keep meaning the same expert). The move is one all-to-all of the expert
// group per MoE layer and buffer (master weights, exp_avg, exp_avg_sq): an expert's three
// matrices are adjacent in the flat buffers and every expert has the same size, so an expert is
// one row of B = 3 Fe H elements, and the places keep their offsets (Parameters::set_placement).
// Rows travel to each peer in the order of their new places, which both sides know. Gradients are
// not moved: the next step zeroes them first. The bf16 compute copy is formed again after.
#include "runtime/expert_rebalance.h"

#include <algorithm>

namespace tandem::runtime {

// A layer moves only when its most loaded rank gets lighter by this fraction of the mean rank's
// rows: above the few percent by which the loads of random tokens wander from one window to the
// next, so that noise moves nothing (figures: bench/results/gpu_multi.md).
constexpr double kMinGain = 0.05;

std::vector<ExpertBlock> expert_blocks(const model::Parameters& params) {
  const model::ChunkSpec& spec = params.spec();
  const ModelConfig& m = params.config();
  std::vector<ExpertBlock> out;
  // Each local expert is three adjacent expert entries (gate, up, down), in place order within
  // each MoE layer (model/parameters.cc); its block starts at the first.
  int64_t in_expert = 0, layer = -1, place = 0;
  for (const model::ParamEntry& x : params.entries()) {
    if (x.shard != model::ParamShard::kExpert) continue;
    if (in_expert++ % 3 != 0) continue;
    const int64_t l = std::stoll(x.name.substr(std::string("model.layers.").size()));
    if (l >= m.num_layers) continue;  // an MTP module's: its experts stay at their own places
    place = l == layer ? place + 1 : spec.expert_begin;
    layer = l;
    out.push_back({layer, spec.placement.expert_at(layer, place), x.offset});
  }
  int64_t moe_layers = 0;
  for (int64_t l = spec.layer_begin; l < spec.layer_end; ++l) moe_layers += m.is_moe_layer(l);
  TANDEM_ASSERT(static_cast<int64_t>(out.size()) ==
                moe_layers * (spec.expert_end - spec.expert_begin));
  return out;
}

int64_t expert_block_numel(const ModelConfig& m) { return 3 * m.expert_ffn_size() * m.hidden_size; }

ExpertRebalancer::ExpertRebalancer(const ModelConfig& m, const TrainConfig& t, Groups& groups)
    : model_(m), every_(t.rebalance_experts), groups_(&groups) {
  if (every_ <= 0) return;
  TANDEM_CHECK(m.is_moe() && groups.layout.ep > 1, "--rebalance-experts ", every_,
               " moves experts between expert-parallel ranks; it needs experts and "
               "--expert-model-parallel-size > 1 (it is ",
               groups.layout.ep, "), or 0");
  load_.assign(static_cast<size_t>(m.num_layers * m.num_experts), 0);
}

void ExpertRebalancer::record(const StageRuntime& s, const model::MicroBatchState& state) {
  if (load_.empty()) return;
  const model::ChunkSpec& spec = s.params->spec();
  const int64_t e = model_.num_experts;
  for (size_t l = 0; l < state.layers.size(); ++l) {
    const int64_t layer = spec.layer_begin + static_cast<int64_t>(l);
    const std::vector<int32_t>& rows = state.layers[l].experts.rows_host;  // per local place
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t place = spec.expert_begin + static_cast<int64_t>(i);
      const int32_t x = spec.placement.expert_at(layer, place);
      load_[static_cast<size_t>(layer * e + x)] += rows[i];
    }
  }
}

namespace {

// One layer's decision: the balanced placement when it is worth a move (else empty), the most
// loaded rank's rows before and after, and the mean rank's.
struct LayerChoice {
  std::vector<int32_t> to;
  double before = 0, after = 0, mean = 0;
};

LayerChoice choose(const std::vector<int32_t>& now, const std::vector<int64_t>& load,
                   int64_t ranks) {
  const auto most = [&](const std::vector<int32_t>& at) {
    const std::vector<int64_t> per = model::rank_loads(at, load, ranks);
    return static_cast<double>(*std::max_element(per.begin(), per.end()));
  };
  LayerChoice c;
  for (const int64_t x : load) c.mean += static_cast<double>(x) / static_cast<double>(ranks);
  const std::vector<int32_t> best = model::balance_experts(load, ranks);
  c.before = c.after = most(now);
  // Worth a move only when the most loaded rank gets lighter by kMinGain of the mean rank.
  if (c.before - most(best) > kMinGain * c.mean) {
    c.after = most(best);
    c.to = best;
  }
  return c;
}

}  // namespace

void ExpertRebalancer::after_step(int64_t iteration, std::vector<StageRuntime>& stages,
                                  DeferredUpdate& deferred) {
  last_.reset();
  if (load_.empty() || iteration % every_ != 0) return;
  const auto n = static_cast<int64_t>(load_.size());
  const Tensor load = Tensor::empty({n}, DType::kI64, MemCategory::kOther, "expert_load");
  std::copy(load_.begin(), load_.end(), load.data<int64_t>());
  groups_->world->all_reduce_sum(load);  // Note [Moving experts]
  std::fill(load_.begin(), load_.end(), 0);
  const int64_t e = model_.num_experts;
  // Every stage holds the whole model's placement (Parameters::spec()), the same in each.
  const model::ExpertPlacement& placed = stages.front().params->spec().placement;
  model::ExpertPlacement to = placed;
  to.layers.resize(static_cast<size_t>(model_.num_layers));
  Rebalance r;
  double before = 0, after = 0, mean = 0;
  for (int64_t l = 0; l < model_.num_layers; ++l) {
    if (!model_.is_moe_layer(l)) continue;  // no experts to lay out
    std::vector<int32_t> now(static_cast<size_t>(e));
    for (int64_t p = 0; p < e; ++p) now[static_cast<size_t>(p)] = placed.expert_at(l, p);
    const int64_t* layer_load = load.data<int64_t>() + l * e;
    LayerChoice c = choose(now, {layer_load, layer_load + e}, groups_->layout.ep);
    before += c.before;
    after += c.after;
    mean += c.mean;
    if (c.to.empty()) continue;
    to.layers[static_cast<size_t>(l)] = std::move(c.to);
    ++r.layers;
  }
  if (r.layers == 0) return;
  r.before = before / mean;
  r.after = after / mean;
  deferred.finish(stages);  // the moments move with the weights: the last step's update first
  r.moved_bytes = move_experts(to, stages);
  last_ = r;
}

namespace {

// One layer's move on rank `me` of the expert group (Note [Moving experts]); experts that keep
// their place stay out of it.
struct LayerMove {
  std::vector<int64_t> send_rows, recv_rows;  // per peer
  std::vector<int64_t> send_from;             // local index now of each row sent, by new place
  std::vector<int64_t> recv_into;  // local index then of each row received, by source then place
};

LayerMove plan_move(const std::vector<int32_t>& was, const model::ExpertPlacement& to,
                    int64_t layer, int64_t me, int64_t el, int64_t ranks) {
  const int64_t e = el * ranks;
  LayerMove m;
  m.send_rows.assign(static_cast<size_t>(ranks), 0);
  m.recv_rows.assign(static_cast<size_t>(ranks), 0);
  // Sent: new places ascending, so by destination rank, each one's rows in place order.
  for (int64_t q = 0; q < e; ++q) {
    const int64_t was_at = was[static_cast<size_t>(to.expert_at(layer, q))];
    if (was_at == q || was_at / el != me) continue;
    ++m.send_rows[static_cast<size_t>(q / el)];
    m.send_from.push_back(was_at - me * el);
  }
  // Received: by source rank, each one's rows in the order it sent them (place order).
  std::vector<std::pair<int64_t, int64_t>> by_source;  // (source, local index then)
  for (int64_t q = me * el; q < (me + 1) * el; ++q) {
    const int64_t was_at = was[static_cast<size_t>(to.expert_at(layer, q))];
    if (was_at == q) continue;
    ++m.recv_rows[static_cast<size_t>(was_at / el)];
    by_source.emplace_back(was_at / el, q - me * el);
  }
  std::stable_sort(by_source.begin(), by_source.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [from, local] : by_source) m.recv_into.push_back(local);
  return m;
}

}  // namespace

int64_t ExpertRebalancer::move_experts(const model::ExpertPlacement& to,
                                       std::vector<StageRuntime>& stages) {
  comm::Communicator& ep = groups_->ep_data();
  int64_t moved = 0;
  const int64_t e = model_.num_experts, p = ep.size(), el = e / p, me = ep.rank();
  const int64_t block = expert_block_numel(model_);
  for (StageRuntime& s : stages) {
    const model::ChunkSpec& spec = s.params->spec();
    TANDEM_ASSERT(spec.expert_begin == me * el, "the expert group's rank ", me,
                  " holds places from ", spec.expert_begin);
    const std::vector<ExpertBlock> blocks = expert_blocks(*s.params);  // the places' offsets
    const Tensor buffers[] = {s.params->flat_params(), s.optimizer->exp_avg(),
                              s.optimizer->exp_avg_sq()};
    const DType dt = buffers[0].dtype();
    for (int64_t l = 0; l < spec.layer_end - spec.layer_begin; ++l) {
      const int64_t layer = spec.layer_begin + l;
      const std::vector<int32_t> was = spec.placement.places(layer, e);
      if (was == to.places(layer, e)) continue;  // the same on every rank of the group
      TANDEM_ASSERT(model_.is_moe_layer(layer), "a move of dense layer ", layer);
      const auto first = static_cast<int64_t>(
          std::find_if(blocks.begin(), blocks.end(),
                       [&](const ExpertBlock& b) { return b.layer == layer; }) -
          blocks.begin());
      const LayerMove m = plan_move(was, to, layer, me, el, p);
      const auto sent = static_cast<int64_t>(m.send_from.size());
      const auto received = static_cast<int64_t>(m.recv_into.size());
      const Tensor send = Tensor::empty({sent, block}, dt, MemCategory::kCommunication,
                                        "experts.move.send", buffers[0].device());
      const Tensor recv = Tensor::empty({received, block}, dt, MemCategory::kCommunication,
                                        "experts.move.recv", buffers[0].device());
      for (const Tensor& flat : buffers) {
        auto row = [&](int64_t local) {
          return flat.narrow_rows(blocks[static_cast<size_t>(first + local)].offset, block)
              .reshape({1, block});
        };
        // Every row leaves before any arrives, so places that trade on this rank are safe.
        for (int64_t i = 0; i < sent; ++i) send.narrow_rows(i, 1).copy_from(row(m.send_from[i]));
        ep.all_to_all_v(recv, m.recv_rows, send, m.send_rows);
        for (int64_t i = 0; i < received; ++i) {
          row(m.recv_into[i]).copy_from(recv.narrow_rows(i, 1));
        }
        for (int64_t d = 0; d < p; ++d) {
          if (d != me) moved += m.send_rows[static_cast<size_t>(d)] * block * dtype_size(dt);
        }
      }
    }
    s.params->set_placement(to);
    s.params->refresh_compute_copy();
  }
  return moved;
}

}  // namespace tandem::runtime
