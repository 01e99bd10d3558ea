// Combined 1F1B on two CPU streams (Note [Combined 1F1B on streams]): one micro-batch's forward
// and another's backward issued layer pair by layer pair, dispatch and combine on the
// communication stream (a worker thread), the rest on the compute stream (this thread); a pair
// of forwards the same way (Note [Paired forwards on streams]).
//
// Note [Combined 1F1B on streams]: for a MoE layer pair (forward layer i of f, backward layer
// n-1-i of b) the issue order is docs/design.md "Combined 1F1B":
//   comm: combine.bwd(b) | dispatch.fwd(f) -> dispatch.bwd(b) | combine.fwd(f)
//   comp: attention.fwd(f) | experts.bwd(b) -> experts.bwd_w(b) -> experts.fwd(f) |
//   attention.bwd(b)
// Each node waits only for the event of the node whose output it reads (its predecessor in its
// own micro-batch), so f's attention runs while b's combine all-to-all is in flight, and so on.
//
// Note [Issue order]: what matters to the results is each stream's own order; the host may issue
// the two streams' nodes in any interleaving that records an event before issuing a wait for it.
// The host does block in two places: attention.fwd(f) reads the router's counts, and
// dispatch.fwd(f) the counts the other ranks send (Note [Routing counts on the host]). Issued as
// design.md lists them, the host would wait for f's received counts (behind combine.bwd(b) on the
// communication stream) with nothing queued on the compute stream after attention.fwd(f): the
// GPU idled for the whole combine.bwd(b) and counts exchange, on every layer pair (about 20 ms a
// step in a 2-GPU EP trace). So experts.bwd(b) is issued before dispatch.fwd(f): the compute
// stream has b's experts queued (waiting for combine.bwd(b), the overlap itself) while the host
// waits for f's counts. And on the GPU the exchange of f's counts is issued before that, right
// after attention.fwd(f) (Note [Counts ahead of the rows] in model/moe_exchange.cc): it runs
// while the host issues b's experts, so the host seldom waits for it at all, and f's rows leave
// as soon as the communication stream is free. Per stream the order is design.md's, so results
// are unchanged. On one stream (no overlap) the issue order is the run order, and stays
// design.md's, the order the planner's memory model follows (the memory-truth tests, which run
// without overlap).
// The gradient of a parameter is still accumulated micro-batch by micro-batch in the same order,
// so results are bitwise those of running F then B.
//
// On the GPU (run_combined_on_device) the same issue order goes to two CUDA streams from this
// one thread: dispatch and combine on the high-priority communication stream, the rest on the
// compute stream; an event after each node is the data edge its successor in the same
// micro-batch waits on (the other micro-batch's nodes never wait for it).
//
// Note [A stream pair per half]: with one communication stream, an all-to-all that waits for a
// slower expert rank (uneven routing, Note [Waiting for the slowest expert rank]) holds up every
// all-to-all queued behind it, the other micro-batch's too, and with them that micro-batch's next
// layer. Under CommOverlap::kSplit (GPU only) the pair's second half runs on a compute stream
// and a communication stream of its own, its all-to-alls through a second NCCL communicator of
// the expert group (Groups::ep2_dev): a half waiting for the slower rank leaves the other half
// free to go on. Each communicator still sees its operations in the same order on every rank
// (the host issues the same order everywhere). The halves share only the weights, which they
// read; of the gradients, the forward half adds the LM head's
// (Note [Loss gradient in the forward]) and the backward half all the others, each micro-batch in
// order, so results are bitwise those of kOn and kOff. Each compute stream forks its experts'
// products onto lanes of its own (Note [Lanes]).
//
// Note [Weight gradients off the chain]: a node's weight gradient is read by nothing later in
// the step but the optimizer, so when the streams overlap its successor's event is recorded
// after the node's input gradient, before its weight gradient: the weight gradient follows on
// the compute stream and runs while the successor's all-to-all is in flight (experts.bwd_w
// beside dispatch.bwd, attention.bwd_w beside the next layer's combine.bwd, the LM head's beside
// the last layer's combine.bwd). This holds inside a combined pair too, where it matters most:
// dispatch.bwd(b) no longer waits for b's expert weight gradients, so it is covered by them and
// by experts.fwd(f), not by experts.fwd(f) alone, and an expert rank with more rows than its
// peer keeps the peer waiting for its input gradient only. On 2 H200s (shape (b), EP2, random
// tokens, two runs each in one call) the exposed all-to-all went from 9.7 / 11.5% and 9.9 /
// 10.4% (rank 0 / 1, weights on the chain) to 9.0 / 8.3% and 8.9 / 9.0%, tokens/s +0.5%. (An
// earlier version had kept them on the chain inside pairs: beside the all-to-all they took
// 10-40% longer. They do, but the chain is shorter. Deferring them to after experts.fwd(f)
// instead left dispatch.fwd(f) less cover and measured worse: 9.7-10.4 / 12.5-13.3%.) It is
// also what the simulator has always assumed (a backward node's successor starts at the end of
// its input gradient). Each stream's order, so every result, is unchanged either way.
//
// Note [The unpaired backward's all-to-all]: combined 1F1B pairs F(i+1) with B(i); on a rank
// whose schedule has no partner for some backward (the last one with one stage, and the
// cool-down's), that backward runs as a plain action. On the GPU with overlap and EP > 1 it
// still puts its dispatch and combine on the communication stream, as one chain: by Note
// [Weight gradients off the chain] each all-to-all then overlaps the weight gradients of the node
// before it. (In order, the last backward's all-to-all was about half of the exposed time of an
// EP2 step with 8 micro-batches a rank.) The first forward has nothing to overlap with: each of
// its nodes reads the one before.
//
// Note [Nodes on the communication stream]: the caching allocator hands a block out again on its
// own stream at once when it is freed there (cuda_allocator.cc), and records the freeing
// stream's use otherwise. A node on the communication stream reads tensors the compute stream
// made (the routed rows, the experts' outputs, the layer's output gradient); if the compute
// stream freed one of them later, its block could be reused by the compute stream while the
// all-to-all still reads it. So after issuing such a node, every tensor its layer still holds
// is recorded as used by the communication stream (PyTorch's record_stream); the tensors the
// node itself dropped were freed with the communication stream current, which records it too.
#include <chrono>

