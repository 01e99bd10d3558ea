// The weights of one model chunk (a range of layers, the embedding on the first stage, the head
// on the last, a range of experts), carved from one allocation per kind (parameters, gradients,
// Adam moments) so their lifetimes are obvious. Names and layouts are Hugging Face's
// (docs/model.md "Checkpoint names").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "model/expert_placement.h"

namespace tandem::model {

// What part of the model a rank holds.
struct ChunkSpec {
  int64_t layer_begin = 0, layer_end = 0;    // [begin, end) of the model's layers
  bool has_embed = true;                     // first pipeline stage
  bool has_head = true;                      // last pipeline stage: final norm + LM head
  int64_t expert_begin = 0, expert_end = 0;  // [begin, end) of each MoE layer's places
  ExpertPlacement placement;  // which expert is at each place (Note [Expert placement])
  // Note [Tensor parallelism] (core/config_tp.cc): the chunk's shard of each attention block and
  // SwiGLU, tp_rank's of tp.
  int64_t tp = 1, tp_rank = 0;

  static ChunkSpec whole(const ModelConfig& cfg);
  // The multi-token prediction modules the chunk holds: all of them on the last stage.
  int64_t mtp_layers(const ModelConfig& cfg) const { return has_head ? cfg.mtp_num_layers : 0; }
  // The transformer layers the chunk holds: its range, then its MTP modules' layers.
  int64_t held_layers(const ModelConfig& cfg) const {
    return layer_end - layer_begin + mtp_layers(cfg);
  }
};

// How a parameter is treated by the optimizer and the gradient reduction.
// Matrices take weight decay; norm gains start at one, biases at zero. A buffer (the expert bias
// of a sigmoid router) starts at zero and has no gradient: AdamW leaves it (a zero gradient moves
// nothing), and it changes only as its own rule says (Note [Expert bias] in
// runtime/expert_bias.h), but it is saved, loaded and laid out as the parameters are.
enum class ParamKind : uint8_t { kMatrix, kNorm, kEmbedding, kBias, kBuffer };
enum class ParamShard : uint8_t { kDense, kExpert };  // expert weights reduce over expert-DP
// Note [Tensor-parallel shards]: what of the model's tensor an entry holds at TP > 1 (Note
// [Tensor parallelism] in core/config_tp.cc): all of it (replicated on every tp rank), tp_rank's
// block of rows (column-parallel q/k/v, gate, up: the rows of its heads, groups or FFN columns)
// or its block of columns (row-parallel o and down). Initialisation draws each element as the
// whole model's element it is (Parameters::model_index), so the shards of a seed make up the TP
// 1 model of that seed.
enum class TpSplit : uint8_t { kReplicated, kRows, kColumns };

struct ParamEntry {
  std::string name;  // Hugging Face name
  Shape shape;       // [out, in] for matrices
  ParamKind kind;
  ParamShard shard;
  double init_std;  // matrices and embeddings: N(0, init_std); norms one, biases zero
  int64_t offset;   // in elements, within the flat buffers
  TpSplit tp_split = TpSplit::kReplicated;
};

struct LayerWeights {
  Tensor input_norm, post_norm;  // [H]
  Tensor wq, wk, wv;             // [heads*D, H], [kv*D, H], [kv*D, H]
  Tensor wo;                     // [H, heads*D]
  Tensor bq, bk, bv;             // --add-qkv-bias: [heads*D], [kv*D], [kv*D]; else undefined
  Tensor q_norm, k_norm;         // --qk-layernorm: [D]; else undefined
  // --multi-latent-attention (then wk, wv are undefined, and wq is [heads*(dn+dr), H] when there
  // is no q latent): q's latent [rq, H], its norm [rq] and q from it [heads*(dn+dr), rq]; the kv
  // latent over k's rope part [rkv + dr, H], the latent's norm [rkv], and each head's k nope
  // part over its v from the latent [heads*(dn+dv), rkv]. wo is [H, heads*dv].
  Tensor wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wkv_b;
  // Dense layers: gate_proj over up_proj, [2F, H] (the two are adjacent in the flat buffers, so one
  // product forms both: Note [Gate and up in one product] in ffn_nodes.cc), and down, [H, F].
  Tensor w_gate_up, w_down;
  Tensor router;  // MoE layers: [E, H]
  // Sigmoid router with --moe-router-enable-expert-bias: the expert bias [E] (kBuffer), and in
  // the weights' views only, the step's tally of rows routed to each expert [E] f32 (kOther).
  Tensor expert_bias, expert_load;
  // --moe-router-load-balancing-type global_aux_loss, in the weights' views only: the step's
  // running totals of the layer's counts [E + 1] f64 (ops::router_aux_running_mean).
  Tensor aux_total;
  // MoE layers, local experts (the chunk's places, in order): gate over up, [2Fe, H], and down,
  // [H, Fe] (Fe: ModelConfig::expert_ffn_size()).
  std::vector<Tensor> e_gate_up, e_down;
  // In the gradients' views of MoE layers with local experts only: set by
  // Parameters::mark_experts_fresh (zero_grads_for_backward calls it) while the experts'
  // gradients hold the last step's values, cleared by the layer's first weight-gradient pass,
  // which writes them instead of adding (Note [Expert gradients written first]). Null elsewhere.
  bool* experts_grad_fresh = nullptr;
  // MoE with a shared expert: gate over up, [2Fs, H], and down, [H, Fs]; its gate [1, H] with
  // --moe-shared-expert-gate. Undefined otherwise.
  Tensor shared_gate_up, shared_down, shared_gate;
  bool moe() const { return router.defined(); }  // a MoE layer (else dense)
  // MoE with the layer's experts out of order: [E] i32, each expert's place
  // (Note [Expert placement]); undefined when expert e is at place e.
  Tensor expert_slot;
};

// A multi-token prediction module (the last stage's, docs/model.md "Multi-token prediction"):
// the gains of the embedding's and the hidden state's norms, the projection of the two normed
// [emb | h] (columns 0..H-1 the embedding's), its transformer layer and its final norm.
struct MtpWeights {
  Tensor enorm, hnorm;  // [H]
  Tensor eh_proj;       // [H, 2H]
  Tensor final_norm;    // [H]
  LayerWeights layer;
};

// Note [Tied embeddings]: unless --untie-embeddings-and-output-weights, the output layer is the
// embedding table E [V, H] (Megatron-LM's default): logits = h E^T, and E's gradient is the sum
// of the lookup's and the product's. A chunk that holds both ends (one pipeline stage) has one
// tensor, model.embed_tokens.weight, which ModelWeights::embed and ::lm_head both view, so the
// two uses add into one gradient. With several stages the first holds E and the last a copy under
// the same name, in the head's place of its flat buffers (tied_copy()); both are drawn from the
// stream of (seed, name), so they start equal. After the backward the two gradients are summed
// between the stages that hold them (Note [The embedding group] in runtime/grad_reduce.cc), so the
// copies take the same update and stay bitwise equal. The gradient norm counts the first stage's
// only, a checkpoint keeps it once, and the planner counts it on both stages.
struct ModelWeights {
  Tensor embed;                      // [V, H]; first stage
  Tensor final_norm;                 // [H]
  Tensor lm_head;                    // [V, H]; tied: a view of embed, or on a last stage the copy
  std::vector<LayerWeights> layers;  // the chunk's layers, in order
  std::vector<MtpWeights> mtp;       // the last stage's MTP modules, in depth order
};

// The prefix of MTP module j's weights: model.layers.{L + j}. (DeepSeek-V3's checkpoint names).
std::string mtp_prefix(const ModelConfig& cfg, int64_t j);
// Held layer i of a chunk's weights: its layers, then its MTP modules' layers.
LayerWeights& held_layer(ModelWeights& w, int64_t i);
const LayerWeights& held_layer(const ModelWeights& w, int64_t i);

class Parameters {
 public:
  // dtype: of the master weights, gradients and optimizer state (f32, or f64 for gradient
  // checks). On the GPU the buffers live in device memory and a bf16 copy of the weights feeds
  // the matrix products (Note [Compute copy]).
  Parameters(const ModelConfig& cfg, const ChunkSpec& spec, DType dtype,
             Device device = Device::kCPU);
  // The entries (names, shapes, offsets) a chunk of `cfg` holds, with nothing allocated: what a
  // checkpoint is checked against where no rank holds the whole model.
  static std::vector<ParamEntry> entries_of(const ModelConfig& cfg, const ChunkSpec& spec);
  // Note [Tensor-parallel shards]: the index in the whole model's tensor of element i of entry
  // e's shard (i itself at TP 1 and for a replicated entry).
  int64_t model_index(const ParamEntry& e, int64_t i) const;

