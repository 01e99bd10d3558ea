// Multi-token prediction (docs/model.md "Multi-token prediction"): every gradient, the MTP
// modules' included, against fp64 central finite differences of the whole loss (grad_check.h);
// the loss against a straightforward reference written here from the equations: plain loops for
// the shifted embeddings, the norms, the concatenation, eh_proj, the final norm, the shared head
// and the cross-entropy over the positions with a target, and the module's transformer layer run
// as a one-layer chunk holding the same weights (the layer itself is checked in
// test_model_grad.cc); the settings' rules. With Megatron-LM's document masks
// (Note [MTP loss mask] in model/mtp.cc) the reference runs the main model and the module's
// layer with the masks unrolled and weighs depth k's row i by the loss mask at i + k, as
// Megatron-LM's multi_token_prediction.py rolls it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "grad_check.h"
#include "model/chunk.h"
#include "tiny.h"

namespace tandem::model {
namespace {

ModelConfig with_mtp(ModelConfig c, int64_t layers, double factor = 0.3) {
  c.mtp_num_layers = layers;
  c.mtp_loss_scaling_factor = factor;
  return c;
}

TEST(MtpGradient, DenseMatchesFiniteDifferences) {
  check_gradients(with_mtp(testing::tiny_config(false), 2));
}

TEST(MtpGradient, MoeMatchesFiniteDifferences) {
  ModelConfig c = with_mtp(testing::tiny_config(true), 2);
  c.moe_z_loss_coeff = 0.2;
  check_gradients(c);
}

TEST(MtpGradient, FusedLmHeadMatchesFiniteDifferences) {
  check_gradients(with_mtp(testing::tiny_config(true), 2), true);
}

// Note [Tied embeddings]: the modules' lookups and heads read the tied table too.
TEST(MtpGradient, TiedEmbeddingsMatchFiniteDifferences) {
  check_gradients(with_mtp(testing::tied_config(testing::tiny_config(true)), 2));
  check_gradients(with_mtp(testing::tied_config(testing::tiny_config(true)), 2), true);
}

TEST(MtpGradient, DeepseekV3MatchesFiniteDifferences) {
  check_gradients(with_mtp(testing::tiny_deepseek_v3_config(5), 1), false, 3e-8);
}

// The q/k norms curve the loss sharply: the step test_model_grad.cc takes for Qwen3.
TEST(MtpGradient, Qwen3WithDenseFirstLayerMatchesFiniteDifferences) {
  check_gradients(with_mtp(testing::tiny_qwen3_config(), 2), false, 1e-7);
}

TEST(MtpGradient, DocumentMasksMatchFiniteDifferences) {
  ModelConfig c = with_mtp(testing::tiny_config(true), 2);
  c.moe_z_loss_coeff = 0.2;
  check_gradients(c, false, 1e-6, true);
  check_gradients(c, true, 1e-6, true);
  check_gradients(with_mtp(testing::tiny_deepseek_v3_config(5), 1), false, 3e-8, true);
}

// The parameters of one chunk, named as the MTP model's, given the same values by name.
void copy_by_name(const Parameters& from, Parameters& to) {
  for (const ParamEntry& e : to.entries()) {
    const ParamEntry* src = nullptr;
    for (const ParamEntry& f : from.entries()) {
      if (f.name == e.name) src = &f;
    }
    ASSERT_NE(src, nullptr) << e.name;
    to.param(e).copy_from(from.param(*src));
  }
}

const double* values(const Parameters& p, const std::string& name) {
  for (const ParamEntry& e : p.entries()) {
    if (e.name == name) return p.param(e).data<double>();
  }
  ADD_FAILURE() << "no parameter " << name;
  return nullptr;
}

// y[r, :] = rmsnorm(x[r, :]) * g, rows of h.
std::vector<double> rmsnorm(const std::vector<double>& x, const double* g, int64_t h, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(h); ++r) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += x[r * h + i] * x[r * h + i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    for (int64_t i = 0; i < h; ++i) y[r * h + i] = x[r * h + i] * s * g[i];
  }
  return y;
}

double reference_loss(const ModelConfig& cfg, const Parameters& mtp_params, const Tensor& ids,
                      const Tensor& targets, int64_t batch,
                      const DocumentMaskInputs* documents = nullptr) {
  // The masks as the model's layers take them; none rolled.
  const auto context = [&](const ModelChunk& chunk) {
    NodeContext c = chunk.context(batch, 1.0);
    if (documents != nullptr) documents->set(c);
    return c;
  };
  const int64_t t = cfg.seq_length, n = batch * t, h = cfg.hidden_size, v = cfg.vocab_size;
  const double eps = cfg.norm_epsilon;
  // The main model alone (no MTP): its lm and aux losses, and nf, the head's normed input.
  ModelConfig main_cfg = cfg;
  main_cfg.mtp_num_layers = 0;
  Parameters main(main_cfg, ChunkSpec::whole(main_cfg), DType::kF64);
  copy_by_name(mtp_params, main);
  ModelChunk main_chunk(main);
  MicroBatchState mb;
  mb.ids = ids;
  mb.targets = targets;
  main_chunk.forward(mb, context(main_chunk));
  double total = mb.lm_loss() + mb.aux_loss();
  std::vector<double> prev(mb.loss.nf.data<double>(), mb.loss.nf.data<double>() + n * h);
  const double* embed = values(mtp_params, "model.embed_tokens.weight");
  const double* head = values(mtp_params, "lm_head.weight");
  const int32_t* tg = targets.data<int32_t>();
  // The sequence's tokens: s[b][0] = ids, s[b][i + 1] = targets[i].
  const auto token = [&](int64_t b, int64_t i) {
    return i == 0 ? ids.data<int32_t>()[b * t] : tg[b * t + i - 1];
  };
  double mtp_sum = 0;
  for (int64_t j = 0; j < cfg.mtp_num_layers; ++j) {
    const int64_t k = j + 1;
    const std::string p = "model.layers." + std::to_string(cfg.num_layers + j) + ".";
    std::vector<double> e(static_cast<size_t>(n * h), 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < t; ++i) {
        const int64_t id = i + k < t ? token(b, i + k) : 0;  // 0 past the end, as Megatron
        for (int64_t c = 0; c < h; ++c) e[(b * t + i) * h + c] = embed[id * h + c];
      }
    }
    const std::vector<double> en = rmsnorm(e, values(mtp_params, p + "enorm.weight"), h, eps);
    const std::vector<double> hn = rmsnorm(prev, values(mtp_params, p + "hnorm.weight"), h, eps);
    const double* w_eh = values(mtp_params, p + "eh_proj.weight");  // [H, 2H]
    Tensor x = Tensor::empty({n, h}, DType::kF64, MemCategory::kOther, "ref.x");
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = 0; o < h; ++o) {
        double acc = 0;
        for (int64_t c = 0; c < h; ++c) acc += w_eh[o * 2 * h + c] * en[r * h + c];
        for (int64_t c = 0; c < h; ++c) acc += w_eh[o * 2 * h + h + c] * hn[r * h + c];
        x.data<double>()[r * h + o] = acc;
      }
    }
    // The module's layer: a one-layer chunk at the model's index L + j.
    ChunkSpec spec = ChunkSpec::whole(cfg);
    spec.layer_begin = cfg.num_layers + j;
    spec.layer_end = spec.layer_begin + 1;
    spec.has_embed = spec.has_head = false;
    Parameters layer(cfg, spec, DType::kF64);
    copy_by_name(mtp_params, layer);
    ModelChunk layer_chunk(layer);
    MicroBatchState lm;
    lm.input = x;
    layer_chunk.forward(lm, context(layer_chunk));
    total += lm.aux_loss();
    const std::vector<double> y(lm.output().data<double>(), lm.output().data<double>() + n * h);
    prev = rmsnorm(y, values(mtp_params, p + "shared_head.norm.weight"), h, eps);
    double sum = 0;
    int64_t rows = 0, kept = 0;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i + k < t; ++i) {
        ++rows;
        // Megatron-LM's loss mask rolled k left: the mask of the token k later.
        const double weight =
            documents == nullptr ? 1.0 : documents->loss_mask.data<float>()[b * t + i + k];
        if (weight == 0) continue;
        ++kept;
        const double* hr = &prev[(b * t + i) * h];
        std::vector<double> logits(static_cast<size_t>(v));
        double mx = -1e300;
        for (int64_t o = 0; o < v; ++o) {
          double acc = 0;
          for (int64_t c = 0; c < h; ++c) acc += head[o * h + c] * hr[c];
          logits[o] = acc;
          mx = std::max(mx, acc);
        }
        double z = 0;
        for (double l : logits) z += std::exp(l - mx);
        sum += mx + std::log(z) - logits[token(b, i + k + 1)];
      }
    }
    EXPECT_EQ(rows, batch * (t - k));
    mtp_sum += sum / static_cast<double>(std::max<int64_t>(kept, 1));
  }
  return total + cfg.mtp_loss_scaling_factor / static_cast<double>(cfg.mtp_num_layers) * mtp_sum;
}