#include "runtime/distributed.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#include "core/cuda/cuda_allocator.h"
#endif

namespace tandem::runtime {

using schedule::ActionKind;

// Node index ranges of a chunk: the leading embed, each layer, the trailing loss.
struct Units {
  std::vector<std::pair<size_t, size_t>> layers;  // [begin, end) per layer
  bool has_embed = false, has_loss = false;
  size_t num_nodes = 0;
};

static Units split_units(const std::vector<model::NodeRef>& nodes) {
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

PipelineTrainer::PairHalves PipelineTrainer::prepare_pair(const schedule::Action& a,
                                                          int64_t iteration) {
  auto half = [&](const schedule::Action& x) -> PairHalf {
    StageRuntime& s = local(x.stage);
    model::MicroBatchState& m = x.kind == ActionKind::kForward
                                    ? prepare_forward(x.stage, x.microbatch, iteration)
                                    : prepare_backward(x.stage, x.microbatch);
    return {x, &s, &m, context(s)};
  };
  // In the order the plain actions would prepare them: the forward's input first.
  PairHalf first = half(a.first_half());
  return {std::move(first), half(a.second_half())};
}

void PipelineTrainer::run_combined(const schedule::Action& a, int64_t iteration) {
  if (dev_) {
    run_combined_on_device(a, iteration);
    return;
  }
  const PairHalves h = prepare_pair(a, iteration);
  const bool overlap = comm_stream_ != nullptr && groups_->layout.ep > 1;
  CpuStream& comp = *compute_stream_;
  Event last[2];
  auto issue = [&](int k, size_t i) {
    const PairHalf& half = h[k];
    const NodeKind kind = half.stage->chunk->nodes()[i].kind;
    CpuStream& stream = overlap && schedule::node_is_communication(kind) ? *comm_stream_ : comp;
    last[k] = stream.enqueue(
        [&half, i, kind, is_comm = &stream != &comp, this] {
          const auto t0 = std::chrono::steady_clock::now();
          const bool fwd = half.action.kind == ActionKind::kForward;
          // Note [The update beside the first forward] (deferred_update.cc); none for the
          // all-to-all, which reads no weights.
          if (!is_comm) {
            update_weights(*half.stage, fwd ? half.stage->weight_ends[i]
                                            : half.stage->params->numel());
          }
          if (fwd) {
            half.stage->chunk->forward_node(i, *half.state, half.context);
          } else {
            half.stage->chunk->backward_node(i, *half.state, half.context);
            if (half.action.kind == ActionKind::kBackward)
              half.stage->chunk->backward_weights_node(i, *half.state, half.context);
          }
          record_span(is_comm ? "comm" : "compute", kind, fwd, half.action.microbatch, t0);
        },
        {last[k]});
    // Reduced after the pair, once both streams are done
    // (Note [Gradients reduced beside the backward]).
    if (half.action.kind == ActionKind::kBackward) weight_grad_issued(*half.stage, i);
  };
  auto prepare = [](int, size_t) {};  // the comm worker runs each dispatch whole
  try {
    issue_pair_nodes(a, h, issue, prepare, overlap);
  } catch (...) {
    // The comm worker may still run tasks that refer to this frame: let them finish first.
    if (comm_stream_) {
      try {
        comm_stream_->synchronize();
      } catch (...) {
      }
    }
    throw;
  }
  if (comm_stream_) comm_stream_->synchronize();
  comp.synchronize();
  finish_pair_forwards(h);
}

void PipelineTrainer::run_combined_on_device(const schedule::Action& a, int64_t iteration) {
  PairHalves h = prepare_pair(a, iteration);
  const bool overlap = overlap_ != CommOverlap::kOff && groups_->layout.ep > 1;
  // Note [A stream pair per half]: the second half's all-to-alls go through the second expert
  // group.
  const bool split = overlap && overlap_ == CommOverlap::kSplit;
  if (split) h[1].context.ep = &groups_->ep2_data();
  // Note [The update beside the first forward]: a second compute stream would read weights
  // updated on the first without waiting for them; what the halves read is updated first.
  if (split) {
    for (const PairHalf& half : h) update_weights(*half.stage, half.stage->params->numel());
  }
  // Both micro-batches' chains start after everything enqueued so far on the compute stream
  // (their inputs are there).
  const DeviceStream compute = DeviceStreams::compute();
  DeviceChain chains[2] = {{compute, dev_->mark(compute)}, {compute, nullptr}};
  chains[1].done = chains[0].done;
  auto issue = [&](int k, size_t i) {
    const PairHalf& half = h[k];
    issue_node_on_device(*half.stage, *half.state, half.context, i, half.action.kind,
                         half.action.microbatch, overlap, chains[k], split ? k : 0);
  };
  auto prepare = [&](int k, size_t i) {
    const PairHalf& half = h[k];
    prepare_node_on_device(*half.stage, *half.state, half.context, i, half.action.microbatch,
                           chains[k], split ? k : 0);
  };
  issue_pair_nodes(a, h, issue, prepare, overlap);
  // What follows runs on the compute stream and reads both micro-batches' results.
  for (DeviceChain& chain : chains) join_chain(chain, "combined");
  finish_pair_forwards(h);
}

void PipelineTrainer::finish_pair_forwards(const PairHalves& h) {
  for (const PairHalf& half : h) {
    if (half.action.kind == ActionKind::kForward)
      finish_forward(*half.stage, half.action.microbatch, *half.state);
  }
}

void PipelineTrainer::issue_node_on_device(StageRuntime& s, model::MicroBatchState& state,
                                           const model::NodeContext& c, size_t i,
                                           ActionKind kind, int32_t mb, bool overlap,
                                           DeviceChain& chain, int half) {
#if TANDEM_WITH_CUDA
  const auto host_begin = std::chrono::steady_clock::now();
  DeviceStreams& d = *dev_;
  const model::NodeRef node = s.chunk->nodes()[i];
  // A weight-gradient action has nothing to do for a node without weights.
  if (kind == ActionKind::kBackwardWeight && !schedule::node_has_weights(node.kind)) return;
  const bool on_comm = overlap && schedule::node_is_communication(node.kind);
  const DeviceStream stream = on_comm ? d.comm(half) : d.compute_of(half);
  const char* letter = kind == ActionKind::kForward ? "F" : "B";
  // Note [The update beside the first forward] (deferred_update.cc): the weights this node
  // reads, on its compute stream before it (and before its wait for the chain).
  if (!on_comm) {
    update_weights(s, kind == ActionKind::kForward ? s.weight_ends[i] : s.params->numel(), half);
  }
  if (chain.stream != stream) {
    d.wait_measured(stream, chain.done, chain.stream,
                    letter + std::to_string(mb) + " " + std::string(node_kind_name(node.kind)));
  }
  cuda::StreamScope on(stream);
  auto timed = [&](NodePhase phase, auto&& run) {
    const DeviceEvent begin = d.begin(stream);
    run();
    d.end(stream, begin, node_span(node.kind, phase, mb, on_comm, half));
  };
  switch (kind) {
    case ActionKind::kForward:
      timed(NodePhase::kForward, [&] { s.chunk->forward_node(i, state, c); });
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      timed(NodePhase::kBackwardInput, [&] { s.chunk->backward_node(i, state, c); });
      break;
    default: break;
  }
  if (on_comm && node.layer >= 0) record_on_comm(state.layers[node.layer], half);
  // Note [Weight gradients off the chain]
  const bool with_w = kind == ActionKind::kBackward || kind == ActionKind::kBackwardWeight;
  const bool weights = with_w && schedule::node_has_weights(node.kind);
  if (!overlap && weights) {
    timed(NodePhase::kBackwardWeight, [&] { s.chunk->backward_weights_node(i, state, c); });
    weight_grad_issued(s, i, stream);  // Note [Gradients reduced beside the backward]
  }
  chain = {stream, d.mark(stream)};
  if (overlap && weights) {
    timed(NodePhase::kBackwardWeight, [&] { s.chunk->backward_weights_node(i, state, c); });
    weight_grad_issued(s, i, stream);
  }
  d.host_span(std::string(kind == ActionKind::kBackwardWeight ? "W" : letter) +
                  std::to_string(mb) + " " + std::string(node_kind_name(node.kind)),
              host_begin, std::chrono::steady_clock::now());
#else
  (void)s, (void)state, (void)c, (void)i, (void)kind, (void)mb, (void)overlap;
  (void)chain, (void)half;
#endif
}

// Note [Nodes on the communication stream].
void PipelineTrainer::record_on_comm(const model::LayerActs& layer, int half) {
#if TANDEM_WITH_CUDA
  for (const Tensor* t : model::all_tensors(layer)) {
    if (t->defined() && !t->released() && t->device() == Device::kCUDA) {
      cuda::record_stream(*t, dev_->comm(half));
    }
  }
#else
  (void)layer, (void)half;
#endif
}

void PipelineTrainer::prepare_node_on_device(StageRuntime& s, model::MicroBatchState& state,
                                             const model::NodeContext& c, size_t i, int32_t mb,
                                             DeviceChain& chain, int half) {
#if TANDEM_WITH_CUDA
  const auto host_begin = std::chrono::steady_clock::now();
  DeviceStreams& d = *dev_;
  const model::NodeRef node = s.chunk->nodes()[i];
  const DeviceStream comm = d.comm(half);
  if (chain.stream != comm) d.wait(comm, chain.done);
  cuda::StreamScope on(comm);
  const DeviceEvent begin = d.begin(comm);
  s.chunk->prepare_forward_node(i, state, c);
  DeviceStreams::SpanInfo info = node_span(node.kind, NodePhase::kForward, mb, true, half);
  info.name += " counts";
  info.part = true;  // the dispatch's own span follows: one node, one count
  const std::string name = info.name;
  d.end(comm, begin, std::move(info));
  if (node.layer >= 0) record_on_comm(state.layers[node.layer], half);
  chain = {comm, d.mark(comm)};
  d.host_span(name, host_begin, std::chrono::steady_clock::now());
#else
  (void)s, (void)state, (void)c, (void)i, (void)mb, (void)chain, (void)half;
#endif
}

void PipelineTrainer::join_chain(const DeviceChain& chain, const std::string& what) {
  const DeviceStream compute = DeviceStreams::compute();
  if (chain.stream != compute) dev_->wait_measured(compute, chain.done, chain.stream, what);
}

template <typename Issue, typename Prepare>
void PipelineTrainer::issue_pair_nodes(const schedule::Action& a, const PairHalves& h,
                                       Issue& issue, Prepare& prepare, bool overlapped) {
  const Units u0 = split_units(h[0].stage->chunk->nodes());
  const Units u1 = split_units(h[1].stage->chunk->nodes());
  if (a.kind == ActionKind::kForwardForward) {
    issue_forward_pairs(u0, u1, issue, prepare, overlapped);
  } else {
    issue_pairs(u0, u1, issue, prepare, overlapped);
  }
}

template <typename Issue, typename Prepare>
void PipelineTrainer::issue_pairs(const Units& fu, const Units& bu, Issue& issue, Prepare& prepare,
                                  bool overlapped) {
  constexpr int f = 0, b = 1;
  if (bu.has_loss) issue(b, bu.num_nodes - 1);
  if (fu.has_embed) issue(f, 0);
  const size_t pairs = std::max(fu.layers.size(), bu.layers.size());
  for (size_t p = 0; p < pairs; ++p) {
    const bool has_f = p < fu.layers.size(), has_b = p < bu.layers.size();
    const size_t bl = bu.layers.size() - 1 - p;
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
    if (has_f) {
      for (size_t i = fu.layers[p].first; i < fu.layers[p].second; ++i) issue(f, i);
    }
    if (has_b) {
      for (size_t i = bu.layers[bl].second; i-- > bu.layers[bl].first;) issue(b, i);
    }
  }
  if (fu.has_loss) issue(f, fu.num_nodes - 1);
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
void PipelineTrainer::issue_forward_pairs(const Units& u0, const Units& u1, Issue& issue,
                                          Prepare& prepare, bool overlapped) {
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

}  // namespace tandem::runtime
