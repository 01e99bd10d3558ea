// Saved-bytes formulas of footprint.h; tests/model checks each against the nodes' real tensors.
// The workspace figures (Note [Node workspace]) follow the nodes' work tensors (src/model/*.cc)
// and the ops' buffers of each backend (ops/cuda, ops/cpu).
#include "core/footprint.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "core/error.h"

namespace tandem {

const std::vector<OffloadKind>& offload_kinds() {
  static const std::vector<OffloadKind> kinds = {{NodeKind::kAttention, "attention"},
                                                 {NodeKind::kExperts, "experts"},
                                                 {NodeKind::kSharedExpert, "shared-expert"},
                                                 {NodeKind::kCombine, "combine"},
                                                 {NodeKind::kMlp, "mlp"}};
  return kinds;
}

const char* offload_kind_absent(NodeKind kind, const ModelConfig& cfg) {
  switch (kind) {
    case NodeKind::kExperts:
    case NodeKind::kCombine:
      return cfg.is_moe() ? nullptr : "--num-experts 0";
    case NodeKind::kSharedExpert:
      return cfg.has_shared_expert() ? nullptr : "no --moe-shared-expert-intermediate-size";
    case NodeKind::kMlp:
      for (int64_t l = 0; l < cfg.num_layers; ++l) {
        if (!cfg.is_moe_layer(l)) return nullptr;
      }
      return "every layer is a MoE layer";
    default:
      return nullptr;
  }
}

uint32_t parse_offload_kinds(std::string_view text, const ModelConfig& cfg) {
  std::string valid;
  for (const OffloadKind& k : offload_kinds())
    valid += std::string(valid.empty() ? "" : ", ") + k.name;
  uint32_t kinds = 0;
  size_t begin = 0;
  while (begin <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view name = text.substr(begin, end - begin);
    const OffloadKind* found = nullptr;
    for (const OffloadKind& k : offload_kinds()) {
      if (name == k.name) found = &k;
    }
    TANDEM_CHECK(found != nullptr, "--offload-activations ", text, ": '", name,
                 "' is not a node whose activations can be offloaded; give a comma-separated "
                 "list of ",
                 valid);
    const char* absent = offload_kind_absent(found->kind, cfg);
    TANDEM_CHECK(absent == nullptr, "--offload-activations ", text, ": this model has no ", name,
                 " node (", absent, "), so nothing would be offloaded");
    kinds |= 1u << static_cast<unsigned>(found->kind);
    begin = end + 1;
  }
  return kinds;
}

uint32_t parse_recompute(std::string_view text) {
  static constexpr std::pair<const char*, Recompute> kModules[] = {
      {"mlp", Recompute::kMlp}, {"shared_experts", Recompute::kSharedExperts}};
  uint32_t bits = 0;
  size_t begin = 0;
  while (begin <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view name = text.substr(begin, end - begin);
    const auto* found = std::find_if(std::begin(kModules), std::end(kModules),
                                     [&](const auto& m) { return name == m.first; });
    TANDEM_CHECK(found != std::end(kModules), "--recompute ", text, ": '", name,
                 "' is not a module tandem recomputes; give a comma-separated list of mlp, "
                 "shared_experts (the experts' SwiGLU is --recompute-experts)");
    bits |= 1u << static_cast<unsigned>(found->second);
    begin = end + 1;
  }
  return bits;
}

std::string_view node_kind_name(NodeKind kind) { return enum_name(kind); }

int64_t moe_expert_capacity(const ModelConfig& cfg, int64_t tokens) {
  if (!cfg.has_expert_capacity()) return 0;
  const double rows = static_cast<double>(tokens * cfg.moe_router_topk);
  return static_cast<int64_t>(
      std::ceil(rows / static_cast<double>(cfg.num_experts) * cfg.moe_expert_capacity_factor));
}

int64_t moe_routed_rows(const ModelConfig& cfg, int64_t tokens) {
  if (!cfg.is_moe()) return 0;
  if (cfg.has_expert_capacity() && cfg.moe_pad_expert_input_to_capacity)
    return moe_expert_capacity(cfg, tokens) * cfg.num_experts;
  return tokens * cfg.moe_router_topk;
}

FootprintShape single_rank_shape(const ModelConfig& cfg, int64_t micro_batch_size,
                                 int64_t elem_bytes) {
  FootprintShape s;
  s.tokens = micro_batch_size * cfg.seq_length;
  s.routed_rows = moe_routed_rows(cfg, s.tokens);
  s.expert_rows = s.routed_rows;  // EP = 1: dropless or padded; dropping otherwise: at most this
  s.local_experts = cfg.num_experts;
  s.elem_bytes = elem_bytes;
  s.moe_layer = cfg.is_moe();
  return s;
}

// The router's loss statistics a MoE attention node keeps (in elements of the statistics'
// dtype): the load-balancing loss's counts [G, E] and the z-loss's logits [N, E].
static int64_t router_loss_stats(const ModelConfig& cfg, const FootprintShape& s) {
  int64_t stats = 0;
  if (cfg.has_balance_loss()) {
    const bool per_sequence = cfg.moe_router_load_balancing_type == "seq_aux_loss";
    stats += (per_sequence ? s.tokens / cfg.seq_length : 1) * cfg.num_experts;
  }
  if (cfg.moe_z_loss_coeff > 0) stats += s.tokens * cfg.num_experts;
  return stats;
}

int64_t node_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  constexpr int64_t kIndexBytes = 4;
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  const int64_t k = cfg.moe_router_topk, e = cfg.num_experts, f = cfg.ffn_hidden_size;
  const int64_t fe = cfg.expert_ffn_size(), fs = cfg.moe_shared_expert_intermediate_size;
  switch (kind) {
    case NodeKind::kEmbed:
      return n * kIndexBytes;
    case NodeKind::kAttention: {
      int64_t elems = 4 * n * h + 2 * n * cfg.q_width() + 2 * n * cfg.kv_width();
      int64_t stats = 2 * n + n * cfg.num_attention_heads;
      if (cfg.multi_latent_attention) {  // q, k [N,heads*(dn+dr)]; v, a [N,heads*dv]; latents
        const int64_t rq = cfg.q_lora_rank, rkv = cfg.kv_lora_rank;
        elems = 4 * n * h + 2 * n * cfg.q_width() + 2 * n * cfg.attn_out_width() + 2 * n * rq +
                2 * n * rkv;
        stats = 2 * n + n * cfg.num_attention_heads + (rq > 0 ? n : 0) + n;
      }
      if (cfg.qk_layernorm) {
        elems += n * cfg.q_width() + n * cfg.kv_width();
        stats += n * cfg.num_attention_heads + n * cfg.num_query_groups;
      }
      int64_t index = 0;
      if (cfg.is_moe() && s.moe_layer) {
        stats += n * e + n * k + router_loss_stats(cfg, s);
        index = n * k + e + s.routed(k);
      }
      return elems * es + stats * s.stat_size() + index * kIndexBytes;
    }
    case NodeKind::kDispatch:
      return s.ep_size > 1 ? s.ep_size * s.local_experts * kIndexBytes : 0;
    case NodeKind::kExperts:  // recomputed: gate, up and act are formed again in the backward
      return (s.expert_rows * h + (s.recompute_experts ? 0 : 3 * s.expert_rows * fe)) * es +
             s.local_experts * kIndexBytes;
    case NodeKind::kCombine:  // EP = 1: the experts' output, handed over
      return (s.ep_size > 1 ? s.routed(k) : s.expert_rows) * h * es;
    case NodeKind::kSharedExpert:  // recomputed: its input n2 is attention's
      if (recomputes(s.recompute, Recompute::kSharedExperts)) return 0;
      if (!cfg.moe_shared_expert_gate) return 3 * n * fs * es;
      return (3 * n * fs + n * h) * es + n * s.stat_size();
    case NodeKind::kMlp:  // recomputed: its input n2 is attention's
      return recomputes(s.recompute, Recompute::kMlp) ? 0 : 3 * n * f * es;
    case NodeKind::kLoss:
      if (s.fused_lm_head) return 2 * n * h * es + n * s.stat_size() + mtp_saved_bytes(cfg, s);
      return (2 * n * h + n * cfg.vocab_size) * es + n * s.stat_size() + n * kIndexBytes +
             mtp_saved_bytes(cfg, s);
  }
  return 0;
}

