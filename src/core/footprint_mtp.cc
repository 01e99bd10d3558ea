// The multi-token prediction modules' share of the loss node's footprint (core/footprint.h; the
// modules run inside the loss node, model/mtp.cc).
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/footprint.h"

namespace tandem {
namespace {

constexpr int64_t kIndexBytes = 4;

// The footprint shape of module j's transformer layer: the kind of the model's last layer.
FootprintShape layer_shape(const ModelConfig& cfg, FootprintShape s) {
  s.moe_layer = cfg.is_moe_layer(cfg.num_layers);
  return s;
}

// The layer's nodes, as the chunk builds a layer of that kind.
std::vector<NodeKind> layer_kinds(const ModelConfig& cfg) {
  if (!cfg.is_moe_layer(cfg.num_layers)) return {NodeKind::kAttention, NodeKind::kMlp};
  std::vector<NodeKind> kinds = {NodeKind::kAttention, NodeKind::kDispatch};
  if (cfg.has_shared_expert()) kinds.push_back(NodeKind::kSharedExpert);
  kinds.push_back(NodeKind::kExperts);
  kinds.push_back(NodeKind::kCombine);
  return kinds;
}

}  // namespace

int64_t mtp_saved_bytes(const ModelConfig& cfg, const FootprintShape& s) {
  if (!cfg.has_mtp()) return 0;
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes, d = cfg.mtp_num_layers;
  const int64_t batch = n / cfg.seq_length;
  const FootprintShape ls = layer_shape(cfg, s);
  // The main head's nf stays for the first module's hnorm (the fused head would drop it).
  int64_t bytes = s.fused_lm_head ? n * h * es : 0;
  for (int64_t j = 0; j < d; ++j) {
    const int64_t nv = batch * (cfg.seq_length - j - 1);
    // ids; e, cat [N, 2H], y; rstd_e, rstd_h, rstd_f; hk but for the last depth's
    bytes += n * kIndexBytes + 4 * n * h * es + 3 * n * s.stat_size();
    if (j + 1 < d) bytes += n * h * es;
    for (NodeKind k : layer_kinds(cfg)) bytes += node_saved_bytes(k, cfg, ls);
    bytes += s.fused_lm_head ? nv * h * es  // d_hv
                             : (nv * h + nv * cfg.vocab_size) * es + nv * kIndexBytes;
  }
  return bytes;
}

int64_t mtp_weight_saved_bytes(const ModelConfig& cfg, const FootprintShape& s) {
  if (!cfg.has_mtp()) return 0;
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes, d = cfg.mtp_num_layers;
  const int64_t batch = n / cfg.seq_length;
  const FootprintShape ls = layer_shape(cfg, s);
  int64_t bytes = 0;
  for (int64_t j = 0; j < d; ++j) {
    const int64_t nv = batch * (cfg.seq_length - j - 1);
    bytes += 3 * n * h * es;  // eh_proj's input cat [N, 2H] and output gradient d_x
    for (NodeKind k : layer_kinds(cfg)) bytes += node_weight_saved_bytes(k, cfg, ls);
    if (!s.fused_lm_head) bytes += (nv * h + nv * cfg.vocab_size) * es;  // hv, dlogits
  }
  return bytes;
}

namespace {

// The bytes a phase holds beyond those at its start, and their highest.
struct Tally {
  int64_t now = 0, peak = 0;
  void add(int64_t bytes) {
    now += bytes;
    peak = std::max(peak, now);
  }
  void free(int64_t bytes) { now -= bytes; }
};

// The CPU layout's loss node with MTP modules, walked as model/end_nodes.cc and model/mtp.cc run
// it: the unfused head, then each module. The module's layer nodes run as the chunk's do, each
// phase holding its workspace figure from its start and its saved bytes from its end (their
// figures are exact in that sense: Note [Node workspace]); the tensor a node hands to the next
// is in both nodes' figures, the first node's incoming gradient in neither.
NodeWorkspace cpu_loss_with_mtp(const ModelConfig& cfg, const FootprintShape& s) {
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes, st = s.stat_size();
  const int64_t v = cfg.vocab_size, d = cfg.mtp_num_layers, batch = n / cfg.seq_length;
  const FootprintShape ls = layer_shape(cfg, s);
  const std::vector<NodeKind> kinds = layer_kinds(cfg);
  NodeWorkspace w;
  // Forward, from the node's input x (adopted as saved): the head's nf, rstd, logits, targets;
  // the targets' copy for the modules; per module its ids, e, the norms' statistics, cat and
  // a normed temporary, its layer, y (adopted), hk (a temporary in the last module), rstd_f,
  // the rows with a target hv, their targets and logits.
  Tally f;
  f.add(n * h * es);
  f.add(n * h * es + n * st + n * v * es + n * kIndexBytes);
  f.add(n * kIndexBytes);  // mtp.targets_all
  for (int64_t j = 0; j < d; ++j) {
    const int64_t nv = batch * (cfg.seq_length - j - 1);
    const bool last = j + 1 == d;
    f.add(n * kIndexBytes + n * h * es + 2 * n * st + 2 * n * h * es);
    f.add(n * h * es);  // normed
    f.free(n * h * es);
    for (NodeKind k : kinds) {  // the layer's input x is the attention's saved x
      const NodeWorkspace lw = node_workspace_bytes(k, cfg, ls);
      f.add(lw.forward + node_saved_bytes(k, cfg, ls));
      f.free(lw.forward);
    }
    f.add(n * h * es);                      // y
    f.add(n * h * es + n * st);             // hk, rstd_f
    f.add(nv * h * es);                     // hv
    if (last) f.free(n * h * es);           // hk
    f.add(nv * kIndexBytes + nv * v * es);  // targets, logits
  }
  f.free(n * kIndexBytes);
  TANDEM_ASSERT(f.now == node_saved_bytes(NodeKind::kLoss, cfg, s), "the loss node saves ", f.now,
                " bytes as walked, ", node_saved_bytes(NodeKind::kLoss, cfg, s), " as tabled");
  w.forward = f.peak - f.now;
  // Input-gradient backward, from the node's saved bytes: each module from the last, then the
  // head. The layer's nodes run their input gradients only and keep what their weight gradients
  // read (each node's weight-phase figure) until the node's weight-gradient phase.
  Tally b;
  int64_t kept = 0;  // the layer nodes' gradients kept for their weight phase
  for (int64_t j = d; j-- > 0;) {
    const int64_t nv = batch * (cfg.seq_length - j - 1);
    const bool last = j + 1 == d;
    b.add(nv * h * es);        // d_hv
    b.free(nv * kIndexBytes);  // the targets
    if (last) {
      b.add(n * h * es);  // d_hk
    } else {
      b.add(nv * h * es);  // the rows of d_hk beside d_hv
      b.free(nv * h * es);
    }
    b.free(nv * h * es);              // d_hv
    b.add(n * h * es);                // the layer's output gradient d_y
    b.free(2 * n * h * es + n * st);  // d_hk, y, rstd_f
    bool first = true;
    for (auto k = kinds.rbegin(); k != kinds.rend(); ++k) {
      const NodeWorkspace lw = node_workspace_bytes(*k, cfg, ls);
      b.add(lw.backward_input - (first ? lw.incoming_grad : 0));
      b.free(lw.backward_input - (first ? lw.incoming_grad : 0));
      if (first) b.free(lw.incoming_grad);
      first = false;
      b.free(node_saved_bytes(*k, cfg, ls) - node_weight_saved_bytes(*k, cfg, ls));
      b.add(lw.backward_weight);
      kept += lw.backward_weight;
    }
    b.add(n * h * es);  // the layer's input gradient d_x, kept for eh_proj's weight gradient
    b.add(2 * n * h * es + n * h * es + n * h * es);             // d_cat, d_half, d_e
    b.free(n * h * es + n * h * es + n * st + n * kIndexBytes);  // d_e, e, rstd_e, ids
    b.free(2 * n * h * es);                                      // d_cat
    b.add(n * h * es);                                           // d_h_in
    b.free(n * h * es + n * st);                                 // d_half, rstd_h
    if (j > 0) b.free(n * h * es);                               // the previous module's hk
  }
  // The head: d_nf beside the modules' gradient at nf, then d_x.
  b.add(n * h * es);
  b.free(n * h * es);
  b.add(n * h * es);
  w.backward_input = b.peak;
  // The weight phase starts with the layers' kept gradients, and frees them as it goes.
  w.backward_weight = kept;
  return w;
}

}  // namespace

NodeWorkspace mtp_workspace(const ModelConfig& cfg, const FootprintShape& s) {
  NodeWorkspace w;
  if (!cfg.has_mtp()) return w;
  if (!s.fused_lm_head) return cpu_loss_with_mtp(cfg, s);
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  const int64_t ld = lm_head_padded_vocab(cfg.vocab_size);
  const int64_t nv = n / cfg.seq_length * (cfg.seq_length - 1);  // the first module's rows
  int64_t layer_f = 0, layer_b = 0;
  for (NodeKind k : layer_kinds(cfg)) {
    const NodeWorkspace lw = node_workspace_bytes(k, cfg, layer_shape(cfg, s));
    layer_f = std::max(layer_f, lw.forward);
    layer_b = std::max(layer_b, lw.backward_input + lw.backward_weight);
  }
  // Forward: the targets [N] i32, the normed rows or the layer's input [N,H], the larger of the
  // layer's nodes' and the shared head's (its logits block, hv, targets, lse, and with a loss
  // mask the rolled mask, f32).
  const int64_t head = lm_head_block_rows(nv, ld) * ld * kLmHeadLogitBytes + nv * h * es +
                       nv * (4 + s.stat_size() + (s.loss_mask ? 4 : 0));
  w.forward = n * 4 + n * h * es + std::max(layer_f, head);
  // Backward: d_hk and the layer's output gradient [N,H], then d_cat [N,2H] and a half [N,H],
  // beside the larger of the layer's nodes' workspaces.
  w.backward_input = 2 * n * h * es + std::max(layer_b, 3 * n * h * es);
  return w;
}

}  // namespace tandem
