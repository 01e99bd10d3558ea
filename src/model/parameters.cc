// Parameter registry, flat buffers and initialisation (docs/model.md "Initialisation").
#include "model/parameters.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/families.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace tandem::model {

ChunkSpec ChunkSpec::whole(const ModelConfig& cfg) {
  ChunkSpec s;
  s.layer_end = cfg.num_layers;
  s.expert_end = cfg.num_experts;
  return s;
}

// The model a chunk computes: its tensor-parallel shard (Note [Tensor parallelism]).
static ModelConfig chunk_config(const ModelConfig& cfg, const ChunkSpec& spec) {
  TANDEM_ASSERT(spec.tp >= 1 && spec.tp_rank >= 0 && spec.tp_rank < spec.tp, "tp rank ",
                spec.tp_rank, " of ", spec.tp);
  return spec.tp > 1 ? tensor_parallel_shard(cfg, spec.tp) : cfg;
}

Parameters::Parameters(const ModelConfig& cfg, const ChunkSpec& spec, DType dtype, Device device)
    : cfg_(chunk_config(cfg, spec)), spec_(spec), dtype_(dtype), device_(device) {
  TANDEM_ASSERT(dtype == DType::kF32 || dtype == DType::kF64);
  check_placement(spec.placement, cfg.num_layers, cfg.num_experts);
  TANDEM_CHECK(device == Device::kCPU || dtype == DType::kF32,
               "GPU parameters are f32 (master weights), not ", dtype_name(dtype));
  build_entries();
  if (cfg.moe_router_enable_expert_bias) {
    flat_load_ = Tensor::zeros({spec.held_layers(cfg), cfg.num_experts}, DType::kF32,
                               MemCategory::kOther, "expert_load", device);
  }
  if (cfg.has_global_balance_loss()) {
    flat_aux_total_ = Tensor::zeros({spec.held_layers(cfg), cfg.num_experts + 1}, DType::kF64,
                                    MemCategory::kOther, "aux_total", device);
  }
  flat_params_ = Tensor::zeros({total_}, dtype, MemCategory::kParameter, "parameters", device);
  flat_grads_ = Tensor::zeros({total_}, dtype, MemCategory::kGradient, "gradients", device);
  if (device != Device::kCPU) {
    flat_compute_ =
        Tensor::zeros({total_}, DType::kBF16, MemCategory::kParameter, "parameters.bf16", device);
  }
  build_views();
}

Parameters::Parameters(const ModelConfig& cfg, const ChunkSpec& spec, EntriesOnly)
    : cfg_(chunk_config(cfg, spec)), spec_(spec), dtype_(DType::kF32), device_(Device::kCPU) {
  check_placement(spec.placement, cfg.num_layers, cfg.num_experts);
  build_entries();
}

std::vector<ParamEntry> Parameters::entries_of(const ModelConfig& cfg, const ChunkSpec& spec) {
  Parameters names(cfg, spec, EntriesOnly{});
  return std::move(names.entries_);
}

