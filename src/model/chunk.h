// A model chunk: the ordered schedule nodes of the layers a rank holds (plus embed on the first
// stage and loss on the last), run one node at a time for a micro-batch, so that an executor can
// interleave nodes of different micro-batches. Whole-chunk forward/backward are the sequential
// reference that every schedule is compared against.
#pragma once

#include <cstdint>
#include <vector>

#include "model/nodes.h"
#include "model/parameters.h"

namespace tandem::model {

struct NodeRef {
  NodeKind kind;
  int64_t layer;  // index within the chunk's layers; -1 for embed and loss
};

// Layers' aux losses (ops::PendingScalar), waited for and summed in layer order.
inline double sum_aux_losses(std::vector<ops::PendingScalar>& losses) {
  double sum = 0;
  for (ops::PendingScalar& l : losses) sum += l.get();
  return sum;
}

// Everything one micro-batch has in flight inside one chunk.
struct MicroBatchState {
  Tensor ids;       // [N] i32, first stage
  Tensor targets;   // [N] i32, last stage
  Tensor input;     // [N, H] received activation, stages after the first
  Tensor d_output;  // [N, H] received gradient, stages before the last
  // Document masking (Note [Document masking] in data/document_masks.h), every stage: each
  // query's first key, each token's position and the loss mask with its count of tokens of
  // weight 1 (NodeContext's); undefined when off.
  Tensor key_begin, positions, loss_mask;
  int64_t loss_tokens = 0;
  std::vector<int64_t> mtp_loss_tokens;  // NodeContext::mtp_loss_tokens
  EmbedActs embed;
  std::vector<LayerActs> layers;
  LossActs loss;
  // Mean cross-entropy (last stage), as the loss node made it: on a GPU still on its way to the
  // host; lm_loss() waits for it (and throws if a target was outside the vocabulary).
  ops::PendingScalar pending_lm_loss;
  double lm_loss() { return pending_lm_loss.get(); }
  // The chunk's layers' aux losses as their forwards made them (on a GPU still on their way to
  // the host: Note [Reads to the host ahead of use]); aux_loss() waits for them and sums them in
  // layer order.
  std::vector<ops::PendingScalar> aux_losses;
  double aux_loss() { return sum_aux_losses(aux_losses); }
  // The MTP modules' mean cross-entropies L_k, in depth order (last stage, training), and their
  // weight in the loss: mtp_loss_scaling_factor / D. mtp_loss() waits for them: the loss's
  // term weight * sum_k L_k.
  std::vector<ops::PendingScalar> mtp_losses;
  double mtp_weight = 0;
  double mtp_loss() { return mtp_weight * sum_aux_losses(mtp_losses); }

  // The activation to send on (stages before the last) after the forward.
  const Tensor& output() const { return layers.back().out; }
  // The gradient to send back (stages after the first) after the backward.
  const Tensor& d_input() const { return layers.front().d_x; }
};

enum class WeightGrad : uint8_t { kWithBackward, kDeferred };

class ModelChunk {
 public:
  explicit ModelChunk(const Parameters& params);

  const std::vector<NodeRef>& nodes() const { return nodes_; }
  const Parameters& params() const { return *params_; }
  NodeContext context(int64_t batch, double loss_scale) const;

  void forward_node(size_t i, MicroBatchState& mb, const NodeContext& c) const;
  // What of node i's forward may run ahead of it (dispatch: the exchange of counts, Note
  // [Counts ahead of the rows] in moe_exchange.cc); nothing for the other nodes. The forward
  // itself runs it when it has not run.
  void prepare_forward_node(size_t i, MicroBatchState& mb, const NodeContext& c) const;
  void backward_node(size_t i, MicroBatchState& mb, const NodeContext& c) const;
  void backward_weights_node(size_t i, MicroBatchState& mb, const NodeContext& c) const;

  // All nodes in order; backward runs in reverse, each node's weight gradient right after its
  // input gradient unless deferred (then backward_weights() runs them later, same order).
  void forward(MicroBatchState& mb, const NodeContext& c) const;
  void backward(MicroBatchState& mb, const NodeContext& c,
                WeightGrad w = WeightGrad::kWithBackward) const;
  void backward_weights(MicroBatchState& mb, const NodeContext& c) const;

  // Logits [batch*seq, V] of a forward without backward state kept (generation; last stage).
  Tensor infer_logits(const Tensor& ids, int64_t batch, int64_t seq) const;

  // Bytes of live saved state held by node i for mb (checked against footprint.h).
  int64_t node_saved_bytes_live(size_t i, const MicroBatchState& mb) const;

 private:
  const Parameters* params_;
  std::vector<NodeRef> nodes_;
};

}  // namespace tandem::model
