// Combined 1F1B: one micro-batch's forward and another's backward (an FB pair), or two forwards
// (an FF pair), issued layer pair by layer pair on the compute and communication streams.
//
// Note [Combined 1F1B on streams]: for a MoE layer pair (forward layer i of f, backward layer
// n-1-i of b) each stream runs, in order:
//   comm: combine.bwd(b) | dispatch.fwd(f) -> dispatch.bwd(b) | combine.fwd(f)
//   comp: attention.fwd(f) | experts.bwd(b) -> experts.bwd_w(b) -> experts.fwd(f) |
//         attention.bwd(b)
// Each node waits only for the event of the node whose output it reads (its predecessor in its
// own micro-batch), so f's attention runs while b's combine all-to-all is in flight, and so on.
// A parameter's gradient is still accumulated micro-batch by micro-batch in the same order, so
// results are bitwise those of running F then B.
//
// Note [Issue order]: results depend only on each stream's own order; the host may issue the two
// streams' nodes in any interleaving that records an event before issuing a wait for it. The
// host blocks in two places: attention.fwd(f) reads the router's counts, and dispatch.fwd(f) the
// counts the other ranks send (Note [Routing counts on the host]). Issued in the streams' order,
// the host would wait for f's counts (behind combine.bwd(b) on the communication stream) with
// nothing queued on the compute stream. So with overlap experts.bwd(b) is issued before
// dispatch.fwd(f): the compute stream has b's experts queued while the host waits. Where the
// host issues ahead (the GPU) the exchange of f's counts also goes right after attention.fwd(f)
// (Note [Counts ahead of the rows] in model/moe_exchange.cc), so the host seldom waits at all;
// the CPU's worker runs each dispatch whole. On one stream (no overlap) the issue order is the
// run order, the one the planner's memory model follows.
//
// Note [A stream pair per half]: with one communication stream, an all-to-all that waits for a
// slower expert rank (Note [Waiting for the slowest expert rank]) holds up every all-to-all
// queued behind it, the other micro-batch's too. Under CommOverlap::kSplit (GPU only) the pair's
// second half runs on a compute and a communication stream of its own, its all-to-alls through a
// second NCCL communicator of the expert group (Groups::ep2_dev), so a half waiting for the
// slower rank leaves the other free to go on; each communicator still sees its operations in the
// same order on every rank. The halves share only the weights, which they read; of the
// gradients, the forward half adds the LM head's (Note [Loss gradient in the forward]) and the
// backward half all the others, each micro-batch in order, so results are bitwise those of kOn
// and kOff. Each compute stream forks its experts' products onto lanes of its own (Note [Lanes]).
//
// Note [Tied gradient in a pair]: with tied embeddings on one stage (Note [Tied embeddings] in
// model/parameters.h) the LM head's gradient is the embedding's, which both halves of a pair
// write: f's loss node (the head's, Note [Loss gradient in the forward]) and b's loss node (the
// MTP modules' lookups) and embed node. On one compute stream the issue order is b's loss, f's
// loss, b's embed. Under CommOverlap::kSplit the halves run on streams of their own, so f's loss
// waits for b's chain so far and b's embed for f's loss: the same order, so the same values, and
// no two writes at once.
//
// Note [Weight gradients off the chain]: a node's weight gradient is read by nothing later in the
// step but the optimizer, so with overlap on the GPU its successor's event is recorded after the
// node's input gradient: the weight gradient follows on the compute stream while the successor's
// all-to-all is in flight (experts.bwd_w beside dispatch.bwd, attention.bwd_w beside the next
// layer's combine.bwd). Inside a pair, dispatch.bwd(b) then waits for b's input gradient only.
// The simulator assumes the same (a backward node's successor starts at the end of its input
// gradient). Each stream's order, so every result, is unchanged. On the CPU the weight gradient
// stays on the chain: a free there is immediate, not in stream order, so nothing may run beside
// a node that could free what it reads.
//
// Note [The unpaired backward's all-to-all]: combined 1F1B pairs F(i+1) with B(i); a backward
// with no partner (the last one with one stage, and the cool-down's) runs as a plain action. On
// the GPU with overlap and EP > 1 it still puts its dispatch and combine on the communication
// stream, as one chain: by Note [Weight gradients off the chain] each all-to-all then overlaps
// the weight gradients of the node before it. The first forward has nothing to overlap but the
// deferred update (Note [The update beside the first forward] in deferred_update.cc).
//
// Note [Nodes on the communication stream]: the caching allocator hands a block out again on its
// own stream at once when it is freed there (cuda_allocator.cc), and records the freeing
// stream's use otherwise. A node on the communication stream reads tensors the compute stream
// made (the routed rows, the experts' outputs, the layer's output gradient); if the compute
// stream freed one of them later, its block could be reused by the compute stream while the
// all-to-all still reads it. So after issuing such a node, every tensor its layer still holds
// is recorded as used by the communication stream (PyTorch's record_stream); the tensors the
// node itself dropped were freed with the communication stream current, which records it too.
#include <algorithm>
#include <utility>
#include <vector>

