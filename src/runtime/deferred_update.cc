// The deferred optimizer update (deferred_update.h).
//
// Note [The update beside the first forward]: a step of combined 1F1B with expert parallelism
// begins with a forward that has no partner, whose all-to-all has nothing to overlap, and the
// step before ended with AdamW over every weight, with nothing beside it. With defer_optimizer
// the step ends with AdamW::defer_step (the clipping coefficient and the learning rate are known
// then) and the next step updates each weight just before the first node that reads it (Note
// [Deferred update] in optimizer.cc). The weights lie in the flat buffers in the order the
// forward reads them, so "the weights node i reads" is a prefix, node_weight_ends. On the GPU
// the first forward issues, beside each all-to-all, the update of what comes next
// (StreamExecutor::forward_beside_update); a stage that receives its input updates all its
// weights at the receive, while it waits. Every update is issued on the compute stream before
// the node that reads its weights, so the values are those of updating at the step's end, bit
// for bit. The planner models the same (Note [Deferred update in the plan] in
// planner/simulator.cc). Whatever reads the weights between steps finishes the update first.
#include "runtime/deferred_update.h"

#include <algorithm>
#include <string>
#include <utility>

namespace tandem::runtime {

std::vector<int64_t> node_weight_ends(const model::Parameters& params,
                                      const std::vector<model::NodeRef>& nodes) {
  const int64_t layer_begin = params.spec().layer_begin;
  const auto layers = static_cast<size_t>(params.spec().layer_end - layer_begin);
  int64_t embed = 0;
  // Per layer, the end of the weights of its attention node (the router and its bias included),
  // its shared expert and its experts or mlp (planner/pipeline_model.cc's node_params).
  std::vector<int64_t> attention(layers, 0), shared(layers, 0), ffn(layers, 0);
  const std::string prefix = "model.layers.";
  const auto has = [](const std::string& name, const char* part) {
    return name.find(part) != std::string::npos;
  };
  for (const model::ParamEntry& e : params.entries()) {
    const int64_t end = e.offset + shape_numel(e.shape);
    // The MTP modules (model.layers.{L + j}) are the loss node's, which reads every weight.
    if (e.name.rfind(prefix, 0) == 0 &&
        std::stoll(e.name.substr(prefix.size())) < params.config().num_layers) {
      const auto l = static_cast<size_t>(std::stoll(e.name.substr(prefix.size())) - layer_begin);
      TANDEM_ASSERT(l < layers, "weight ", e.name, " outside the chunk's layers");
      // The router (mlp.gate or block_sparse_moe.gate) and its expert bias; not a shared
      // expert's gate (shared_expert_gate) nor any gate_proj.
      const bool router =
          has(e.name, ".gate.weight") || has(e.name, ".gate.e_score_correction_bias");
      const bool ffn_weight = has(e.name, ".mlp.") || has(e.name, ".experts.");
      int64_t& slot = router || !ffn_weight          ? attention[l]
                      : has(e.name, "shared_expert") ? shared[l]
                                                     : ffn[l];
      slot = std::max(slot, end);
    } else if (e.name.rfind("model.embed_tokens.", 0) == 0) {
      embed = end;
    }
  }
  std::vector<int64_t> ends;
  int64_t upto = 0;  // running: a node may read the weights of every node before it
  for (const model::NodeRef& n : nodes) {
    const auto l = static_cast<size_t>(n.layer);
    switch (n.kind) {
      case NodeKind::kEmbed:
        upto = std::max(upto, embed);
        break;
      case NodeKind::kAttention:
        upto = std::max(upto, attention[l]);
        break;
      case NodeKind::kSharedExpert:
        upto = std::max({upto, attention[l], shared[l]});
        break;
      case NodeKind::kExperts:
      case NodeKind::kMlp:
        upto = std::max({upto, attention[l], shared[l], ffn[l]});
        break;
      case NodeKind::kLoss:
        upto = params.numel();
        break;
      default:
        break;  // dispatch and combine read no weights
    }
    ends.push_back(upto);
  }
  return ends;
}

void DeferredUpdate::update(StageRuntime& s, int64_t end, int half) {
  if (s.shards && s.shards->gather_pending(end)) {
    // Note [Weights gathered beside the forward] (distributed_optimizer.cc).
    ShardedWeights& w = *s.shards;
    SpanInfo span;
    span.track = half ? "compute2" : "compute";
    span.name = "gather " + std::to_string(s.stage) + " until " + std::to_string(end);
    streams_->run(compute_stream(half), std::move(span), [&w, end] { w.gather_until(end); });
  }
  AdamW& opt = *s.optimizer;
  if (end <= opt.updated_until()) return;
  const int64_t from = opt.updated_until();
  SpanInfo span;
  span.track = half ? "compute2" : "compute";
  span.name = "update " + std::to_string(s.stage) + " [" + std::to_string(from) + ", " +
              std::to_string(end) + ")";
  span.busy = true;
  span.weights = end - from;
  streams_->run(compute_stream(half), std::move(span), [&opt, end] { opt.update_until(end); });
}

void DeferredUpdate::finish(std::vector<StageRuntime>& stages) {
  for (StageRuntime& s : stages) update(s, s.params->numel());
}

}  // namespace tandem::runtime
