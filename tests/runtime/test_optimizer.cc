// Learning-rate schedule and clipping against their formulas evaluated by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/optimizer.h"

namespace tandem::runtime {
namespace {

ModelConfig one_layer_dense() {
  ModelConfig m;
  m.vocab_size = 4;
  m.hidden_size = 2;
  m.num_layers = 1;
  m.num_attention_heads = 1;
  m.num_query_groups = 1;
  m.ffn_hidden_size = 2;
  m.num_experts = 0;
  return m;
}

TEST(LearningRate, WarmupThenCosineToMin) {
  TrainConfig t;
  t.lr = 1.0;
  t.min_lr = 0.1;
  t.lr_warmup_iters = 10;
  t.train_iters = 110;
  EXPECT_DOUBLE_EQ(learning_rate(t, 1), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1.0);
  EXPECT_NEAR(learning_rate(t, 60), 0.1 + 0.45, 1e-12);  // half way: cos = 0
  EXPECT_NEAR(learning_rate(t, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(t, 500), 0.1, 1e-12);
  t.lr_decay_iters = 20;
  EXPECT_NEAR(learning_rate(t, 15), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
}

TEST(Clip, ScalesOnlyAboveTheLimit) {
  const ModelConfig m = one_layer_dense();
  model::Parameters p(m, model::ChunkSpec::whole(m), DType::kF64);
  for (int64_t i = 0; i < p.numel(); ++i) p.flat_grads().data<double>()[i] = 1.0;
  const double norm = std::sqrt(grad_sum_squares(p));
  EXPECT_DOUBLE_EQ(norm, std::sqrt(static_cast<double>(p.numel())));
  EXPECT_EQ(clip_gradients(p, norm, 100.0), 1.0);
  const double coeff = clip_gradients(p, norm, 1.0);
  EXPECT_NEAR(coeff, 1.0 / (norm + 1e-6), 1e-15);
  EXPECT_NEAR(std::sqrt(grad_sum_squares(p)), norm * coeff, 1e-12);
}

TEST(AdamW, DecaysMatricesButNotNorms) {
  const ModelConfig m = one_layer_dense();
  model::Parameters p(m, model::ChunkSpec::whole(m), DType::kF64);
  p.initialize(1);
  TrainConfig t;
  t.weight_decay = 0.5;
  AdamW opt(p, t);
  p.zero_grads();  // zero gradient: only the decay moves the weights
  const double norm_before = p.weights().layers[0].input_norm.data<double>()[0];
  const double wq_before = p.weights().layers[0].wq.data<double>()[0];
  const double emb_before = p.weights().embed.data<double>()[0];
  opt.step(0.1);
  EXPECT_EQ(p.weights().layers[0].input_norm.data<double>()[0], norm_before);
  EXPECT_EQ(p.weights().embed.data<double>()[0], emb_before);
  EXPECT_NEAR(p.weights().layers[0].wq.data<double>()[0], wq_before * (1 - 0.1 * 0.5), 1e-15);
}

}  // namespace
}  // namespace tandem::runtime