int64_t node_weight_saved_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  constexpr int64_t kIndexBytes = 4;
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  switch (kind) {
    case NodeKind::kEmbed:
      return n * kIndexBytes;
    case NodeKind::kAttention:  // MLA also keeps the normed latents
      return (2 * n * h + n * cfg.attn_out_width() +
              (cfg.multi_latent_attention ? n * (cfg.q_lora_rank + cfg.kv_lora_rank) : 0)) *
             es;
    case NodeKind::kExperts:
      return (s.expert_rows * h + s.expert_rows * cfg.expert_ffn_size()) * es +
             s.local_experts * kIndexBytes;
    case NodeKind::kMlp:
      return n * cfg.ffn_hidden_size * es;
    case NodeKind::kSharedExpert:
      return n * cfg.moe_shared_expert_intermediate_size * es;
    case NodeKind::kLoss:
      return (s.fused_lm_head ? 0 : (n * h + n * cfg.vocab_size) * es) +
             mtp_weight_saved_bytes(cfg, s);
    case NodeKind::kDispatch:
    case NodeKind::kCombine:
      return 0;
  }
  return 0;
}

int64_t lm_head_padded_vocab(int64_t vocab) { return (vocab + 7) / 8 * 8; }

int64_t lm_head_block_rows(int64_t n, int64_t padded_vocab) {
  if (n <= 0) return 1;
  const int64_t most = std::clamp(kLmHeadMaxBlockBytes / (padded_vocab * kLmHeadLogitBytes),
                                  int64_t{1}, kLmHeadMaxBlockRows);
  const int64_t blocks = (n + most - 1) / most;
  return std::max<int64_t>(1, (n + blocks - 1) / blocks);
}

