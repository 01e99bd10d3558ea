// Which transformers class expresses a model (families.h): each class has a fixed set of
// tandem's options.
#include "core/families.h"

#include <string>

#include "core/error.h"

namespace tandem {

// transformers' class name of each family (config.json's "architectures").
constexpr EnumName<ModelFamily> kFamilyClassNames[] = {
    {ModelFamily::kLlama, "LlamaForCausalLM"},
    {ModelFamily::kMixtral, "MixtralForCausalLM"},
    {ModelFamily::kQwen3Moe, "Qwen3MoeForCausalLM"},
    {ModelFamily::kQwen2Moe, "Qwen2MoeForCausalLM"},
    {ModelFamily::kDeepseekV3, "DeepseekV3ForCausalLM"}};

const char* family_class_name(ModelFamily f) { return name_in(kFamilyClassNames, f).data(); }

// DeepSeek-V3: MLA, a sigmoid router, shared experts of n x the experts' width without a gate,
// the dense layers first.
static ModelFamily deepseek_v3_family(const ModelConfig& m) {
  const auto none = [](const std::string& what) {
    return Error("DeepseekV3ForCausalLM (--multi-latent-attention) has no " + what +
                 " (docs/model.md \"Families\")");
  };
  if (!m.is_moe()) throw none("dense model: set --num-experts");
  if (!m.sigmoid_router()) throw none("softmax router: use --moe-router-score-function sigmoid");
  if (m.qk_layernorm) throw none("--qk-layernorm");
  if (m.add_qkv_bias) throw none("--add-qkv-bias");
  if (m.moe_shared_expert_gate) throw none("--moe-shared-expert-gate");
  if (m.use_rope_scaling) throw none("Llama 3 RoPE scaling (--use-rope-scaling)");
  const int64_t fe = m.expert_ffn_size(), fs = m.moe_shared_expert_intermediate_size;
  if (fs % fe != 0) {
    throw none("shared expert of width " + std::to_string(fs) +
               " (--moe-shared-expert-intermediate-size): it is n_shared_experts x the experts' "
               "width " +
               std::to_string(fe) + ", so a multiple of it, 0 included");
  }
  bool dense_prefix = true;
  for (int64_t l = 1; l < m.num_layers; ++l) {
    dense_prefix = dense_prefix && (m.is_moe_layer(l) || !m.is_moe_layer(l - 1));
  }
  if (!dense_prefix) {
    throw none("dense layer after a MoE layer (--moe-layer-freq " + m.moe_layer_freq +
               "): its dense layers come first (first_k_dense_replace)");
  }
  return ModelFamily::kDeepseekV3;
}

// Each transformers class has a fixed set of the options: a model that mixes them has no class
// to be saved as, and tandem trains only models transformers can load.
ModelFamily family_of(const ModelConfig& m) {
  const auto none = [](const std::string& what) {
    return Error("no transformers model class has " + what +
                 " (docs/model.md \"Families\" lists what each class has)");
  };
  if (m.multi_latent_attention) return deepseek_v3_family(m);
  const char* v3_only = m.rotary_interleaved          ? "--rotary-interleaved"
                        : m.rope_type != "rope"       ? "--rope-type yarn"
                        : m.sigmoid_router()          ? "--moe-router-score-function sigmoid"
                        : m.moe_router_num_groups > 0 ? "--moe-router-num-groups"
                        : m.moe_router_topk_scaling_factor != 1 ? "--moe-router-topk-scaling-factor"
                                                                : nullptr;
  if (v3_only != nullptr) {
    throw none(std::string(v3_only) + " without --multi-latent-attention (DeepSeek-V3)");
  }
  if (!m.is_moe()) {
    if (m.qk_layernorm) throw none("--qk-layernorm in a dense model (--num-experts 0)");
    if (m.add_qkv_bias) throw none("--add-qkv-bias in a dense model (--num-experts 0)");
    return ModelFamily::kLlama;
  }
  if (m.has_shared_expert()) {  // Qwen2-MoE
    if (!m.moe_shared_expert_gate) {
      throw none("a shared expert without its gate: add --moe-shared-expert-gate");
    }
    if (m.qk_layernorm) throw none("--qk-layernorm with a shared expert");
    return ModelFamily::kQwen2Moe;
  }
  if (m.qk_layernorm) {  // Qwen3-MoE
    if (m.add_qkv_bias) throw none("--add-qkv-bias with --qk-layernorm");
    return ModelFamily::kQwen3Moe;
  }
  const char* qwen_only =
      m.add_qkv_bias             ? "--add-qkv-bias"
      : m.moe_router_pre_softmax ? "--moe-router-pre-softmax"
      : m.moe_layer_freq != "1"  ? "--moe-layer-freq"
      : (m.moe_ffn_hidden_size > 0 && m.moe_ffn_hidden_size != m.ffn_hidden_size)
          ? "--moe-ffn-hidden-size"
          : nullptr;
  if (qwen_only != nullptr) {
    throw none(std::string(qwen_only) +
               " in a MoE model without --qk-layernorm (Qwen3-MoE) or a shared expert "
               "(Qwen2-MoE)");
  }
  return ModelFamily::kMixtral;
}

}  // namespace tandem
