// The pipeline trainer's deferred optimizer update (TrainConfig::defer_optimizer,
// --defer-optimizer).
//
// Note [The update beside the first forward]: a step of combined 1F1B with expert parallelism
// begins with a forward that has no partner (Note [The unpaired backward's all-to-all] in
// combined.cc): each of its nodes reads the one before, so its expert all-to-all has nothing to
// overlap and is exposed in full (about 5% of the all-to-all time of an EP2 step on 2 H200s).
// And the step before ended with AdamW over every weight, with nothing in flight beside it. With
// defer_optimizer the step ends with AdamW::defer_step instead (the clipping coefficient and the
// learning rate are known then), and the next step's forwards update each weight just before the
// first node that reads it (Note [Deferred update] in optimizer.cc). The weights lie in the flat
// buffers in the order the forward reads them (Parameters::build_entries: embedding, each layer's
// attention side then its experts or mlp, the head), so "the weights node i reads" is a prefix
// of the buffers, node_weight_ends. On the GPU, with the all-to-all on the communication stream
// (--comm-overlap on or split, EP > 1), the first forward puts its dispatch and combine there and
// issues, right after each, the update of what comes next: after combine(l), layer l+1's
// attention weights and half of its experts' (the compute stream runs them while combine(l)
// is in flight); after dispatch(l)'s counts, the other half (beside the counts and the rows).
// A stage that receives its input from another rank updates all its weights at the receive
// instead, while it waits (the pipeline's warm-up bubble). Every update runs on the compute
// stream before the node that reads its weights, so the values are those of updating at the
// step's end, bit for bit; updates are spans of the trace ("update") that count as compute in
// the exposed measure (Note [Exposed all-to-all] in device_streams.h). The planner models the
// same (Note [Deferred update in the plan] in schedule/simulator.cc).
// Whatever reads the weights between steps (checkpoints, tests, moving experts) finishes the
// update first: stages() does, and so does move_experts.
#include <algorithm>
#include <string>

#include "runtime/distributed.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#endif

namespace tandem::runtime {

std::vector<int64_t> node_weight_ends(const model::Parameters& params,
                                      const std::vector<model::NodeRef>& nodes) {
  const int64_t layer_begin = params.spec().layer_begin;
  const auto layers = static_cast<size_t>(params.spec().layer_end - layer_begin);
  int64_t embed = 0;
  std::vector<int64_t> attention(layers, 0), ffn(layers, 0);
  const std::string prefix = "model.layers.";
  for (const model::ParamEntry& e : params.entries()) {
    const int64_t end = e.offset + shape_numel(e.shape);
    if (e.name.rfind(prefix, 0) == 0) {
      const auto l = static_cast<size_t>(std::stoll(e.name.substr(prefix.size())) - layer_begin);
      TANDEM_ASSERT(l < layers, "weight ", e.name, " outside the chunk's layers");
      const bool is_ffn = e.name.find(".mlp.") != std::string::npos ||
                          e.name.find(".experts.") != std::string::npos;
      int64_t& slot = is_ffn ? ffn[l] : attention[l];
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
      case NodeKind::kEmbed: upto = std::max(upto, embed); break;
      case NodeKind::kAttention: upto = std::max(upto, attention[l]); break;
      case NodeKind::kExperts:
      case NodeKind::kMlp: upto = std::max({upto, attention[l], ffn[l]}); break;
      case NodeKind::kLoss: upto = params.numel(); break;
      default: break;  // dispatch and combine read no weights
    }
    ends.push_back(upto);
  }
  return ends;
}

void PipelineTrainer::update_weights(StageRuntime& s, int64_t end, int half) {
  AdamW& opt = *s.optimizer;
  if (end <= opt.updated_until()) return;
  if (!dev_) {
    opt.update_until(end);
    return;
  }
#if TANDEM_WITH_CUDA
  DeviceStreams& d = *dev_;
  const DeviceStream stream = d.compute_of(half);
  cuda::StreamScope on(stream);
  const DeviceEvent begin = d.begin(stream);
  const int64_t from = opt.updated_until();
  opt.update_until(end);
  DeviceStreams::SpanInfo info;
  info.track = half ? "compute2" : "compute";
  info.name = "update " + std::to_string(s.stage) + " [" + std::to_string(from) + ", " +
              std::to_string(end) + ")";
  info.busy = true;
  info.weights = end - from;
  d.end(stream, begin, std::move(info));
#else
  (void)half;
#endif
}

void PipelineTrainer::finish_updates() {
  DeviceScope on(train_.device);
  for (StageRuntime& s : stages_) update_weights(s, s.params->numel());
}

void PipelineTrainer::forward_beside_update_on_device(StageRuntime& s,
                                                       model::MicroBatchState& state,
                                                       int32_t mb) {
  const model::NodeContext c = context(s);
  const std::vector<model::NodeRef>& nodes = s.chunk->nodes();
  const size_t n = nodes.size();
  const std::vector<int64_t>& ends = s.weight_ends;
  auto is_comm = [&](size_t i) { return schedule::node_is_communication(nodes[i].kind); };
  const DeviceStream compute = DeviceStreams::compute();
  DeviceChain chain{compute, dev_->mark(compute)};
  for (size_t i = 0; i < n; ++i) {
    if (!is_comm(i)) {
      update_weights(s, ends[i]);
      issue_node_on_device(s, state, c, i, schedule::ActionKind::kForward, mb, true, chain);
      continue;
    }
    // The dispatch's counts go first (Note [Counts ahead of the rows] in moe_exchange.cc), so
    // the host, waiting for them inside the dispatch, has the update queued already.
    if (nodes[i].kind == NodeKind::kDispatch) prepare_node_on_device(s, state, c, i, mb, chain);
    // Beside the all-to-all: the planner's rule (schedule/pipeline_model.h).
    update_weights(s, schedule::update_beside_all_to_all(ends, i, s.params->numel(), is_comm));
    issue_node_on_device(s, state, c, i, schedule::ActionKind::kForward, mb, true, chain);
  }
  join_chain(chain, "F" + std::to_string(mb));
}

}  // namespace tandem::runtime