// documents: the batch's ids split into documents on an id that occurs (Note [MTP loss mask]).
void check_against_reference(const ModelConfig& cfg, bool documents = false) {
  const int64_t batch = 2, n = batch * cfg.seq_length;
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
  params.initialize(11);
  for (int64_t i = 0; i < params.numel(); ++i) params.flat_params().data<double>()[i] *= 10.0;
  ModelChunk chunk(params);
  const Tensor ids = testing::random_ids(n, cfg.vocab_size, 3);
  const Tensor targets = testing::random_ids(n, cfg.vocab_size, 4);
  DocumentMaskInputs masks;
  if (documents) {
    masks = document_mask_inputs(cfg, ids, batch, ids.data<int32_t>()[3]);
    // Rows of depth 1 dropped by the rolled mask (the test sees the roll).
    ASSERT_LT(masks.mtp_loss_tokens[0], batch * (cfg.seq_length - 1));
  }
  const DocumentMaskInputs* dm = documents ? &masks : nullptr;
  MicroBatchState mb;
  const double loss = run_loss(chunk, ids, targets, batch, false, &mb, false, dm);
  ASSERT_EQ(static_cast<int64_t>(mb.mtp_losses.size()), cfg.mtp_num_layers);
  EXPECT_GT(mb.mtp_loss(), 0.01);  // the term is there
  EXPECT_NEAR(loss, reference_loss(cfg, params, ids, targets, batch, dm), 1e-11);
  // The fused head (the GPU's loss node) gives the same loss.
  EXPECT_NEAR(run_loss(chunk, ids, targets, batch, true, nullptr, false, dm), loss, 1e-11);
  if (documents) {  // and the masks change it: the test can tell
    EXPECT_GT(std::abs(run_loss(chunk, ids, targets, batch, false) - loss), 1e-6);
  }
}