  // The model this chunk computes: at TP > 1 one tensor-parallel rank's shard of it
  // (tensor_parallel_shard in core/config.h).
  const ModelConfig& config() const { return cfg_; }
  const ChunkSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // The activations' dtype: bf16 on the GPU, else the master dtype.
  DType activation_dtype() const { return device_ == Device::kCPU ? dtype_ : DType::kBF16; }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  int64_t numel() const { return flat_params_.numel(); }
  // Note [Tied embeddings]: the entry whose gradient is summed with another stage's (tied, and
  // the chunk holds one end of the model: the table on the first stage, its copy on the last);
  // null elsewhere.
  const ParamEntry* shared_embedding() const;
  // The last stage's copy (shared_embedding() of a chunk without the embedding), else null.
  const ParamEntry* tied_copy() const { return spec_.has_embed ? nullptr : shared_embedding(); }

  // Views into the flat parameter and gradient buffers.
  const ModelWeights& weights() const { return weights_; }
  const ModelWeights& grads() const { return grads_; }
  // Note [Compute copy]: what the nodes multiply with. On the CPU the master weights
  // themselves; on the GPU a bf16 copy, refreshed after every change of the master weights: by
  // refresh_compute_copy() after initialisation, loading and copying, and by AdamW::step in the
  // same pass as the update (runtime/optimizer.h).
  const ModelWeights& compute_weights() const {
    return device_ == Device::kCPU ? weights_ : compute_;
  }
  void refresh_compute_copy();
  // The bf16 copy's flat buffer (like flat_params); undefined on the CPU, which has none.
  const Tensor& flat_compute() const { return flat_compute_; }
  Tensor param(const ParamEntry& e) const { return view(flat_params_, e); }
  Tensor grad(const ParamEntry& e) const { return view(flat_grads_, e); }
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  // The step's rows per expert of every layer, [chunk layers, E] f32 (sigmoid router with
  // --moe-router-enable-expert-bias; undefined otherwise); the attention nodes add to it.
  const Tensor& expert_load() const { return flat_load_; }
  // global_aux_loss's running totals of every layer, [chunk layers, E + 1] f64 (ops::
  // router_aux_running_mean; undefined without that loss); each step starts them at 0.
  const Tensor& aux_total() const { return flat_aux_total_; }

