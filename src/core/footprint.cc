// Saved-bytes formulas of footprint.h; tests/model checks each against the nodes' real tensors.
#include "core/footprint.h"

namespace tandem {

std::string_view node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kEmbed: return "embed";
    case NodeKind::kAttention: return "attention";
    case NodeKind::kDispatch: return "dispatch";
    case NodeKind::kExperts: return "experts";
    case NodeKind::kCombine: return "combine";
    case NodeKind::kMlp: return "mlp";
    case NodeKind::kLoss: return "loss";
  }
  return "?";
}

FootprintShape single_rank_shape(const ModelConfig& cfg, int64_t micro_batch_size,
                                 int64_t elem_bytes) {
  FootprintShape s;
  s.tokens = micro_batch_size * cfg.seq_length;
  s.expert_rows = cfg.is_moe() ? s.tokens * cfg.moe_router_topk : 0;
  s.local_experts = cfg.num_experts;
  s.elem_bytes = elem_bytes;
  return s;
}

int64_t node_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  constexpr int64_t kIndexBytes = 4;
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  const int64_t k = cfg.moe_router_topk, e = cfg.num_experts, f = cfg.ffn_hidden_size;
  switch (kind) {
    case NodeKind::kEmbed:
      return n * kIndexBytes;
    case NodeKind::kAttention: {
      const int64_t elems = 4 * n * h + 2 * n * cfg.q_width() + 2 * n * cfg.kv_width();
      int64_t stats = 2 * n + n * cfg.num_attention_heads;
      int64_t index = 0;
      if (cfg.is_moe()) {
        stats += n * e + n * k;
        index = n * k + e + n * k;
      }
      return elems * es + stats * s.stat_size() + index * kIndexBytes;
    }
    case NodeKind::kDispatch:
      return s.ep_size > 1 ? s.ep_size * s.local_experts * kIndexBytes : 0;
    case NodeKind::kExperts:
      return (s.expert_rows * h + 3 * s.expert_rows * f) * es + s.local_experts * kIndexBytes;
    case NodeKind::kCombine:
      return n * k * h * es;
    case NodeKind::kMlp:
      return 3 * n * f * es;
    case NodeKind::kLoss:
      if (s.fused_lm_head) return 2 * n * h * es + n * s.stat_size();
      return (2 * n * h + n * cfg.vocab_size) * es + n * s.stat_size() + n * kIndexBytes;
  }
  return 0;
}

int64_t node_weight_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  constexpr int64_t kIndexBytes = 4;
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  switch (kind) {
    case NodeKind::kEmbed:
      return n * kIndexBytes;
    case NodeKind::kAttention:
      return (2 * n * h + n * cfg.q_width()) * es;
    case NodeKind::kExperts:
      return (s.expert_rows * h + s.expert_rows * cfg.ffn_hidden_size) * es +
             s.local_experts * kIndexBytes;
    case NodeKind::kMlp:
      return n * cfg.ffn_hidden_size * es;
    case NodeKind::kLoss:
      return s.fused_lm_head ? 0 : (n * h + n * cfg.vocab_size) * es;
    case NodeKind::kDispatch:
    case NodeKind::kCombine:
      return 0;
  }
  return 0;
}

}  // namespace tandem