void Parameters::build_views() {
  // Each layer's place of every expert, for the attention node's sort (Note [Expert placement]).
  expert_slots_ = Tensor();
  const int64_t layers = spec_.layer_end - spec_.layer_begin, e = cfg_.num_experts;
  bool contiguous = true;
  for (int64_t l = spec_.layer_begin; l < spec_.layer_end; ++l) {
    contiguous = contiguous && spec_.placement.contiguous(l);
  }
  if (cfg_.is_moe() && !contiguous) {
    const Tensor host = Tensor::empty({layers, e}, DType::kI32, MemCategory::kOther,
                                      "expert_slot.host", Device::kCPU);
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<int32_t> places = spec_.placement.places(spec_.layer_begin + l, e);
      std::copy(places.begin(), places.end(), host.data<int32_t>() + l * e);
    }
    expert_slots_ =
        Tensor::empty({layers, e}, DType::kI32, MemCategory::kOther, "expert_slot", device_);
    expert_slots_.copy_from(host);
  }
  weights_ = make_views(flat_params_);
  grads_ = make_views(flat_grads_);
  // Note [Expert gradients written first]: the flat ranges outside the local experts' entries
  // (one run of them a MoE layer; the entries lie in offset order, add() appends), and a flag
  // for each MoE layer with local experts.
  non_expert_ranges_.clear();
  int64_t at = 0;  // the end of the last expert entry seen
  for (const ParamEntry& en : entries_) {
    if (en.shard != ParamShard::kExpert) continue;
    if (en.offset > at) non_expert_ranges_.emplace_back(at, en.offset);
    at = en.offset + shape_numel(en.shape);
  }
  if (total_ > at) non_expert_ranges_.emplace_back(at, total_);
  // Per held layer (the chunk's, then its MTP modules'): the fresh flags, the load tally and
  // global_aux_loss's totals.
  const int64_t held = spec_.held_layers(cfg_);
  experts_fresh_ =
      std::shared_ptr<bool[]>(new bool[static_cast<size_t>(std::max<int64_t>(held, 1))]());
  for (int64_t l = 0; l < held; ++l) {
    LayerWeights& g = held_layer(grads_, l);
    if (!g.e_gate_up.empty()) g.experts_grad_fresh = &experts_fresh_[static_cast<size_t>(l)];
    LayerWeights& w = held_layer(weights_, l);
    if (w.moe() && flat_load_.defined()) w.expert_load = flat_load_.narrow_rows(l, 1).reshape({e});
    if (w.moe() && flat_aux_total_.defined()) {
      w.aux_total = flat_aux_total_.narrow_rows(l, 1).reshape({e + 1});
    }
  }
  if (device_ == Device::kCPU) return;
  compute_ = make_views(flat_compute_);
  // The router reads the expert bias in f32 (it decides ties between scores a bf16 copy would
  // merge), and the load tally is one tensor: the compute views share the master's.
  for (int64_t l = 0; l < held; ++l) {
    LayerWeights& c = held_layer(compute_, l);
    const LayerWeights& w = held_layer(weights_, l);
    c.expert_bias = w.expert_bias;
    c.expert_load = w.expert_load;
    c.aux_total = w.aux_total;
  }
}

void Parameters::set_placement(const ExpertPlacement& p) {
  check_placement(p, cfg_.num_layers, cfg_.num_experts);
  const std::vector<ParamEntry> before = std::move(entries_);
  entries_.clear();
  total_ = 0;
  spec_.placement = p;
  build_entries();
  TANDEM_ASSERT(entries_.size() == before.size() && total_ == flat_params_.numel());
  for (size_t i = 0; i < before.size(); ++i) {
    TANDEM_ASSERT(entries_[i].offset == before[i].offset && entries_[i].shape == before[i].shape);
  }
  build_views();
}

void Parameters::refresh_compute_copy() {
  if (device_ != Device::kCPU) ops::convert(flat_compute_, flat_params_);
}

void Parameters::copy_weights_from(const Parameters& other) {
  TANDEM_CHECK(other.total_ == total_ && other.dtype_ == dtype_,
               "copying weights between different parameter layouts");
  flat_params_.copy_from(other.flat_params_);
  refresh_compute_copy();
}

void Parameters::add(const std::string& name, Shape shape, ParamKind kind, ParamShard shard,
                     double std, TpSplit split) {
  entries_.push_back({name, shape, kind, shard, std, total_, split});
  total_ += shape_numel(shape);
}

int64_t Parameters::model_index(const ParamEntry& e, int64_t i) const {
  const int64_t tp = spec_.tp, r = spec_.tp_rank;
  switch (e.tp_split) {
    case TpSplit::kReplicated:
      return i;
    case TpSplit::kRows:  // rank r's rows follow the r ranks' before it
      return r * shape_numel(e.shape) + i;
    case TpSplit::kColumns: {  // [out, in/tp] of [out, in]: row i / cols, rank r's column block
      const int64_t cols = e.shape.back();
      return i / cols * cols * tp + r * cols + i % cols;
    }
  }
  return i;
}

namespace {

// The Hugging Face names of a layer's weights in the family the model is saved as
// (docs/model.md "Checkpoint names"): Mixtral's experts are block_sparse_moe.experts.{e}.w1 (gate),
// w3 (up), w2 (down); the Qwen and DeepSeek-V3 families' are mlp.experts.{e}.gate_proj, up_proj,
// down_proj; the shared expert is Qwen2-MoE's mlp.shared_expert, DeepSeek-V3's mlp.shared_experts.
struct LayerNames {
  explicit LayerNames(const ModelConfig& c, int64_t l)
      : p("model.layers." + std::to_string(l) + "."),
        mixtral(family_of(c) == ModelFamily::kMixtral),
        moe(p + (mixtral ? "block_sparse_moe." : "mlp.")),
        shared(moe +
               (family_of(c) == ModelFamily::kDeepseekV3 ? "shared_experts." : "shared_expert.")) {}
  std::string expert(int64_t e) const { return moe + "experts." + std::to_string(e) + "."; }
  std::string gate(const std::string& q) const {
    return q + (mixtral ? "w1" : "gate_proj") + ".weight";
  }
  std::string up(const std::string& q) const {
    return q + (mixtral ? "w3" : "up_proj") + ".weight";
  }
  std::string down(const std::string& q) const {
    return q + (mixtral ? "w2" : "down_proj") + ".weight";
  }

