// Parameter registry, flat buffers and initialisation (docs/model.md "Initialisation").
#include "model/parameters.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/rng.h"
#include "ops/ops.h"

namespace tandem::model {

ChunkSpec ChunkSpec::whole(const ModelConfig& cfg) {
  ChunkSpec s;
  s.layer_end = cfg.num_layers;
  s.expert_end = cfg.num_experts;
  return s;
}

Parameters::Parameters(const ModelConfig& cfg, const ChunkSpec& spec, DType dtype, Device device)
    : cfg_(cfg), spec_(spec), dtype_(dtype), device_(device) {
  TANDEM_ASSERT(dtype == DType::kF32 || dtype == DType::kF64);
  check_placement(spec.placement, cfg.num_layers, cfg.num_experts);
  TANDEM_CHECK(device == Device::kCPU || dtype == DType::kF32,
               "GPU parameters are f32 (master weights), not ", dtype_name(dtype));
  build_entries();
  flat_params_ =
      Tensor::zeros({total_}, dtype, MemCategory::kParameter, "parameters", device);
  flat_grads_ = Tensor::zeros({total_}, dtype, MemCategory::kGradient, "gradients", device);
  if (device != Device::kCPU) {
    flat_compute_ = Tensor::zeros({total_}, DType::kBF16, MemCategory::kParameter,
                                  "parameters.bf16", device);
  }
  build_views();
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
  if (device_ != Device::kCPU) compute_ = make_views(flat_compute_);
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
                     double std) {
  entries_.push_back({name, shape, kind, shard, std, total_});
  total_ += shape_numel(shape);
}

void Parameters::build_entries() {
  const ModelConfig& c = cfg_;
  const int64_t h = c.hidden_size, f = c.ffn_hidden_size;
  const double std = 0.02, out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  if (spec_.has_embed) {
    add("model.embed_tokens.weight", {c.vocab_size, h}, ParamKind::kEmbedding, ParamShard::kDense,
        std);
  }
  for (int64_t l = spec_.layer_begin; l < spec_.layer_end; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, ParamKind::kNorm, ParamShard::kDense, 0);
    add(p + "self_attn.q_proj.weight", {c.q_width(), h}, ParamKind::kMatrix, ParamShard::kDense, std);
    add(p + "self_attn.k_proj.weight", {c.kv_width(), h}, ParamKind::kMatrix, ParamShard::kDense, std);
    add(p + "self_attn.v_proj.weight", {c.kv_width(), h}, ParamKind::kMatrix, ParamShard::kDense, std);
    add(p + "self_attn.o_proj.weight", {h, c.q_width()}, ParamKind::kMatrix, ParamShard::kDense,
        out_std);
    add(p + "post_attention_layernorm.weight", {h}, ParamKind::kNorm, ParamShard::kDense, 0);
    if (!c.is_moe()) {
      add(p + "mlp.gate_proj.weight", {f, h}, ParamKind::kMatrix, ParamShard::kDense, std);
      add(p + "mlp.up_proj.weight", {f, h}, ParamKind::kMatrix, ParamShard::kDense, std);
      add(p + "mlp.down_proj.weight", {h, f}, ParamKind::kMatrix, ParamShard::kDense, out_std);
      continue;
    }
    add(p + "block_sparse_moe.gate.weight", {c.num_experts, h}, ParamKind::kMatrix,
        ParamShard::kDense, std);
    for (int64_t e = spec_.expert_begin; e < spec_.expert_end; ++e) {
      const std::string q = p + "block_sparse_moe.experts." +
                            std::to_string(spec_.placement.expert_at(l, e)) + ".";
      add(q + "w1.weight", {f, h}, ParamKind::kMatrix, ParamShard::kExpert, std);
      add(q + "w3.weight", {f, h}, ParamKind::kMatrix, ParamShard::kExpert, std);
      add(q + "w2.weight", {h, f}, ParamKind::kMatrix, ParamShard::kExpert, out_std);
    }
  }
  if (spec_.has_head) {
    add("model.norm.weight", {h}, ParamKind::kNorm, ParamShard::kDense, 0);
    add("lm_head.weight", {c.vocab_size, h}, ParamKind::kMatrix, ParamShard::kDense, std);
  }
}