bool attention_tensor_core_dims(int64_t head_dim, int64_t v_dim) {
  return (head_dim == 64 && v_dim == 64) || (head_dim == 128 && v_dim == 128) ||
         (head_dim == 192 && v_dim == 128);
}

int64_t attention_key_split(int64_t batch, int64_t seq, int64_t kv_heads, int64_t group,
                            int64_t head_dim, int64_t v_dim) {
  if (!attention_tensor_core_dims(head_dim, v_dim) || group <= 1) return 1;
  const int64_t blocks = batch * kv_heads * ((seq + 63) / 64);
  for (int64_t split = 1; split < group; ++split) {
    if (group % split == 0 && blocks * split >= kAttentionSplitBlocks) return split;
  }
  return group;
}

namespace {

constexpr int64_t kF32 = 4;
constexpr int64_t kI32 = 4;

// Attention's phases (attention_node.cc; the op's buffers in ops/cuda/attention.cu and
// attention_backward.cu).
NodeWorkspace attention_workspace(const ModelConfig& cfg, const FootprintShape& s) {
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes, st = s.stat_size();
  const int64_t k = cfg.moe_router_topk, e = cfg.num_experts;
  const bool moe = cfg.is_moe() && s.moe_layer;
  NodeWorkspace w;
  const int64_t routed = moe ? s.routed(k) * h * es : 0;
  // router logits (saved instead with a z-loss), routed rows
  if (moe) w.forward = (cfg.moe_z_loss_coeff > 0 ? 0 : n * e * st) + routed;
  if (!s.fused_lm_head) {
    // The CPU op's probabilities [T,T] while it runs, before the node has saved h1, n2 [N,H],
    // rstd2 [N] and the router's state (what the node saves after it).
    const int64_t after =
        2 * n * h * es + n * st +
        (moe ? (n * e + n * k + router_loss_stats(cfg, s)) * st + (n * k + e + s.routed(k)) * 4
             : 0);
    w.forward = std::max(w.forward, cfg.seq_length * cfg.seq_length * es - after);
  }
  const int64_t d_logits = moe ? n * e * es : 0;
  const int64_t d_n2 = n * h * es;
  const int64_t start = n * h * es + d_n2 + d_logits + (moe ? routed + n * k * st : 0);
  const int64_t held =  // d_n2, d_logits, d_h1, d_a, d_q, d_k, d_v
      d_n2 + d_logits + n * h * es + 2 * n * cfg.q_width() * es + 2 * n * cfg.kv_width() * es;
  // The op's delta [N*heads] f32; its deterministic backward (the default) needs no f32 dq
  // workspace (Note [Deterministic attention backward] in ops/cuda/attention_backward.cu; the
  // one-pass variants' [N, heads*D] f32 is not counted).
  // With a key split (Note [Attention key split]) the f32 partial dk and dv beside it.
  const int64_t split = attention_key_split(
      s.tokens / cfg.seq_length, cfg.seq_length, cfg.num_query_groups,
      cfg.num_attention_heads / cfg.num_query_groups, cfg.qk_dim(), cfg.v_dim());
  // The CPU op's (ops/cpu/attention.cc): one head's probabilities and their gradient [T,T] and
  // its delta [T], in the activations' dtype.
  const int64_t t = cfg.seq_length;
  const int64_t op =
      !s.fused_lm_head
          ? (2 * t * t + t) * es
          : n * cfg.num_attention_heads * kF32 +
                (split > 1 ? split * n * cfg.num_query_groups * (cfg.qk_dim() + cfg.v_dim()) * kF32
                           : 0);
  // --qk-layernorm: the raw q and k's gradients beside the normed ones' for a moment.
  const int64_t qk_norm = cfg.qk_layernorm ? n * (cfg.q_width() + cfg.kv_width()) * es : 0;
  w.backward_input = std::max({start, held + op, held + qk_norm, held + 2 * n * h * es});
  w.backward_weight = d_logits + n * h * es + n * cfg.q_width() * es + 2 * n * cfg.kv_width() * es;
  w.incoming_grad = moe ? routed : d_n2;  // d_routed or the mlp's d_n2
  if (cfg.multi_latent_attention) {
    // mla_backward (model/mla.cc): beside d_n2, d_logits, d_h1 and d_a (the values' width), the
    // op's d_q and d_k (q's width) and d_v; then d_q_in, d_kv and d_k_rope (kept for the weight
    // gradients) while those three still live; after they go, d_n1 and the latents' gradients
    // (d_ckvn and d_ckv, with a q latent d_cqn and d_cq; d_ckv and d_cq kept), and d_x last.
    const int64_t qw = cfg.q_width() * n * es, vw = cfg.attn_out_width() * n * es;
    const int64_t base = d_n2 + d_logits + n * h * es + vw;
    const int64_t qkv = 2 * qw + vw;
    const int64_t mla =
        (cfg.q_width() + cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) +
         cfg.qk_pos_emb_head_dim) *
        n * es;
    const int64_t latents = (cfg.kv_lora_rank + cfg.q_lora_rank) * n * es;
    w.backward_input =
        std::max({start, base + qkv + op, base + qkv + mla, base + mla + n * h * es + 2 * latents,
                  base + mla + 2 * n * h * es + latents});
    w.backward_weight = d_logits + n * h * es + mla + latents;
  }
  return w;
}