  std::string p;  // model.layers.{l}.
  bool mixtral;
  std::string moe;     // the MoE block's prefix
  std::string shared;  // the shared expert's prefix
};

// Multi-head latent attention's matrices and norms (docs/model.md "Checkpoint names").
void mla_entries(const ModelConfig& c, const std::string& p,
                 const std::function<void(const std::string&, Shape, double)>& matrix,
                 const std::function<void(const std::string&, int64_t)>& gain) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, rq = c.q_lora_rank;
  const int64_t rkv = c.kv_lora_rank;
  const double std = c.init_method_std;
  if (rq > 0) {
    matrix(p + "self_attn.q_a_proj.weight", {rq, h}, std);
    gain(p + "self_attn.q_a_layernorm.weight", rq);
    matrix(p + "self_attn.q_b_proj.weight", {c.q_width(), rq}, std);
  } else {
    matrix(p + "self_attn.q_proj.weight", {c.q_width(), h}, std);
  }
  matrix(p + "self_attn.kv_a_proj_with_mqa.weight", {rkv + c.qk_pos_emb_head_dim, h}, std);
  gain(p + "self_attn.kv_a_layernorm.weight", rkv);
  matrix(p + "self_attn.kv_b_proj.weight", {heads * (c.qk_head_dim + c.v_head_dim), rkv}, std);
}

}  // namespace

void Parameters::add_layer_entries(int64_t l) {
  const ModelConfig& c = cfg_;
  const int64_t h = c.hidden_size, f = c.ffn_hidden_size, fe = c.expert_ffn_size();
  const int64_t fs = c.moe_shared_expert_intermediate_size;
  const double std = c.init_method_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  const auto matrix = [&](const std::string& name, Shape shape, double sd,
                          ParamShard shard = ParamShard::kDense) {
    add(name, std::move(shape), ParamKind::kMatrix, shard, sd);
  };
  const auto gain = [&](const std::string& name, int64_t n) {
    add(name, {n}, ParamKind::kNorm, ParamShard::kDense, 0);
  };
  // Note [Tensor-parallel shards]: of a dense GQA layer, q/k/v and gate/up split by rows, o and
  // down by columns (the shapes are the shard's, cfg_ being the chunk's shard of the model).
  const auto split = [&](const std::string& name, Shape shape, double sd, TpSplit how) {
    add(name, std::move(shape), ParamKind::kMatrix, ParamShard::kDense, sd, how);
  };
  const LayerNames n(c, l);
  const std::string& p = n.p;
  gain(p + "input_layernorm.weight", h);
  if (c.multi_latent_attention) {
    mla_entries(
        c, p,
        [&](const std::string& name, Shape shape, double sd) {
          matrix(name, std::move(shape), sd);
        },
        gain);
  } else {
    split(p + "self_attn.q_proj.weight", {c.q_width(), h}, std, TpSplit::kRows);
    split(p + "self_attn.k_proj.weight", {c.kv_width(), h}, std, TpSplit::kRows);
    split(p + "self_attn.v_proj.weight", {c.kv_width(), h}, std, TpSplit::kRows);
  }
  if (c.add_qkv_bias) {
    for (const char* b : {"q", "k", "v"}) {
      add(p + "self_attn." + b + "_proj.bias", {b[0] == 'q' ? c.q_width() : c.kv_width()},
          ParamKind::kBias, ParamShard::kDense, 0);
    }
  }
  if (c.qk_layernorm) {
    gain(p + "self_attn.q_norm.weight", c.head_dim());
    gain(p + "self_attn.k_norm.weight", c.head_dim());
  }
  split(p + "self_attn.o_proj.weight", {h, c.attn_out_width()}, out_std, TpSplit::kColumns);
  gain(p + "post_attention_layernorm.weight", h);
  if (!c.is_moe_layer(l)) {
    split(p + "mlp.gate_proj.weight", {f, h}, std, TpSplit::kRows);
    split(p + "mlp.up_proj.weight", {f, h}, std, TpSplit::kRows);
    split(p + "mlp.down_proj.weight", {h, f}, out_std, TpSplit::kColumns);
    return;
  }
  matrix(n.moe + "gate.weight", {c.num_experts, h}, std);
  if (c.moe_router_enable_expert_bias) {
    add(n.moe + "gate.e_score_correction_bias", {c.num_experts}, ParamKind::kBuffer,
        ParamShard::kDense, 0);
  }
  if (c.has_shared_expert()) {
    const std::string& q = n.shared;
    matrix(q + "gate_proj.weight", {fs, h}, std);
    matrix(q + "up_proj.weight", {fs, h}, std);
    matrix(q + "down_proj.weight", {h, fs}, out_std);
    if (c.moe_shared_expert_gate) matrix(n.moe + "shared_expert_gate.weight", {1, h}, std);
  }
  for (int64_t e = spec_.expert_begin; e < spec_.expert_end; ++e) {
    const std::string q = n.expert(spec_.placement.expert_at(l, e));
    matrix(n.gate(q), {fe, h}, std, ParamShard::kExpert);
    matrix(n.up(q), {fe, h}, std, ParamShard::kExpert);
    matrix(n.down(q), {h, fe}, out_std, ParamShard::kExpert);
  }
}

