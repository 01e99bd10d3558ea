// The sigmoid router's expert bias as training state (Note [Expert bias]). Oracles: the rule
// itself (b_e += rate * sign(mean load - load_e), worked out here from the load each step
// measured); a run without updates (rate 0) as the control of a skewed start; an uninterrupted
// run for a resumed one (bitwise); transformers' names in the saved file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/tiny.h"
#include "runtime/checkpoint.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using testing::RandomTokens;

// DeepSeek-V3's options (model/tiny.h) on a small model: MLA, the sigmoid router with groups and
// its bias, a shared expert, the first layer dense.
ModelConfig deepseek_model(double rate) {
  ModelConfig m;
  m.vocab_size = 32;
  m.hidden_size = 16;
  m.num_layers = 3;
  m.num_attention_heads = 4;
  m.ffn_hidden_size = 24;
  m.num_experts = 4;
  m.seq_length = 8;
  m.moe_layer_freq = "[0,1,1]";
  m = testing::with_deepseek_v3_options(m, 6);
  m.moe_router_group_topk = 2;  // each token chooses among all four experts
  m.moe_router_bias_update_rate = rate;
  m.moe_router_load_balancing_type = "seq_aux_loss";  // kept by the checkpoint too
  m.moe_aux_loss_coeff = 0.01;
  return m;
}

TrainConfig train(int64_t iters) {
  TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = iters;
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  t.lr_warmup_iters = 1;
  return t;
}

// The expert bias of every MoE layer, and the layers' loads of the last step, per layer.
std::vector<std::vector<float>> biases(const ReferenceTrainer& t) {
  std::vector<std::vector<float>> out;
  for (const model::LayerWeights& w : t.params().weights().layers) {
    if (!w.expert_bias.defined()) continue;
    out.emplace_back(w.expert_bias.data<float>(), w.expert_bias.data<float>() + 4);
  }
  return out;
}

// Starts every MoE layer's bias skewed, experts 0 and 1 +1 (above any other expert's score, in
// (0, 1)), so at first every token goes to them, and draws the router wider (std 0.2), so that
// the tokens' scores differ enough for an even bias to split them.
void skew(ReferenceTrainer& t) {
  for (const model::LayerWeights& w : t.params().weights().layers) {
    if (!w.expert_bias.defined()) continue;
    w.expert_bias.data<float>()[0] = 1.0f;
    w.expert_bias.data<float>()[1] = 1.0f;
    float* r = w.router.data<float>();
    for (int64_t i = 0; i < w.router.numel(); ++i) r[i] *= 10.0f;
  }
}

// Trains `steps` steps; returns each step's max / mean load over the MoE layers (the worst
// layer), and checks each update against the rule from the load the step measured.
std::vector<double> run(ReferenceTrainer& t, int steps) {
  std::vector<double> ratio;
  std::vector<std::vector<float>> load;
  t.set_after_backward_hook([&](model::Parameters& p, int64_t) {
    const Tensor& l = p.expert_load();
    load.clear();
    for (size_t layer = 0; layer < p.weights().layers.size(); ++layer) {
      if (!p.weights().layers[layer].expert_bias.defined()) continue;
      const float* row = l.data<float>() + static_cast<int64_t>(layer) * 4;
      load.emplace_back(row, row + 4);
    }
  });
  const double rate = t.params().config().moe_router_bias_update_rate;
  for (int s = 0; s < steps; ++s) {
    const std::vector<std::vector<float>> before = biases(t);
    const StepResult step = t.step();
    const std::vector<std::vector<float>> after = biases(t);
    double worst = 0;
    for (size_t layer = 0; layer < load.size(); ++layer) {
      const std::vector<float>& l = load[layer];
      const double mean = std::accumulate(l.begin(), l.end(), 0.0) / 4;
      EXPECT_EQ(std::accumulate(l.begin(), l.end(), 0.0), 4 * 8 * 2) << "N k rows a step";
      worst = std::max(worst, *std::max_element(l.begin(), l.end()) / mean);
      for (size_t e = 0; e < 4; ++e) {
        const double sign = l[e] < mean ? 1 : l[e] > mean ? -1 : 0;
        EXPECT_EQ(after[layer][e], static_cast<float>(before[layer][e] + rate * sign))
            << "step " << s + 1 << " layer " << layer << " expert " << e;
      }
    }
    // The step's own figure (the log's expert_load_max_over_mean) is the same worst layer.
    EXPECT_NEAR(step.expert_load_max_over_mean, worst, 1e-12 * worst) << "step " << s + 1;
    ratio.push_back(worst);
  }
  return ratio;
}