// dispatch and combine (moe_exchange.cc): with EP = 1 hand-overs, with EP > 1 the send and
// receive buffers beside the rows they reorder.
NodeWorkspace exchange_workspace(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  const int64_t es = s.elem_bytes, h = cfg.hidden_size;
  const int64_t routed = s.routed(cfg.moe_router_topk) * h * es, rows = s.expert_rows * h * es;
  const int64_t layer_grad = s.tokens * h * es + s.tokens * cfg.moe_router_topk * s.stat_size();
  const bool ep = s.ep_size > 1;
  NodeWorkspace w;
  if (kind == NodeKind::kDispatch) {
    w.forward = ep ? rows + std::max(routed, rows) : routed;
    w.backward_input = layer_grad + (ep ? rows + std::max(rows, routed) : routed);
    w.incoming_grad = rows;  // d_expert_in
  } else {
    const int64_t out = s.tokens * h * es;
    // EP > 1: the received rows y [S,H] (its saved bytes) come after expert_out is freed, and
    // its backward frees y before the received gradient and d_expert_out come.
    w.forward = ep ? std::max(2 * rows - routed, rows + out) : out;
    w.backward_input = layer_grad + routed + (ep ? std::max<int64_t>(0, 2 * rows - routed) : 0);
    w.incoming_grad = out;  // d_out
  }
  return w;
}

// experts and mlp (ffn_nodes.cc): the SwiGLU's three gradients beside the incoming gradient and
// the input gradient; `rows` is R or N.
NodeWorkspace ffn_workspace(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  const bool experts = kind == NodeKind::kExperts;
  const int64_t es = s.elem_bytes, h = cfg.hidden_size;
  const int64_t f = experts ? cfg.expert_ffn_size() : cfg.ffn_hidden_size;
  const int64_t rows = experts ? s.expert_rows : s.tokens;
  NodeWorkspace w;
  w.forward = rows * h * es;        // expert_out or the layer's out, handed on
  w.incoming_grad = rows * h * es;  // d_y or d_out
  // + d_act, d_gate_up (2F wide) and the input gradient (d_expert_in or d_n2)
  w.backward_input = w.incoming_grad + 3 * rows * f * es + rows * h * es;
  if (experts) {  // the layer's d_out and d_topk_w, held until attention
    w.backward_input += s.tokens * h * es + s.tokens * cfg.moe_router_topk * s.stat_size();
  }
  if (experts ? s.recompute_experts : recomputes(s.recompute, Recompute::kMlp)) {
    w.forward += 3 * rows * f * es;         // gate, up, act: temporaries of the forward now
    w.backward_input += 3 * rows * f * es;  // formed again: gate, up, and act until adopted
  }
  w.backward_weight = w.incoming_grad + 2 * rows * f * es;
  if (experts) {  // d_out, d_topk_w, d_expert_in
    w.handed = s.tokens * h * es + s.tokens * cfg.moe_router_topk * s.stat_size() + rows * h * es;
  }
  return w;
}