void Parameters::build_entries() {
  const ModelConfig& c = cfg_;
  const int64_t h = c.hidden_size;
  const double std = 0.02;
  const auto gain = [&](const std::string& name, int64_t n) {
    add(name, {n}, ParamKind::kNorm, ParamShard::kDense, 0);
  };
  if (spec_.has_embed) {
    add("model.embed_tokens.weight", {c.vocab_size, h}, ParamKind::kEmbedding, ParamShard::kDense,
        std);
  }
  for (int64_t l = spec_.layer_begin; l < spec_.layer_end; ++l) add_layer_entries(l);
  if (spec_.has_head) {
    gain("model.norm.weight", h);
    // Note [Tied embeddings]: tied, the head reads the embedding, or on a stage without it a copy.
    if (!c.tied_embeddings()) {
      add("lm_head.weight", {c.vocab_size, h}, ParamKind::kMatrix, ParamShard::kDense, std);
    } else if (!spec_.has_embed) {
      add("model.embed_tokens.weight", {c.vocab_size, h}, ParamKind::kEmbedding, ParamShard::kDense,
          std);
    }
  }
  // The MTP modules after the head (the head's unit of the flat buffers), under DeepSeek-V3's
  // names: module j is model.layers.{L + j}.
  for (int64_t j = 0; j < spec_.mtp_layers(c); ++j) {
    const std::string p = mtp_prefix(c, j);
    gain(p + "enorm.weight", h);
    gain(p + "hnorm.weight", h);
    add(p + "eh_proj.weight", {h, 2 * h}, ParamKind::kMatrix, ParamShard::kDense, std);
    add_layer_entries(c.num_layers + j);
    gain(p + "shared_head.norm.weight", h);
  }
}

const ParamEntry* Parameters::shared_embedding() const {
  if (!cfg_.tied_embeddings() || spec_.has_head == spec_.has_embed) return nullptr;
  for (const ParamEntry& e : entries_) {
    if (e.name == "model.embed_tokens.weight") return &e;
  }
  TANDEM_ASSERT(false, "a tied stage without its embedding table");
  return nullptr;
}

Tensor Parameters::view(const Tensor& flat, const ParamEntry& e) {
  return flat.narrow_rows(e.offset, shape_numel(e.shape)).reshape(e.shape);
}

std::string mtp_prefix(const ModelConfig& cfg, int64_t j) {
  return "model.layers." + std::to_string(cfg.num_layers + j) + ".";
}

LayerWeights& held_layer(ModelWeights& w, int64_t i) {
  const auto n = static_cast<int64_t>(w.layers.size());
  return i < n ? w.layers[static_cast<size_t>(i)] : w.mtp.at(static_cast<size_t>(i - n)).layer;
}

const LayerWeights& held_layer(const ModelWeights& w, int64_t i) {
  return held_layer(const_cast<ModelWeights&>(w), i);
}