TEST(ExpertBias, SkewedLoadEvensOutAndWithoutUpdatesStays) {
  RandomTokens data(32);
  ReferenceTrainer moving(deepseek_model(0.05), train(30), data);
  skew(moving);
  const std::vector<double> r = run(moving, 30);
  EXPECT_EQ(r.front(), 2.0);  // every token on experts 0 and 1
  const double late = std::accumulate(r.begin() + 20, r.end(), 0.0) / 10;
  EXPECT_LT(late, 1.6) << "max/mean load over the last ten steps";
  for (double x : r) std::printf("%.2f ", x);
  std::printf("(max/mean load, step by step)\n");
  // The control: the same start without updates stays skewed.
  ReferenceTrainer still(deepseek_model(0.0), train(30), data);
  skew(still);
  const std::vector<double> c = run(still, 30);
  EXPECT_GT(c.back(), late);
}

class ExpertBiasCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_bias_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// 2N steps straight against N, save, restore into a fresh trainer, N more: the biases, weights
// and losses bitwise; the file holds the bias under transformers' name.
TEST_F(ExpertBiasCheckpoint, SavedUnderItsTransformersNameAndResumedBitwise) {
  RandomTokens data(32);
  const int n = 3;
  const ModelConfig m = deepseek_model(0.05);
  ReferenceTrainer full(m, train(2 * n), data);
  skew(full);
  std::vector<StepResult> want;
  for (int i = 0; i < 2 * n; ++i) want.push_back(full.step());

  ReferenceTrainer first(m, train(2 * n), data);
  skew(first);
  for (int i = 0; i < n; ++i) first.step();
  const SavedCheckpoint saved =
      save_checkpoint(dir_, first.iteration(), trainer_checkpoint(first, {}), 2);
  const auto weights = io::load_safetensors(saved.dir + "/model.safetensors", MemCategory::kOther);
  ASSERT_EQ(weights.count("model.layers.1.mlp.gate.e_score_correction_bias"), 1u);
  const Tensor& b = weights.at("model.layers.2.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(std::vector<float>(b.data<float>(), b.data<float>() + 4), biases(first)[1]);
  EXPECT_EQ(weights.count("model.layers.1.mlp.shared_experts.down_proj.weight"), 1u);
  EXPECT_EQ(weights.count("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), 1u);
  // config.json has neither the bias's rate nor the aux loss; trainer_state.json keeps them.
  const CheckpointInfo info = inspect_checkpoint(dir_);
  EXPECT_EQ(info.model_config.moe_router_bias_update_rate, 0.05);
  EXPECT_EQ(info.model_config.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(io::load_hf_config(saved.dir + "/config.json").moe_aux_loss_coeff, 0.0);
  ReferenceTrainer resumed(m, train(2 * n), data);
  restore_trainer(resumed, load_checkpoint(dir_));
  EXPECT_EQ(biases(resumed), biases(first));
  for (int i = n; i < 2 * n; ++i) {
    const StepResult r = resumed.step();
    EXPECT_EQ(r.loss, want[static_cast<size_t>(i)].loss) << "step " << i + 1;
  }
  EXPECT_EQ(biases(resumed), biases(full));
  EXPECT_NE(biases(full), biases(first));
  const Tensor& p = resumed.params().flat_params();
  const Tensor& q = full.params().flat_params();
  EXPECT_EQ(std::vector<float>(p.data<float>(), p.data<float>() + p.numel()),
            std::vector<float>(q.data<float>(), q.data<float>() + q.numel()));
}

}  // namespace
}  // namespace tandem::runtime