// The shared expert (ffn_nodes.cc), like mlp with its gate: F its output [N,H] (handed to
// combine) and, gated, the gate's logit [N] stat; I the layer's d_out (incoming, held), gated
// d_z [N,H] and d_logit [N], d_act [N,Fs], d_gate_up [N,2Fs], d_n2 [N,H]; W d_z (or d_out),
// d_gate_up, d_logit.
NodeWorkspace shared_expert_workspace(const ModelConfig& cfg, const FootprintShape& s) {
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  const int64_t f = cfg.moe_shared_expert_intermediate_size;
  const bool gated = cfg.moe_shared_expert_gate;
  const int64_t gate_grads = gated ? n * h * es + n * es : 0;  // d_z, d_logit
  NodeWorkspace w;
  w.forward = n * h * es + (gated ? n * s.stat_size() : 0);
  w.incoming_grad = n * h * es;
  w.backward_input = w.incoming_grad + gate_grads + 3 * n * f * es + n * h * es;
  w.backward_weight = w.incoming_grad + gate_grads + 2 * n * f * es;
  if (recomputes(s.recompute, Recompute::kSharedExperts)) {
    // What it would save (gate, up, act; gated z and the gate) is a temporary of the forward,
    // formed again at the input gradient's start (act kept once adopted).
    FootprintShape kept = s;
    kept.recompute = 0;
    const int64_t saved = node_saved_bytes(NodeKind::kSharedExpert, cfg, kept);
    w.forward += saved;
    w.backward_input += saved;
  }
  return w;
}

NodeWorkspace loss_workspace(const ModelConfig& cfg, const FootprintShape& s) {
  const int64_t n = s.tokens, h = cfg.hidden_size, es = s.elem_bytes;
  if (!s.fused_lm_head) {  // the unfused head's logits are saved bytes
    if (cfg.has_mtp()) return mtp_workspace(cfg, s);
    NodeWorkspace w;
    w.backward_input = 2 * n * h * es;  // d_nf, d_x
    return w;
  }
  const int64_t ld = lm_head_padded_vocab(cfg.vocab_size);
  NodeWorkspace w;
  w.forward = lm_head_block_rows(n, ld) * ld * kLmHeadLogitBytes + n * h * es +
              n * (kI32 + s.stat_size() + kF32);  // block, nf, targets, lse, row losses
  w.backward_input = n * h * es;                  // d_x
  // The MTP modules run after the head's block is freed and before d_x exists.
  const NodeWorkspace mtp = mtp_workspace(cfg, s);
  w.forward = std::max(
      w.forward, w.forward - lm_head_block_rows(n, ld) * ld * kLmHeadLogitBytes + mtp.forward);
  w.backward_input = std::max(w.backward_input, mtp.backward_input);
  return w;
}

}  // namespace

NodeWorkspace node_workspace_bytes(NodeKind kind, const ModelConfig& cfg, const FootprintShape& s) {
  switch (kind) {
    case NodeKind::kEmbed: {
      const int64_t out = s.tokens * cfg.hidden_size * s.elem_bytes;
      return {.forward = out, .backward_input = 0, .backward_weight = out, .incoming_grad = 0};
    }
    case NodeKind::kAttention:
      return attention_workspace(cfg, s);
    case NodeKind::kDispatch:
    case NodeKind::kCombine:
      return exchange_workspace(kind, cfg, s);
    case NodeKind::kExperts:
    case NodeKind::kMlp:
      return ffn_workspace(kind, cfg, s);
    case NodeKind::kSharedExpert:
      return shared_expert_workspace(cfg, s);
    case NodeKind::kLoss:
      return loss_workspace(cfg, s);
  }
  return {};
}

ExpertMergeBytes expert_merge_bytes(const ModelConfig& cfg, const FootprintShape& s) {
  const int64_t r = s.expert_rows, h = cfg.hidden_size, f = cfg.expert_ffn_size();
  ExpertMergeBytes b;
  b.waiting = r * (h + 2 * f) * s.elem_bytes;
  b.gathered = r * (2 * h + 3 * f) * s.elem_bytes;
  return b;
}

}  // namespace tandem