TEST(Mtp, LossMatchesAStraightforwardReference) {
  check_against_reference(with_mtp(testing::tiny_config(false), 2));
  ModelConfig moe = with_mtp(testing::tiny_config(true), 3, 0.7);
  moe.moe_z_loss_coeff = 0.1;
  check_against_reference(moe);
  check_against_reference(with_mtp(testing::tiny_deepseek_v3_config(5), 2));
}

TEST(Mtp, DocumentMasksMatchAStraightforwardReference) {
  check_against_reference(with_mtp(testing::tiny_config(false), 2), true);
  ModelConfig moe = with_mtp(testing::tiny_config(true), 3, 0.7);
  moe.moe_z_loss_coeff = 0.1;
  check_against_reference(moe, true);
  check_against_reference(with_mtp(testing::tiny_deepseek_v3_config(5), 2), true);
}

// An evaluation forward (NodeContext::mtp off) is the LM loss alone, the main model's.
TEST(Mtp, EvaluationForwardLeavesTheModulesOut) {
  const ModelConfig cfg = with_mtp(testing::tiny_config(true), 2);
  Parameters params(cfg, ChunkSpec::whole(cfg), DType::kF64);
  params.initialize(5);
  ModelChunk chunk(params);
  const int64_t n = 2 * cfg.seq_length;
  MicroBatchState mb;
  mb.ids = testing::random_ids(n, cfg.vocab_size, 1);
  mb.targets = testing::random_ids(n, cfg.vocab_size, 2);
  NodeContext c = chunk.context(2, 1.0);
  c.mtp = false;
  chunk.forward(mb, c);
  EXPECT_TRUE(mb.mtp_losses.empty());
  EXPECT_TRUE(mb.loss.mtp.empty());
  EXPECT_EQ(mb.aux_losses.size(), 2u);  // the model's two MoE layers only
}

