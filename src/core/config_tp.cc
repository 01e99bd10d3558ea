// Tensor and sequence parallelism's rules (config.h, Note [Layout rules]).
#include <string>

#include "core/config.h"
#include "core/error.h"

namespace tandem {

// Note [Tensor parallelism]: as Megatron-LM's, TP ranks (the innermost of the layout,
// comm/layout.h) each hold 1/TP of every attention block and every SwiGLU: heads/TP query heads
// and groups/TP key-value groups (column-parallel q/k/v: rows of Wq, Wk, Wv), the output
// projection's matching columns (row-parallel), gate/up's rows (column-parallel) and down's
// columns (row-parallel). A rank computes its shard as the model of tensor_parallel_shard, and
// two collectives over the tensor-parallel group make the whole layer of it
// (model/nodes.h, tp_row_parallel_forward and tp_input_grad_reduce): the row-parallel products'
// outputs are all-reduced (the residual added once, by tp rank 0), and the input gradient of
// each column-parallel block (at n1 and at n2) is all-reduced before the norm's backward. So every
// tensor between the blocks (the residual stream, the norms' inputs and outputs, their gradients)
// is whole and equal on every tp rank, and so are the norm gains' gradients. The embedding, the
// final norm and the LM head are replicated on every tp rank (not yet vocabulary-parallel): their
// gradients are computed whole, and equal, on each. Megatron-LM splits the vocabulary (and with
// --sequence-parallel the activations between the blocks, along the sequence), so TP must divide
// each of those sizes, and the sequence when SP is on. What runs at TP > 1 so far: dense GQA
// models on CPU ranks, one pipeline stage; the rest is refused below by name
// (docs/parallel.md "Tensor parallelism").
void check_tensor_parallel(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p) {
  const int64_t tp = p.tensor_model_parallel_size;
  TANDEM_CHECK(tp >= 1, "--tensor-model-parallel-size ", tp, " is invalid: it must be >= 1");
  if (tp == 1) return;  // --sequence-parallel then splits nothing (Megatron-LM turns it off)
  const auto divides = [tp](int64_t n, const char* what) {
    TANDEM_CHECK(n % tp == 0, "--tensor-model-parallel-size ", tp, " does not divide ", what, " ",
                 n, ": each tensor-parallel rank holds 1/", tp,
                 " of it; give a size that divides it");
  };
  divides(m.num_attention_heads, "--num-attention-heads");
  if (!m.multi_latent_attention) divides(m.num_query_groups, "--num-query-groups");
  if (!m.is_moe()) divides(m.ffn_hidden_size, "--ffn-hidden-size");
  divides(m.vocab_size, "the vocabulary (--vocab-size, padded)");
  if (p.sequence_parallel) divides(m.seq_length, "--seq-length (with --sequence-parallel)");
  const auto not_built = [tp](bool refused, const std::string& what, const std::string& why) {
    TANDEM_CHECK(!refused, "--tensor-model-parallel-size ", tp, " with ", what,
                 " is not built yet: ", why, "; use --tensor-model-parallel-size 1",
                 " (docs/parallel.md \"Tensor parallelism\")");
  };
  not_built(m.multi_latent_attention, "--multi-latent-attention",
            "MLA's heads and latent projections are not split");
  not_built(m.is_moe(), "--num-experts " + std::to_string(m.num_experts),
            "the MoE layers are not split over tensor-parallel ranks (spread the experts with "
            "--expert-model-parallel-size)");
  not_built(p.sequence_parallel, "--sequence-parallel",
            "the activations between the blocks are not split along the sequence");
  not_built(p.pipeline_model_parallel_size > 1,
            "--pipeline-model-parallel-size " + std::to_string(p.pipeline_model_parallel_size),
            "the tensor-parallel collectives and the pipeline's messages are not yet ordered "
            "between the two CPU streams");
  not_built(t.device != Device::kCPU, "--device cuda",
            "the tensor-parallel group has no NCCL communicator");
  not_built(t.use_distributed_optimizer, "--use-distributed-optimizer",
            "its shards and norm do not yet count the tensor-parallel shards");
  not_built(m.qk_layernorm, "--qk-layernorm",
            "the q/k norm gains' gradients are not summed over the tensor-parallel ranks");
  not_built(m.add_qkv_bias, "--add-qkv-bias", "the q/k/v biases are not split");
  not_built(m.has_mtp(), "--mtp-num-layers " + std::to_string(m.mtp_num_layers),
            "the MTP modules are not split");
  not_built(!t.offload_activations.empty(), "--offload-activations",
            "offloading is not tested with split layers");
}

ModelConfig tensor_parallel_shard(const ModelConfig& m, int64_t tp) {
  ModelConfig s = m;
  s.kv_channels = m.head_dim();  // the heads keep their width when there are fewer of them
  s.num_attention_heads = m.num_attention_heads / tp;
  s.num_query_groups = m.num_query_groups / tp;
  s.ffn_hidden_size = m.ffn_hidden_size / tp;
  return s;
}

}  // namespace tandem