  // docs/model.md's initialisation, each tensor drawn from a stream keyed by (seed, name), so any
  // chunk or expert range of the model gets the same values as the whole model.
  void initialize(uint64_t seed);
  // Copies every master weight from `other` (same entries; any device); refreshes the copy.
  void copy_weights_from(const Parameters& other);
  void zero_grads();
  // Note [Expert gradients written first]: a step's gradients start at zero and every node's
  // weight-gradient pass adds to them. The local experts' gradients are most of a fine-grained
  // model's (2.4 of 3.1 billion at shape (c)), and adding to zeros costs a pass that writes them
  // (zeroing) and one that reads the zeros (the first micro-batch's products, which add into
  // the f32 gradients). So before a training backward the trainers call this instead of
  // zero_grads: it zeroes every gradient but the local experts', and marks each MoE layer's
  // experts fresh (LayerWeights::experts_grad_fresh); the layer's first weight-gradient pass of
  // the step then overwrites them (an expert without rows in that micro-batch is zeroed), and
  // later passes add. The values are those of adding to zeros (x + 0 = x). Until that first pass
  // the experts' gradients hold the previous step's values: only a backward may follow.
  // A deferred update (Note [Deferred update] in runtime/optimizer.cc) zeroes the gradients as
  // it reads them, piece by piece during the next step's forward: it zeroes all but the local
  // experts' (zero_grads_outside_experts), and the trainer marks the experts fresh at that
  // step's start (mark_experts_fresh). Each layer's piece runs before the layer's first forward
  // of the step, so before its first weight-gradient pass.
  void zero_grads_for_backward();
  // The gradients in the flat range [begin, end) but for the local experts', zeroed.
  void zero_grads_outside_experts(int64_t begin, int64_t end);
  // Each MoE layer's experts fresh: its next weight-gradient pass writes their gradients.
  void mark_experts_fresh();
  // Lays the experts out as `p` says (Note [Expert placement]): renames the local experts'
  // entries and views (their offsets stay, as every expert has the same shapes). Only the names
  // change: moving the values (and the optimizer's) to their new places is the caller's job.
  void set_placement(const ExpertPlacement& p);

 private:
  struct EntriesOnly {};
  Parameters(const ModelConfig& cfg, const ChunkSpec& spec, EntriesOnly);
  void add(const std::string& name, Shape shape, ParamKind kind, ParamShard shard, double std,
           TpSplit split = TpSplit::kReplicated);
  void build_entries();
  // One transformer layer's entries and views; l: the model's index (num_layers + j for MTP
  // module j's), row: its row among the chunk's held layers.
  void add_layer_entries(int64_t l);
  using NameIndex = std::unordered_map<std::string, const ParamEntry*>;
  LayerWeights layer_views(const Tensor& flat, const NameIndex& by_name, int64_t l,
                           int64_t row) const;
  void build_views();
  ModelWeights make_views(const Tensor& flat) const;
  static Tensor view(const Tensor& flat, const ParamEntry& e);

  ModelConfig cfg_;
  ChunkSpec spec_;
  DType dtype_;
  Device device_;
  std::vector<ParamEntry> entries_;
  int64_t total_ = 0;
  Tensor flat_params_, flat_grads_, flat_compute_;
  Tensor flat_aux_total_;  // the MoE layers' aux_total, [chunk layers, E + 1] f64, or undefined
  Tensor flat_load_;       // the MoE layers' expert_load, [chunk layers, E] f32; undefined without
  Tensor expert_slots_;    // [chunk layers, E] i32, on the device; undefined when contiguous
  ModelWeights weights_, grads_, compute_;
  // zero_grads_for_backward's ranges of the flat gradient buffer (all but the local experts')
  // and its flags, one per chunk layer.
  std::vector<std::pair<int64_t, int64_t>> non_expert_ranges_;
  std::shared_ptr<bool[]> experts_fresh_;
};

}  // namespace tandem::model