#include "runtime/stream_executor.h"

namespace tandem::runtime {

using schedule::ActionKind;

namespace {

// Node index ranges of a chunk: the leading embed, each layer, the trailing loss.
struct Units {
  std::vector<std::pair<size_t, size_t>> layers;  // [begin, end) per layer
  bool has_embed = false, has_loss = false;
  size_t num_nodes = 0;
};

Units split_units(const std::vector<model::NodeRef>& nodes) {
  Units u;
  u.num_nodes = nodes.size();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].kind == NodeKind::kEmbed) {
      u.has_embed = true;
    } else if (nodes[i].kind == NodeKind::kLoss) {
      u.has_loss = true;
    } else if (nodes[i].kind == NodeKind::kAttention) {
      u.layers.push_back({i, i + 1});
    } else {
      u.layers.back().second = i + 1;
    }
  }
  return u;
}

// Note [Shared expert in a pair] (planner/simulator.cc): a MoE layer with a shared expert,
// attention fa .. combine fa + 4. The shared experts hang off their half's chain: fork(k) is
// the chain now, beside(k, i, chain) issues node i after that chain without moving the half's.
template <typename Issue, typename Prepare, typename Fork, typename Beside>
void issue_shared_pair(size_t fa, size_t ba, Issue& issue, Prepare& prepare, Fork& fork,
                       Beside& beside, bool overlapped) {
  constexpr int f = 0, b = 1;
  issue(b, ba + 4);  // combine.bwd(b)
  issue(f, fa);      // attention.fwd(f)
  const auto after_attention = fork(f);
  if (overlapped) prepare(f, fa + 1);  // dispatch.fwd(f)'s counts: Note [Issue order]
  if (overlapped) issue(b, ba + 3);    // experts.bwd(b) first: Note [Issue order]
  issue(f, fa + 1);                    // dispatch.fwd(f)
  if (!overlapped) issue(b, ba + 3);   // experts.bwd(b) (+ weights)
  beside(b, ba + 2, fork(b));          // shared.bwd(b), beside dispatch.fwd(f)
  beside(f, fa + 2, after_attention);  // shared.fwd(f), beside dispatch.bwd(b)
  issue(b, ba + 1);                    // dispatch.bwd(b)
  issue(f, fa + 3);                    // experts.fwd(f)
  issue(f, fa + 4);                    // combine.fwd(f)
  issue(b, ba);                        // attention.bwd(b) (+ weights)
}