Tensor Parameters::view(const Tensor& flat, const ParamEntry& e) {
  return flat.narrow_rows(e.offset, shape_numel(e.shape)).reshape(e.shape);
}

ModelWeights Parameters::make_views(const Tensor& flat) const {
  std::unordered_map<std::string, const ParamEntry*> by_name;
  for (const ParamEntry& e : entries_) by_name[e.name] = &e;
  auto entry = [&](const std::string& name) -> const ParamEntry& {
    auto it = by_name.find(name);
    TANDEM_ASSERT(it != by_name.end(), "no parameter ", name);
    return *it->second;
  };
  auto get = [&](const std::string& name) { return view(flat, entry(name)); };
  // The [2F, H] view of gate and up, which the constructor places one after the other.
  auto stacked = [&](const std::string& gate, const std::string& up) {
    const ParamEntry& g = entry(gate);
    const ParamEntry& u = entry(up);
    TANDEM_ASSERT(g.shape == u.shape && u.offset == g.offset + shape_numel(g.shape),
                  gate, " and ", up, " are not adjacent");
    return flat.narrow_rows(g.offset, 2 * shape_numel(g.shape))
        .reshape({2 * g.shape[0], g.shape[1]});
  };
  ModelWeights w;
  if (spec_.has_embed) w.embed = get("model.embed_tokens.weight");
  if (spec_.has_head) {
    w.final_norm = get("model.norm.weight");
    w.lm_head = get("lm_head.weight");
  }
  for (int64_t l = spec_.layer_begin; l < spec_.layer_end; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.input_norm = get(p + "input_layernorm.weight");
    lw.post_norm = get(p + "post_attention_layernorm.weight");
    lw.wq = get(p + "self_attn.q_proj.weight");
    lw.wk = get(p + "self_attn.k_proj.weight");
    lw.wv = get(p + "self_attn.v_proj.weight");
    lw.wo = get(p + "self_attn.o_proj.weight");
    if (!cfg_.is_moe()) {
      lw.w_gate_up = stacked(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight");
      lw.w_down = get(p + "mlp.down_proj.weight");
    } else {
      lw.router = get(p + "block_sparse_moe.gate.weight");
      if (expert_slots_.defined()) {
        lw.expert_slot =
            expert_slots_.narrow_rows(l - spec_.layer_begin, 1).reshape({cfg_.num_experts});
      }
      for (int64_t e = spec_.expert_begin; e < spec_.expert_end; ++e) {
        const std::string q = p + "block_sparse_moe.experts." +
                              std::to_string(spec_.placement.expert_at(l, e)) + ".";
        lw.e_gate_up.push_back(stacked(q + "w1.weight", q + "w3.weight"));
        lw.e_down.push_back(get(q + "w2.weight"));
      }
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

template <typename T>
static void fill_init(const Tensor& t, uint64_t key, double std) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = std == 0 ? T(1) : static_cast<T>(std * normal01(key, static_cast<uint64_t>(i)));
  }
}

void Parameters::initialize(uint64_t seed) {
  // Filled on the host (bitwise the same values on every device), then copied.
  const Tensor host = device_ == Device::kCPU
                          ? flat_params_
                          : Tensor::empty({total_}, dtype_, MemCategory::kOther,
                                          "parameters.init", Device::kCPU);
  for (const ParamEntry& e : entries_) {
    const uint64_t key = splitmix64(seed) ^ hash_name(e.name);
    if (dtype_ == DType::kF32) {
      fill_init<float>(view(host, e), key, e.init_std);
    } else {
      fill_init<double>(view(host, e), key, e.init_std);
    }
  }
  if (device_ != Device::kCPU) flat_params_.copy_from(host);
  refresh_compute_copy();
  zero_grads();
}

void Parameters::zero_grads() { flat_grads_.zero_(); }

}  // namespace tandem::model