LayerWeights Parameters::layer_views(const Tensor& flat, const NameIndex& by_name, int64_t l,
                                     int64_t row) const {
  auto entry = [&](const std::string& name) -> const ParamEntry& {
    auto it = by_name.find(name);
    TANDEM_ASSERT(it != by_name.end(), "no parameter ", name);
    return *it->second;
  };
  auto get = [&](const std::string& name) { return view(flat, entry(name)); };
  const auto maybe = [&](const std::string& name) {
    return by_name.count(name) ? get(name) : Tensor();
  };
  // The [2F, H] view of gate and up, which the constructor places one after the other.
  auto stacked = [&](const std::string& gate, const std::string& up) {
    const ParamEntry& g = entry(gate);
    const ParamEntry& u = entry(up);
    TANDEM_ASSERT(g.shape == u.shape && u.offset == g.offset + shape_numel(g.shape), gate, " and ",
                  up, " are not adjacent");
    return flat.narrow_rows(g.offset, 2 * shape_numel(g.shape))
        .reshape({2 * g.shape[0], g.shape[1]});
  };
  const LayerNames n(cfg_, l);
  const std::string& p = n.p;
  LayerWeights lw;
  lw.input_norm = get(p + "input_layernorm.weight");
  lw.post_norm = get(p + "post_attention_layernorm.weight");
  lw.wq = maybe(p + "self_attn.q_proj.weight");
  lw.wk = maybe(p + "self_attn.k_proj.weight");
  lw.wv = maybe(p + "self_attn.v_proj.weight");
  lw.wq_a = maybe(p + "self_attn.q_a_proj.weight");
  lw.q_a_norm = maybe(p + "self_attn.q_a_layernorm.weight");
  lw.wq_b = maybe(p + "self_attn.q_b_proj.weight");
  lw.wkv_a = maybe(p + "self_attn.kv_a_proj_with_mqa.weight");
  lw.kv_a_norm = maybe(p + "self_attn.kv_a_layernorm.weight");
  lw.wkv_b = maybe(p + "self_attn.kv_b_proj.weight");
  lw.wo = get(p + "self_attn.o_proj.weight");
  lw.bq = maybe(p + "self_attn.q_proj.bias");
  lw.bk = maybe(p + "self_attn.k_proj.bias");
  lw.bv = maybe(p + "self_attn.v_proj.bias");
  lw.q_norm = maybe(p + "self_attn.q_norm.weight");
  lw.k_norm = maybe(p + "self_attn.k_norm.weight");
  if (!cfg_.is_moe_layer(l)) {
    lw.w_gate_up = stacked(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight");
    lw.w_down = get(p + "mlp.down_proj.weight");
    return lw;
  }
  lw.router = get(n.moe + "gate.weight");
  lw.expert_bias = maybe(n.moe + "gate.e_score_correction_bias");
  if (cfg_.has_shared_expert()) {
    const std::string& q = n.shared;
    lw.shared_gate_up = stacked(q + "gate_proj.weight", q + "up_proj.weight");
    lw.shared_down = get(q + "down_proj.weight");
    lw.shared_gate = maybe(n.moe + "shared_expert_gate.weight");
  }
  // The MTP modules' layers keep every expert at its own place (the placement covers the model's
  // layers only).
  if (expert_slots_.defined() && l < cfg_.num_layers) {
    lw.expert_slot = expert_slots_.narrow_rows(row, 1).reshape({cfg_.num_experts});
  }
  for (int64_t e = spec_.expert_begin; e < spec_.expert_end; ++e) {
    const std::string q = n.expert(spec_.placement.expert_at(l, e));
    lw.e_gate_up.push_back(stacked(n.gate(q), n.up(q)));
    lw.e_down.push_back(get(n.down(q)));
  }
  return lw;
}

ModelWeights Parameters::make_views(const Tensor& flat) const {
  NameIndex by_name;
  for (const ParamEntry& e : entries_) by_name[e.name] = &e;
  auto entry = [&](const std::string& name) -> const ParamEntry& {
    auto it = by_name.find(name);
    TANDEM_ASSERT(it != by_name.end(), "no parameter ", name);
    return *it->second;
  };
  auto get = [&](const std::string& name) { return view(flat, entry(name)); };
  ModelWeights w;
  if (spec_.has_embed) w.embed = get("model.embed_tokens.weight");
  if (spec_.has_head) {
    w.final_norm = get("model.norm.weight");
    // Note [Tied embeddings]: the table itself, or on a stage without the embedding its copy.
    w.lm_head = get(cfg_.tied_embeddings() ? "model.embed_tokens.weight" : "lm_head.weight");
  }
  for (int64_t l = spec_.layer_begin; l < spec_.layer_end; ++l) {
    w.layers.push_back(layer_views(flat, by_name, l, l - spec_.layer_begin));
  }
  for (int64_t j = 0; j < spec_.mtp_layers(cfg_); ++j) {
    const std::string p = mtp_prefix(cfg_, j);
    MtpWeights m;
    m.enorm = get(p + "enorm.weight");
    m.hnorm = get(p + "hnorm.weight");
    m.eh_proj = get(p + "eh_proj.weight");
    m.final_norm = get(p + "shared_head.norm.weight");
    m.layer =
        layer_views(flat, by_name, cfg_.num_layers + j, spec_.layer_end - spec_.layer_begin + j);
    w.mtp.push_back(std::move(m));
  }
  return w;
}

// Elements [begin, end) of t: each element's value depends only on (key, index), so any split
// of the work gives the same values.
// Element i of a shard is drawn as the whole model's element model_index(i) (Note
// [Tensor-parallel shards]).
template <typename T>
static void fill_init(const Tensor& t, uint64_t key, const ParamEntry& e, int64_t begin,
                      int64_t end, const Parameters& params) {
  T* p = t.data<T>();
  for (int64_t i = begin; i < end; ++i) {
    p[i] = e.kind == ParamKind::kNorm ? T(1)
           : e.kind == ParamKind::kBias || e.kind == ParamKind::kBuffer
               ? T(0)
               : static_cast<T>(e.init_std *
                                normal01(key, static_cast<uint64_t>(params.model_index(e, i))));
  }
}

void Parameters::initialize(uint64_t seed) {
  // Filled on the host (bitwise the same values on every device), then copied. A normal draw
  // costs tens of nanoseconds, so a model of billions of parameters is filled by every core:
  // pieces of up to kPiece elements handed out in order.
  const Tensor host = device_ == Device::kCPU ? flat_params_
                                              : Tensor::empty({total_}, dtype_, MemCategory::kOther,
                                                              "parameters.init", Device::kCPU);
  struct Piece {
    const ParamEntry* entry;
    Tensor view;
    uint64_t key;
    int64_t begin, end;
  };
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<Piece> pieces;
  for (const ParamEntry& e : entries_) {
    const uint64_t key = splitmix64(seed) ^ hash_name(e.name);
    const Tensor v = view(host, e);
    for (int64_t b = 0; b < v.numel(); b += kPiece)
      pieces.push_back({&e, v, key, b, std::min(v.numel(), b + kPiece)});
  }
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < pieces.size(); i = next++) {
      const Piece& p = pieces[i];
      if (dtype_ == DType::kF32) {
        fill_init<float>(p.view, p.key, *p.entry, p.begin, p.end, *this);
      } else {
        fill_init<double>(p.view, p.key, *p.entry, p.begin, p.end, *this);
      }
    }
  };
  const size_t threads =
      std::min<size_t>(pieces.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& h : helpers) h.join();
  if (device_ != Device::kCPU) flat_params_.copy_from(host);
  refresh_compute_copy();
  zero_grads();
}

void Parameters::zero_grads() {
  flat_grads_.zero_();
  for (int64_t l = 0; l < spec_.held_layers(cfg_); ++l) {
    LayerWeights& g = held_layer(grads_, l);
    if (g.experts_grad_fresh != nullptr) *g.experts_grad_fresh = false;
  }
}

void Parameters::zero_grads_for_backward() {
  zero_grads_outside_experts(0, total_);
  mark_experts_fresh();
}

void Parameters::zero_grads_outside_experts(int64_t begin, int64_t end) {
  for (const auto& [b, e] : non_expert_ranges_) {
    const int64_t from = std::max(b, begin), to = std::min(e, end);
    if (from < to) flat_grads_.narrow_rows(from, to - from).zero_();
  }
}

void Parameters::mark_experts_fresh() {
  for (int64_t l = 0; l < spec_.held_layers(cfg_); ++l) {
    LayerWeights& g = held_layer(grads_, l);
    if (g.experts_grad_fresh != nullptr) *g.experts_grad_fresh = true;
  }
}

}  // namespace tandem::model