template <typename Issue, typename Prepare, typename Fork, typename Beside, typename Order>
void issue_pairs(const Units& fu, const Units& bu, Issue& issue, Prepare& prepare, Fork& fork,
                 Beside& beside, Order& order, bool overlapped) {
  constexpr int f = 0, b = 1;
  if (bu.has_loss) issue(b, bu.num_nodes - 1);
  if (fu.has_embed) issue(f, 0);
  const size_t pairs = std::max(fu.layers.size(), bu.layers.size());
  for (size_t p = 0; p < pairs; ++p) {
    const bool has_f = p < fu.layers.size(), has_b = p < bu.layers.size();
    const size_t bl = bu.layers.size() - 1 - p;
    if (has_f && has_b && fu.layers[p].second - fu.layers[p].first == 5 &&
        bu.layers[bl].second - bu.layers[bl].first == 5) {
      issue_shared_pair(fu.layers[p].first, bu.layers[bl].first, issue, prepare, fork, beside,
                        overlapped);
      continue;
    }
    if (has_f && has_b && fu.layers[p].second - fu.layers[p].first == 4 &&
        bu.layers[bl].second - bu.layers[bl].first == 4) {
      const size_t fa = fu.layers[p].first, ba = bu.layers[bl].first;  // attention indices
      issue(b, ba + 3);                                                // combine.bwd(b)
      issue(f, fa);                                                    // attention.fwd(f)
      if (overlapped) prepare(f, fa + 1);  // dispatch.fwd(f)'s counts: Note [Issue order]
      if (overlapped) issue(b, ba + 2);    // experts.bwd(b) first: Note [Issue order]
      issue(f, fa + 1);                    // dispatch.fwd(f)
      if (!overlapped) issue(b, ba + 2);   // experts.bwd(b) (+ weights)
      issue(b, ba + 1);                    // dispatch.bwd(b)
      issue(f, fa + 2);                    // experts.fwd(f)
      issue(f, fa + 3);                    // combine.fwd(f)
      issue(b, ba);                        // attention.bwd(b) (+ weights)
      continue;
    }
    if (has_f && has_b && fu.layers[p].second - fu.layers[p].first == 2 &&
        bu.layers[bl].second - bu.layers[bl].first == 2) {
      // Two dense layers (attention, MLP) as the planner pairs them (kPairDense in
      // planner/simulator.cc): b's MLP backward frees its activations before f's MLP forward.
      const size_t fa = fu.layers[p].first, ba = bu.layers[bl].first;
      issue(f, fa);      // attention.fwd(f)
      issue(b, ba + 1);  // mlp.bwd(b) (+ weights)
      issue(f, fa + 1);  // mlp.fwd(f)
      issue(b, ba);      // attention.bwd(b) (+ weights)
      continue;
    }
    if (has_f) {
      for (size_t i = fu.layers[p].first; i < fu.layers[p].second; ++i) issue(f, i);
    }
    if (has_b) {
      for (size_t i = bu.layers[bl].second; i-- > bu.layers[bl].first;) issue(b, i);
    }
  }
  // Note [Tied gradient in a pair]: the head's gradient after b's, the embedding's after f's.
  if (fu.has_loss) order(f, b);
  if (fu.has_loss) issue(f, fu.num_nodes - 1);
  if (bu.has_embed) order(b, f);
  if (bu.has_embed) issue(b, 0);
}

