// The multi-token prediction modules' share of the loss node's footprint (core/footprint.h; the
// modules run inside the loss node, model/mtp.cc).
#include <algorithm>

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

NodeWorkspace mtp_workspace(const ModelConfig& cfg, const FootprintShape& s) {
  NodeWorkspace w;
  if (!cfg.has_mtp()) return w;
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
  // layer's nodes' and the shared head's (its logits block, hv, targets, lse).
  const int64_t head =
      lm_head_block_rows(nv, ld) * ld * kLmHeadLogitBytes + nv * h * es + nv * (4 + s.stat_size());
  w.forward = n * 4 + n * h * es + std::max(layer_f, head);
  // Backward: d_hk and the layer's output gradient [N,H], then d_cat [N,2H] and a half [N,H],
  // beside the larger of the layer's nodes' workspaces.
  w.backward_input = 2 * n * h * es + std::max(layer_b, 3 * n * h * es);
  return w;
}

}  // namespace tandem
