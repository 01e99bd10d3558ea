// dispatch and combine: the expert all-to-all pair. Rows leave attention in expert-sorted order
// (experts ascending), so each destination's rows are one block; they arrive source-major
// ([source rank][local expert]) and the experts want them expert-major ([local expert][source]).
// With one expert rank both nodes only hand tensors over.
#include <algorithm>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/nodes.h"
#include "ops/ops.h"

namespace tandem::model {
namespace {

enum class BlockOrder : uint8_t { kSourceToExpert, kExpertToSource };

// Copies the row blocks (source s, local expert e) of `in` into `out`, from source-major to
// expert-major order or back, in one op. c: the rows received per block, [P * el], source-major.
void reorder_blocks(const Tensor& out, const Tensor& in, const std::vector<int32_t>& c, int64_t p,
                    int64_t el, BlockOrder order) {
  std::vector<int64_t> src_major(static_cast<size_t>(p * el)), exp_major(src_major.size());
  int64_t off = 0;
  for (int64_t i = 0; i < p * el; ++i) src_major[i] = std::exchange(off, off + c[i]);
  off = 0;
  for (int64_t e = 0; e < el; ++e) {
    for (int64_t s = 0; s < p; ++s) exp_major[s * el + e] = std::exchange(off, off + c[s * el + e]);
  }
  const bool to_expert = order == BlockOrder::kSourceToExpert;
  std::vector<ops::RowBlock> blocks;
  for (int64_t i = 0; i < p * el; ++i) {
    if (c[i] == 0) continue;
    blocks.push_back(
        {to_expert ? src_major[i] : exp_major[i], to_expert ? exp_major[i] : src_major[i], c[i]});
  }
  ops::copy_row_blocks(out, in, blocks);
}

// Rows this rank sends to each peer (its routed rows for the peer's experts) and receives from
// each peer (the peer's rows for this rank's experts), and the received rows per (source,
// local expert) block, from the host copies of the counts (Note [Routing counts on the host]).
struct Exchange {
  std::vector<int64_t> send_rows, recv_rows;
  std::vector<int32_t> recv_blocks;  // [P * el], source-major
  int64_t received = 0;
};

Exchange plan_exchange(const std::vector<int32_t>& sent, std::vector<int32_t> recv_blocks,
                       int64_t p, int64_t el) {
  TANDEM_ASSERT(static_cast<int64_t>(sent.size()) == p * el &&
                    static_cast<int64_t>(recv_blocks.size()) == p * el,
                "routing counts on the host are missing (Note [Routing counts on the host])");
  Exchange x;
  x.send_rows.assign(static_cast<size_t>(p), 0);
  x.recv_rows.assign(static_cast<size_t>(p), 0);
  x.recv_blocks = std::move(recv_blocks);
  for (int64_t d = 0; d < p; ++d) {
    for (int64_t e = 0; e < el; ++e) {
      x.send_rows[d] += sent[d * el + e];
      x.recv_rows[d] += x.recv_blocks[d * el + e];
    }
    x.received += x.recv_rows[d];
  }
  return x;
}

int64_t local_experts(const NodeContext& c) { return c.cfg.num_experts / c.ep->size(); }

// The rows this rank sends: the router's counts summed, all of the S slots' rows but the ones
// dropped past an expert's capacity, which lie unsent at the end (Note [Expert capacity] in
// core/footprint.h).
int64_t sent_rows(const std::vector<int32_t>& counts) {
  int64_t rows = 0;
  for (const int32_t c : counts) rows += c;
  return rows;
}

}  // namespace

// Note [Counts ahead of the rows]: dispatch's forward sends the rows only once the host knows
// how many each rank receives, which costs a wait for the counts' exchange. Run as one piece
// from the host, that wait also holds up everything the host would issue after it. Combined
// 1F1B on the GPU therefore issues the counts' exchange (dispatch_exchange_counts) right after
// attention's forward, on the communication stream, with the read to the host started
// (HostRead), then the other micro-batch's experts backward, and only then the rest of the
// dispatch, by when the counts have usually landed (Note [Issue order] in runtime/combined.cc).
// The values and the order of every stream's work are unchanged.
void dispatch_exchange_counts(LayerActs& a, const NodeContext& c) {
  if (c.ep == nullptr || a.dispatch.recv_counts.defined()) return;
  const int64_t p = c.ep->size(), el = local_experts(c);
  a.dispatch.recv_counts = saved_tensor({p * el}, DType::kI32, "dispatch.recv_counts");
  const std::vector<int64_t> per_peer(static_cast<size_t>(p), el);
  c.ep->all_to_all_v(a.dispatch.recv_counts.reshape({p * el, 1}), per_peer,
                     a.attn.counts.reshape({p * el, 1}), per_peer);
  a.dispatch.recv_read = std::make_shared<HostRead>(a.dispatch.recv_counts);
}

void dispatch_forward(LayerActs& a, const NodeContext& c) {
  // The router's counts, read where they are first needed (Note [Routing counts on the host]).
  if (a.attn.counts_read) {
    a.attn.counts_host = a.attn.counts_read->take();
    a.attn.counts_read.reset();
  }
  if (c.ep == nullptr) {
    const int64_t rows = sent_rows(a.attn.counts_host);
    if (rows == a.routed.size(0)) {
      a.expert_in = std::exchange(a.routed, Tensor());
    } else {  // rows dropped: the experts take the kept ones only, in a tensor of their size
      a.expert_in = work_tensor({rows, c.cfg.hidden_size}, c.dtype, "experts.x_in");
      a.expert_in.copy_from(a.routed.narrow_rows(0, rows));
      release_storage({&a.routed});
      a.routed = Tensor();
    }
    a.expert_rows = work_tensor({c.cfg.num_experts}, DType::kI32, "experts.rows");  // handed on
    a.expert_rows.copy_from(a.attn.counts);
    a.expert_rows_host = a.attn.counts_host;
    return;
  }
  const int64_t p = c.ep->size(), el = local_experts(c), h = c.cfg.hidden_size;
  dispatch_exchange_counts(a, c);
  // The one read of received counts (Note [Routing counts on the host]).
  const Exchange x = plan_exchange(a.attn.counts_host, a.dispatch.recv_read->take(), p, el);
  a.dispatch.recv_read.reset();
  Tensor received = comm_tensor({x.received, h}, c.dtype, "dispatch.recv");
  c.ep->all_to_all_v(received, x.recv_rows, a.routed.narrow_rows(0, sent_rows(a.attn.counts_host)),
                     x.send_rows);
  release_storage({&a.routed});  // sent: nobody on this rank needs the routed rows again
  a.routed = Tensor();
  // Both handed to the experts node, which adopts them (Note [Hand-over]): the planner counts
  // them from the end of the experts' forward.
  a.expert_in = work_tensor({x.received, h}, c.dtype, "experts.x_in");
  reorder_blocks(a.expert_in, received, x.recv_blocks, p, el, BlockOrder::kSourceToExpert);
  // Rows per local expert: every rank's counts for this rank's experts, summed, known on the
  // host from the received counts; copied to the device (a copy from the host does not wait for
  // the stream, Note [Host copies]), where it once took a reduce-scatter: one more meeting of
  // the ranks per dispatch.
  a.expert_rows_host.assign(static_cast<size_t>(el), 0);
  for (int64_t e = 0; e < el; ++e) {
    for (int64_t s = 0; s < p; ++s) a.expert_rows_host[e] += x.recv_blocks[s * el + e];
  }
  Tensor rows =
      Tensor::empty({el}, DType::kI32, MemCategory::kOther, "experts.rows.host", Device::kCPU);
  std::copy(a.expert_rows_host.begin(), a.expert_rows_host.end(), rows.data<int32_t>());
  a.expert_rows = work_tensor({el}, DType::kI32, "experts.rows");
  a.expert_rows.copy_from(rows);
  a.dispatch.recv_host = x.recv_blocks;
}

void dispatch_backward(LayerActs& a, const NodeContext& c) {
  if (c.ep == nullptr) {
    a.d_routed = std::exchange(a.d_expert_in, Tensor());
    return;
  }
  const int64_t p = c.ep->size(), el = local_experts(c), h = c.cfg.hidden_size;
  const Exchange x = plan_exchange(a.attn.counts_host, a.dispatch.recv_host, p, el);
  Tensor send = comm_tensor({x.received, h}, c.dtype, "dispatch.bwd_send");
  reorder_blocks(send, a.d_expert_in, x.recv_blocks, p, el, BlockOrder::kExpertToSource);
  a.d_expert_in = Tensor();
  // S rows, as attention's permutation has; the dropped slots' rows stay unwritten and unread.
  a.d_routed = work_tensor({a.attn.perm.size(0), h}, c.dtype, "d_routed");
  c.ep->all_to_all_v(a.d_routed.narrow_rows(0, sent_rows(a.attn.counts_host)), x.send_rows, send,
                     x.recv_rows);
  release_storage({&a.dispatch.recv_counts});
  a.dispatch = DispatchSaved{};
}

void combine_forward(LayerActs& a, const NodeContext& c) {
  const AttentionSaved& s = a.attn;
  if (c.ep == nullptr) {
    a.combine.y = std::exchange(a.expert_out, Tensor());  // (N*k, H), expert-sorted
    adopt_as_activation(a.combine.y);                     // Note [Hand-over]
  } else {
    const int64_t p = c.ep->size(), el = local_experts(c), h = c.cfg.hidden_size;
    const Exchange x = plan_exchange(s.counts_host, a.dispatch.recv_host, p, el);
    Tensor send = comm_tensor({x.received, h}, c.dtype, "combine.send");
    reorder_blocks(send, a.expert_out, x.recv_blocks, p, el, BlockOrder::kExpertToSource);
    release_storage({&a.expert_out});
    a.expert_out = Tensor();
    // S rows, as attention's permutation has; the dropped slots' rows stay unwritten and unread.
    a.combine.y = saved_tensor({s.perm.size(0), h}, c.dtype, "combine.y");
    c.ep->all_to_all_v(a.combine.y.narrow_rows(0, sent_rows(s.counts_host)), x.send_rows, send,
                       x.recv_rows);
  }
  a.out = work_tensor({c.tokens(), c.cfg.hidden_size}, c.dtype, "layer.out");  // handed on
  a.out.copy_from(a.h1);                                                       // residual
  if (a.shared_out.defined()) {  // the shared expert's output
    ops::axpy(a.out, a.shared_out, 1.0);
    a.shared_out = Tensor();
  }
  ops::combine_forward(a.out, a.combine.y, s.perm, s.topk_w);
  a.h1 = Tensor();
}

void combine_backward(LayerActs& a, const NodeContext& c) {
  const AttentionSaved& s = a.attn;
  const int64_t n = c.tokens(), k = c.cfg.moe_router_topk, h = c.cfg.hidden_size;
  Tensor d_y = work_tensor(a.combine.y.shape(), c.dtype, "d_expert_out");  // expert-sorted
  a.d_topk_w = work_tensor({n, k}, c.stat_dtype(), "d_topk_w");
  ops::combine_backward(d_y, a.d_topk_w, a.d_out, a.combine.y, s.perm, s.topk_w);
  release_storage({&a.combine.y});
  a.combine = CombineSaved{};
  if (c.ep == nullptr) {
    a.d_expert_out = std::move(d_y);
    return;
  }
  const int64_t p = c.ep->size(), el = local_experts(c);
  const Exchange x = plan_exchange(s.counts_host, a.dispatch.recv_host, p, el);
  Tensor received = comm_tensor({x.received, h}, c.dtype, "combine.bwd_recv");
  c.ep->all_to_all_v(received, x.recv_rows, d_y.narrow_rows(0, sent_rows(s.counts_host)),
                     x.send_rows);
  a.d_expert_out = work_tensor({x.received, h}, c.dtype, "d_expert_out");
  reorder_blocks(a.d_expert_out, received, x.recv_blocks, p, el, BlockOrder::kSourceToExpert);
}

}  // namespace tandem::model