// The modules' weights: DeepSeek-V3's names after the last layer, in the head's part of the
// flat buffers; none without --mtp-num-layers.
TEST(Mtp, WeightsAreNamedAsDeepseekV3sCheckpoint) {
  const ModelConfig cfg = with_mtp(testing::tiny_deepseek_v3_config(5), 2);
  const std::vector<ParamEntry> entries = Parameters::entries_of(cfg, ChunkSpec::whole(cfg));
  std::vector<std::string> names;
  for (const ParamEntry& e : entries) names.push_back(e.name);
  const auto at = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) - names.begin();
  };
  const auto head = at("lm_head.weight");
  for (const char* name :
       {"model.layers.3.enorm.weight", "model.layers.3.hnorm.weight",
        "model.layers.3.eh_proj.weight", "model.layers.3.shared_head.norm.weight",
        "model.layers.3.mlp.gate.weight", "model.layers.4.mlp.experts.3.up_proj.weight",
        "model.layers.4.self_attn.kv_a_proj_with_mqa.weight"}) {
    EXPECT_LT(at(name), static_cast<std::ptrdiff_t>(names.size())) << name;
    EXPECT_GT(at(name), head) << name;
  }
  EXPECT_EQ(entries[static_cast<size_t>(at("model.layers.3.eh_proj.weight"))].shape,
            (Shape{cfg.hidden_size, 2 * cfg.hidden_size}));
  ModelConfig none = cfg;
  none.mtp_num_layers = 0;
  for (const ParamEntry& e : Parameters::entries_of(none, ChunkSpec::whole(none))) {
    EXPECT_EQ(e.name.find("model.layers.3."), std::string::npos) << e.name;
  }
  // A stage without the head holds none.
  ChunkSpec first = ChunkSpec::whole(cfg);
  first.has_head = false;
  for (const ParamEntry& e : Parameters::entries_of(cfg, first)) {
    EXPECT_EQ(e.name.find("model.layers.3."), std::string::npos) << e.name;
  }
}

TEST(Mtp, BadSettingsAreRefusedNamingThem) {
  ModelConfig c = testing::tiny_config(true);
  c.mtp_num_layers = c.seq_length;
  EXPECT_THROW(
      {
        try {
          c.validate();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--mtp-num-layers 5"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  c.mtp_num_layers = -1;
  EXPECT_THROW(c.validate(), Error);
  c.mtp_num_layers = 1;
  c.mtp_loss_scaling_factor = -0.5;
  EXPECT_THROW(c.validate(), Error);
  c.mtp_loss_scaling_factor = 0.1;
  EXPECT_NO_THROW(c.validate());
  EXPECT_NO_THROW(check_mtp_layout(c, 1));
  EXPECT_THROW(check_mtp_layout(c, 2), Error);
  // Overlapped pairs with expert ranks: refused where the modules' layers are MoE.
  EXPECT_NO_THROW(check_mtp_overlap(c, 2, false));
  EXPECT_NO_THROW(check_mtp_overlap(c, 1, true));
  EXPECT_THROW(check_mtp_overlap(c, 2, true), Error);
  ModelConfig dense = testing::tiny_config(false);
  dense.mtp_num_layers = 1;
  EXPECT_NO_THROW(check_mtp_overlap(dense, 2, true));
}

}  // namespace
}  // namespace tandem::model
