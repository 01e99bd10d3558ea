// Wiring of the nodes of a chunk: which tensor feeds which node, forward and backward.
#include "model/chunk.h"

#include <utility>

namespace tandem::model {

ModelChunk::ModelChunk(const Parameters& params) : params_(&params) {
  const ChunkSpec& s = params.spec();
  if (s.has_embed) nodes_.push_back({NodeKind::kEmbed, -1});
  const ModelConfig& cfg = params.config();
  for (int64_t l = 0; l < s.layer_end - s.layer_begin; ++l) {
    nodes_.push_back({NodeKind::kAttention, l});
    if (cfg.is_moe_layer(s.layer_begin + l)) {
      nodes_.push_back({NodeKind::kDispatch, l});
      // A shared expert after dispatch: its products run while the all-to-all is in flight.
      if (cfg.has_shared_expert()) nodes_.push_back({NodeKind::kSharedExpert, l});
      nodes_.push_back({NodeKind::kExperts, l});
      nodes_.push_back({NodeKind::kCombine, l});
    } else {
      nodes_.push_back({NodeKind::kMlp, l});
    }
  }
  if (s.has_head) nodes_.push_back({NodeKind::kLoss, -1});
}

NodeContext ModelChunk::context(int64_t batch, double loss_scale) const {
  NodeContext c{params_->config(), batch, params_->config().seq_length, params_->activation_dtype(),
                loss_scale};
  c.fused_lm_head = params_->device() != Device::kCPU;
  c.grads = &params_->grads();
  return c;
}

void ModelChunk::prepare_forward_node(size_t i, MicroBatchState& mb, const NodeContext& c) const {
  const NodeRef& node = nodes_.at(i);
  if (node.kind == NodeKind::kDispatch) dispatch_exchange_counts(mb.layers.at(node.layer), c);
}

void ModelChunk::forward_node(size_t i, MicroBatchState& mb, const NodeContext& c) const {
  const NodeRef& node = nodes_.at(i);
  const ModelWeights& w = params_->compute_weights();
  if (mb.layers.empty()) mb.layers.resize(w.layers.size());
  switch (node.kind) {
    case NodeKind::kEmbed:
      embed_forward(mb.embed, mb.ids, w, c);
      return;
    case NodeKind::kAttention: {
      LayerActs& a = mb.layers[node.layer];
      Tensor& src = node.layer > 0 ? mb.layers[node.layer - 1].out
                                   : (params_->spec().has_embed ? mb.embed.out : mb.input);
      a.x = std::exchange(src, Tensor());  // attention holds the layer input from here on
      a.layer = params_->spec().layer_begin + node.layer;
      attention_forward(a, w.layers[node.layer], c);
      mb.aux_losses.push_back(a.aux_loss);
      return;
    }
    case NodeKind::kDispatch:
      dispatch_forward(mb.layers[node.layer], c);
      return;
    case NodeKind::kExperts:
      experts_forward(mb.layers[node.layer], w.layers[node.layer], c);
      return;
    case NodeKind::kCombine:
      combine_forward(mb.layers[node.layer], c);
      return;
    case NodeKind::kMlp:
      mlp_forward(mb.layers[node.layer], w.layers[node.layer], c);
      return;
    case NodeKind::kSharedExpert:
      shared_expert_forward(mb.layers[node.layer], w.layers[node.layer], c);
      return;
    case NodeKind::kLoss: {
      Tensor x = std::exchange(mb.layers.back().out, Tensor());
      loss_forward(mb.loss, x, mb.targets, w, c);
      mb.pending_lm_loss = mb.loss.lm_loss;
      for (const MtpActs& m : mb.loss.mtp) {
        mb.mtp_losses.push_back(m.loss);
        mb.aux_losses.push_back(m.layer.aux_loss);  // the modules' routers' losses
      }
      if (!mb.loss.mtp.empty()) {
        mb.mtp_weight = c.cfg.mtp_loss_scaling_factor / static_cast<double>(c.cfg.mtp_num_layers);
      }
      return;
    }
  }
}

// The gradient arriving at a layer's output: from the next layer, the loss, or the next stage.
static Tensor take_layer_output_grad(MicroBatchState& mb, int64_t layer, bool has_head) {
  const int64_t last = static_cast<int64_t>(mb.layers.size()) - 1;
  if (layer < last) return std::exchange(mb.layers[layer + 1].d_x, Tensor());
  return std::exchange(has_head ? mb.loss.d_x : mb.d_output, Tensor());
}

void ModelChunk::backward_node(size_t i, MicroBatchState& mb, const NodeContext& c) const {
  const NodeRef& node = nodes_.at(i);
  const ModelWeights& w = params_->compute_weights();
  const ModelWeights& g = params_->grads();
  const bool has_head = params_->spec().has_head;
  switch (node.kind) {
    case NodeKind::kEmbed:
      mb.embed.d_out = std::exchange(mb.layers.front().d_x, Tensor());
      embed_backward(mb.embed, c);
      return;
    case NodeKind::kAttention:
      attention_backward(mb.layers[node.layer], w.layers[node.layer], g.layers[node.layer], c);
      return;
    case NodeKind::kDispatch:
      dispatch_backward(mb.layers[node.layer], c);
      return;
    case NodeKind::kExperts:
      experts_backward(mb.layers[node.layer], w.layers[node.layer], c);
      return;
    case NodeKind::kCombine: {
      LayerActs& a = mb.layers[node.layer];
      a.d_out = take_layer_output_grad(mb, node.layer, has_head);
      combine_backward(a, c);
      return;
    }
    case NodeKind::kMlp: {
      LayerActs& a = mb.layers[node.layer];
      a.d_out = take_layer_output_grad(mb, node.layer, has_head);
      mlp_backward(a, w.layers[node.layer], c);
      return;
    }
    case NodeKind::kSharedExpert:
      shared_expert_backward(mb.layers[node.layer], w.layers[node.layer], c);
      return;
    case NodeKind::kLoss:
      loss_backward(mb.loss, w, g, c);
      return;
  }
}

void ModelChunk::backward_weights_node(size_t i, MicroBatchState& mb, const NodeContext& c) const {
  const NodeRef& node = nodes_.at(i);
  const ModelWeights& g = params_->grads();
  switch (node.kind) {
    case NodeKind::kEmbed:
      embed_backward_weights(mb.embed, g, c);
      return;
    case NodeKind::kAttention:
      attention_backward_weights(mb.layers[node.layer], g.layers[node.layer], c);
      return;
    case NodeKind::kExperts:
      experts_backward_weights(mb.layers[node.layer], g.layers[node.layer], c, node.layer);
      return;
    case NodeKind::kMlp:
      mlp_backward_weights(mb.layers[node.layer], g.layers[node.layer], c);
      return;
    case NodeKind::kSharedExpert:
      shared_expert_backward_weights(mb.layers[node.layer], g.layers[node.layer], c);
      return;
    case NodeKind::kLoss:
      loss_backward_weights(mb.loss, g, c);
      return;
    case NodeKind::kDispatch:
    case NodeKind::kCombine:
      return;  // no weights
  }
}

void ModelChunk::forward(MicroBatchState& mb, const NodeContext& c) const {
  for (size_t i = 0; i < nodes_.size(); ++i) forward_node(i, mb, c);
}

void ModelChunk::backward(MicroBatchState& mb, const NodeContext& c, WeightGrad wg) const {
  for (size_t i = nodes_.size(); i-- > 0;) {
    backward_node(i, mb, c);
    if (wg == WeightGrad::kWithBackward) backward_weights_node(i, mb, c);
  }
}

void ModelChunk::backward_weights(MicroBatchState& mb, const NodeContext& c) const {
  for (size_t i = nodes_.size(); i-- > 0;) backward_weights_node(i, mb, c);
}

Tensor ModelChunk::infer_logits(const Tensor& ids, int64_t batch, int64_t seq) const {
  TANDEM_ASSERT(params_->spec().has_embed && params_->spec().has_head);
  TANDEM_CHECK(params_->device() == Device::kCPU,
               "generation runs on the CPU: load the checkpoint there");
  ModelConfig cfg = params_->config();
  cfg.seq_length = seq;
  NodeContext c{cfg, batch, seq, params_->dtype(), 1.0};
  c.mtp = false;  // the LM head's logits only
  MicroBatchState mb;
  mb.ids = ids;
  mb.targets = Tensor::zeros({batch * seq}, DType::kI32, MemCategory::kOther, "infer.targets");
  for (size_t i = 0; i < nodes_.size(); ++i) forward_node(i, mb, c);
  return mb.loss.logits;  // the rest of the state is freed with mb
}

int64_t ModelChunk::node_saved_bytes_live(size_t i, const MicroBatchState& mb) const {
  const NodeRef& node = nodes_.at(i);
  if (node.kind == NodeKind::kEmbed) return live_bytes(saved_tensors(mb.embed));
  if (node.kind == NodeKind::kLoss) return live_bytes(saved_tensors(mb.loss));
  return live_bytes(saved_tensors(node.kind, mb.layers[node.layer]));
}

}  // namespace tandem::model