// Note [Paired forwards on streams]: two forwards f (half 0) and g (half 1), layer by layer:
//   comp: attention(f) | attention(g) | experts(f) | experts(g)
//   comm: dispatch(f)  | dispatch(g)  | combine(f) | combine(g)
// so f's dispatch runs beside g's attention, g's beside f's experts, f's combine beside g's
// experts and g's combine beside the next layer's attention(f). As in Note [Issue order], each
// dispatch's counts go out right after its attention, and the host blocks (for them) only with
// the other forward's work queued on the compute stream: attention(g) when it reads f's, and
// experts(f) when it reads g's. Each stream's order, and so every value, is that of f then g.
template <typename Issue, typename Prepare>
void issue_forward_pairs(const Units& u0, const Units& u1, Issue& issue, Prepare& prepare,
                         bool overlapped) {
  constexpr int f = 0, g = 1;
  if (u0.has_embed) issue(f, 0);
  if (u1.has_embed) issue(g, 0);
  const size_t layers = std::max(u0.layers.size(), u1.layers.size());
  for (size_t p = 0; p < layers; ++p) {
    const bool has_f = p < u0.layers.size(), has_g = p < u1.layers.size();
    if (has_f && has_g && u0.layers[p].second - u0.layers[p].first == 4 &&
        u1.layers[p].second - u1.layers[p].first == 4) {
      const size_t fa = u0.layers[p].first, ga = u1.layers[p].first;  // attention indices
      issue(f, fa);                                                   // attention(f)
      if (overlapped) prepare(f, fa + 1);                             // dispatch(f)'s counts
      issue(g, ga);                                                   // attention(g)
      issue(f, fa + 1);                                               // dispatch(f)
      if (overlapped) prepare(g, ga + 1);                             // dispatch(g)'s counts
      issue(f, fa + 2);                                               // experts(f)
      issue(g, ga + 1);                                               // dispatch(g)
      issue(g, ga + 2);                                               // experts(g)
      issue(f, fa + 3);                                               // combine(f)
      issue(g, ga + 3);                                               // combine(g)
      continue;
    }
    if (has_f) {
      for (size_t i = u0.layers[p].first; i < u0.layers[p].second; ++i) issue(f, i);
    }
    if (has_g) {
      for (size_t i = u1.layers[p].first; i < u1.layers[p].second; ++i) issue(g, i);
    }
  }
  if (u0.has_loss) issue(f, u0.num_nodes - 1);
  if (u1.has_loss) issue(g, u1.num_nodes - 1);
}

}  // namespace

void StreamExecutor::run_pair(ActionKind kind, std::array<NodeWork, 2>& h) {
  const bool overlap = overlaps();
  // Note [A stream pair per half]: the second half's all-to-alls go through the second expert
  // group.
  const bool split = overlap && overlap_ == CommOverlap::kSplit;
  if (split) h[1].context.ep = &groups_->ep2_data();
  // Note [The update beside the first forward]: a second compute stream would read weights
  // updated on the first without waiting for them; what the halves read is updated first.
  // Note [Weights gathered beside the forward] (distributed_optimizer.cc): so are the weights
  // still to be gathered, before the communication thread may run.
  for (const NodeWork& half : h) {
    if (split || half.stage->shards) deferred_->update(*half.stage, half.stage->params->numel());
  }
  // Both micro-batches' chains start after everything issued so far on the compute stream
  // (their inputs are there).
  const StreamEvent start = streams_->mark(StreamId::kCompute);
  Chain chains[2] = {{StreamId::kCompute, start}, {StreamId::kCompute, start}};
  const bool counts_ahead = streams_->issues_ahead();  // Note [Issue order]
  auto issue = [&](int k, size_t i) { issue_node(h[k], i, overlap, chains[k], split ? k : 0); };
  auto fork = [&](int k) { return chains[k]; };
  auto beside = [&](int k, size_t i, Chain from) {
    issue_node(h[k], i, overlap, from, split ? k : 0);
  };
  auto prepare = [&](int k, size_t i) {
    if (counts_ahead) prepare_node(h[k], i, chains[k], split ? k : 0);
  };
  // Note [Tied gradient in a pair].
  const bool shared_gradient =
      split && h[0].stage == h[1].stage && h[0].stage->params->config().tied_embeddings();
  auto order = [&](int k, int after) {
    if (!shared_gradient || chains[after].stream == compute_stream(k)) return;
    streams_->wait(compute_stream(k), chains[after].done, chains[after].stream, "tied embedding");
  };
  const Units u0 = split_units(h[0].stage->chunk->nodes());
  const Units u1 = split_units(h[1].stage->chunk->nodes());
  try {
    if (kind == ActionKind::kForwardForward) {
      issue_forward_pairs(u0, u1, issue, prepare, overlap);
    } else {
      issue_pairs(u0, u1, issue, prepare, fork, beside, order, overlap);
    }
    // What follows runs on the compute stream and reads both micro-batches' results.
    for (const Chain& chain : chains) join(chain, "combined");
  } catch (...) {
    streams_->join_workers(/*quietly=*/true);
    throw;
  }
  streams_->join_workers();
}

}  // namespace tandem::runtime
