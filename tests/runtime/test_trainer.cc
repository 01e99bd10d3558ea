// The sequential trainer. Oracles: a second run with the same seed (bitwise), the same global
// batch cut into different micro-batches (fp64, 1e-12: only the summation order differs), runs
// without --decoupled-lr for its first update (bitwise), the loss falling on a learnable task, and
// a saved-then-loaded checkpoint giving the same logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "core/rng.h"
#include "data/addition.h"
#include "model/tiny.h"
#include "runtime/checkpoint.h"

namespace tandem::runtime {
namespace {

using testing::RandomTokens;

ModelConfig small_model(bool moe) {
  ModelConfig m;
  m.vocab_size = 32;
  m.hidden_size = 16;
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.ffn_hidden_size = 24;
  m.num_experts = moe ? 4 : 0;
  m.seq_length = 8;
  return m;
}

TrainConfig small_train() {
  TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = 5;
  t.lr = 1e-2;
  t.min_lr = 1e-3;
  t.lr_warmup_iters = 1;
  return t;
}

TEST(Trainer, SameSeedGivesBitwiseSameLosses) {
  RandomTokens data(32);
  ReferenceTrainer a(small_model(true), small_train(), data);
  ReferenceTrainer b(small_model(true), small_train(), data);
  for (int i = 0; i < 3; ++i) {
    const StepResult ra = a.step(), rb = b.step();
    EXPECT_EQ(ra.loss, rb.loss);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
  }
  TrainConfig other = small_train();
  other.seed = 99;
  ReferenceTrainer c(small_model(true), other, data);
  EXPECT_NE(c.step().loss, ReferenceTrainer(small_model(true), small_train(), data).step().loss);
}

// Note [Decoupled learning rate]: the first update of a run with --decoupled-lr against two runs
// without it, one at --lr and one with --lr at the decoupled rate. All three start from the same
// weights and data, so their first gradients and clipping coefficient are the same, and an AdamW
// update of one element reads only its own weight and gradient: the embedding and output layer
// are bitwise the second run's, every other weight the first run's. (Later steps' gradients
// depend on all the weights, so only the first update compares this way.)
TEST(Trainer, DecoupledLrMovesTheEmbeddingAndOutputLayerAtTheirOwnRate) {
  RandomTokens data(32);
  TrainConfig t = small_train();
  t.lr_warmup_iters = 0;  // the first update at the peak rates
  t.clip_grad = 0.5;      // clipping on: it scales all three runs alike
  TrainConfig decoupled = t, at_x = t;
  decoupled.decoupled_lr = 4e-2;
  decoupled.decoupled_min_lr = 1e-4;
  at_x.lr = 4e-2;
  at_x.min_lr = 1e-4;
  ReferenceTrainer a(small_model(true), decoupled, data), base(small_model(true), t, data),
      x(small_model(true), at_x, data);
  const StepResult r = a.step();
  EXPECT_DOUBLE_EQ(r.lr, 1e-2);
  EXPECT_DOUBLE_EQ(r.decoupled_lr, 4e-2);
  EXPECT_DOUBLE_EQ(base.step().decoupled_lr, 1e-2);  // without --decoupled-lr: --lr's
  x.step();
  int decoupled_entries = 0;
  for (const model::ParamEntry& e : a.params().entries()) {
    const bool own = e.name == "model.embed_tokens.weight" || e.name == "lm_head.weight";
    decoupled_entries += own ? 1 : 0;
    const Tensor got = a.params().param(e);
    const Tensor want = (own ? x : base).params().param(e);
    const Tensor other = (own ? base : x).params().param(e);
    const auto* g = got.data<float>();
    bool equal = true, differs = false;
    for (int64_t i = 0; i < got.numel(); ++i) {
      equal = equal && g[i] == want.data<float>()[i];
      differs = differs || g[i] != other.data<float>()[i];
    }
    EXPECT_TRUE(equal) << e.name;
    if (e.kind != model::ParamKind::kBuffer) {
      EXPECT_TRUE(differs) << e.name;
    }
  }
  // Tied (Note [Tied embeddings]), the output layer is the table: one entry.
  EXPECT_EQ(decoupled_entries, a.params().config().tied_embeddings() ? 1 : 2);
}

// Note [Recomputed experts]: the experts' gate, up and act formed again in the backward are the
// stored ones bit for bit, so losses, gradient norms and weights after three steps are too; the
// activation peak is lower (the experts keep only their input rows).
// Three steps of `stored` and `again`, which differ only in what they keep for the backward: the
// same losses, gradient norms and weights bit for bit, and a lower activation peak in `again`.
void expect_same_steps_with_less_memory(ReferenceTrainer& stored, ReferenceTrainer& again,
                                        DType dtype) {
  for (int i = 0; i < 3; ++i) {
    const StepResult a = stored.step(), b = again.step();
    EXPECT_EQ(a.loss, b.loss) << "step " << i + 1;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << i + 1;
    EXPECT_LT(b.activation_peak, a.activation_peak) << "step " << i + 1;
  }
  const Tensor& pa = stored.params().flat_params();
  const Tensor& pb = again.params().flat_params();
  ASSERT_EQ(pa.numel(), pb.numel());
  for (int64_t i = 0; i < pa.numel(); ++i) {
    if (dtype == DType::kF64) {
      ASSERT_EQ(pa.data<double>()[i], pb.data<double>()[i]) << "weight " << i;
    } else {
      ASSERT_EQ(pa.data<float>()[i], pb.data<float>()[i]) << "weight " << i;
    }
  }
}

TEST(Trainer, RecomputedExpertsAreBitwiseTheStoredRunWithLessMemory) {
  RandomTokens data(32);
  TrainConfig recompute = small_train();
  recompute.recompute_experts = true;
  ReferenceTrainer stored(small_model(true), small_train(), data);
  ReferenceTrainer again(small_model(true), recompute, data);
  expect_same_steps_with_less_memory(stored, again, DType::kF32);
}

// Note [Recomputed modules] (model/ffn_nodes.cc): the mlp's and the shared expert's gate, up and
// act (gated, z and the gate) formed again in the backward are the stored ones bit for bit, so
// losses, gradient norms and weights after three steps are too (f32, and f64); the activation
// peak is lower. The model: a dense first layer, then a MoE layer with a shared
// expert, gated or not.
TEST(Trainer, RecomputedModulesAreBitwiseTheStoredRunWithLessMemory) {
  RandomTokens data(32);
  ModelConfig qwen2 = small_model(true);  // a gated shared expert, a dense first layer
  qwen2.moe_layer_freq = "[0,1]";
  qwen2.moe_shared_expert_intermediate_size = 20;
  qwen2.moe_shared_expert_gate = true;
  ModelConfig deepseek = testing::memory_deepseek_v3_config();  // ungated, a dense first layer
  deepseek.vocab_size = 32;
  deepseek.seq_length = 8;
  for (const ModelConfig& m : {qwen2, deepseek}) {
    const bool gated = m.moe_shared_expert_gate;
    // Each module alone on the small model; both on DeepSeek-V3's (its widths make it slower).
    const std::vector<const char*> settings =
        gated ? std::vector<const char*>{"mlp", "shared_experts", "mlp,shared_experts"}
              : std::vector<const char*>{"mlp,shared_experts"};
    for (const char* modules : settings) {
      for (const DType dtype : {DType::kF32, DType::kF64}) {
        SCOPED_TRACE(std::string(modules) + (gated ? ", gated" : "") +
                     (dtype == DType::kF64 ? ", f64" : ", f32"));
        TrainConfig recompute = small_train();
        recompute.recompute = modules;
        ReferenceTrainer stored(m, small_train(), data, dtype);
        ReferenceTrainer again(m, recompute, data, dtype);
        expect_same_steps_with_less_memory(stored, again, dtype);
      }
    }
  }
}

// Note [Merged expert weight gradients]: the experts' weight gradients of 2 or 3 of 4
// micro-batches summed in one product per expert (3: a group of three, then one of one) are
// those of each micro-batch's own products but for the summation order (fp64, 1e-12 relative);
// a second run is bitwise the first, and the waiting micro-batches raise the activation peak.
TEST(Trainer, MergedExpertWeightGradientsAreTheSameSums) {
  RandomTokens data(32);
  TrainConfig base = small_train();
  base.micro_batch_size = 1;  // four micro-batches
  for (const int64_t merge : {2, 3}) {
    TrainConfig merged = base;
    merged.moe_wgrad_merge = merge;
    ReferenceTrainer a(small_model(true), base, data, DType::kF64);
    ReferenceTrainer b(small_model(true), merged, data, DType::kF64);
    ReferenceTrainer c(small_model(true), merged, data, DType::kF64);
    for (int i = 0; i < 3; ++i) {
      const StepResult ra = a.step(), rb = b.step(), rc = c.step();
      EXPECT_NEAR(ra.loss, rb.loss, 1e-12 * std::fabs(ra.loss)) << "merge " << merge;
      EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-12 * ra.grad_norm) << "merge " << merge;
      EXPECT_EQ(rb.loss, rc.loss) << "merge " << merge << " step " << i + 1;
      EXPECT_EQ(rb.grad_norm, rc.grad_norm) << "merge " << merge << " step " << i + 1;
      EXPECT_GT(rb.activation_peak, ra.activation_peak) << "merge " << merge;
    }
    const Tensor& pa = a.params().flat_params();
    const Tensor& pb = b.params().flat_params();
    double diff = 0;
    for (int64_t i = 0; i < pa.numel(); ++i) {
      diff = std::max(diff, std::fabs(pa.data<double>()[i] - pb.data<double>()[i]));
    }
    EXPECT_LT(diff, 1e-12) << "merge " << merge;
    EXPECT_GT(diff, 0) << "merge " << merge << ": the sums are formed in another order";
  }
}

TEST(Trainer, MicroBatchSplitDoesNotChangeGradients) {
  RandomTokens data(32);
  TrainConfig one = small_train(), four = small_train();
  one.micro_batch_size = 4;   // one micro-batch of 4 sequences
  four.micro_batch_size = 1;  // four micro-batches of 1
  // Dense: the aux loss is per micro-batch and so depends on the split by definition.
  ReferenceTrainer a(small_model(false), one, data, DType::kF64);
  ReferenceTrainer b(small_model(false), four, data, DType::kF64);
  const StepResult ra = a.forward_backward(0), rb = b.forward_backward(0);
  EXPECT_NEAR(ra.loss, rb.loss, 1e-12);
  const double* ga = a.params().flat_grads().data<double>();
  const double* gb = b.params().flat_grads().data<double>();
  for (int64_t i = 0; i < a.params().numel(); ++i) {
    ASSERT_NEAR(ga[i], gb[i], 1e-12 * std::max(1.0, std::abs(ga[i]))) << "element " << i;
  }
}

TEST(Trainer, LossFallsOnTheAdditionTask) {
  data::AdditionDataset data(5);
  ModelConfig m = small_model(true);
  m.vocab_size = 256;
  m.hidden_size = 32;
  m.seq_length = 32;
  TrainConfig t = small_train();
  t.train_iters = 40;
  t.lr = 1e-2;
  t.lr_warmup_iters = 5;
  t.micro_batch_size = 4;
  t.global_batch_size = 8;
  ReferenceTrainer trainer(m, t, data);
  const double first = trainer.step().lm_loss;
  double last = first;
  for (int i = 1; i < t.train_iters; ++i) last = trainer.step().lm_loss;
  EXPECT_GT(first, 5.0);  // about ln 256 at initialisation
  EXPECT_LT(last, 0.6 * first);
}

TEST(Trainer, StepReportsMemoryAndActivationPeak) {
  RandomTokens data(32);
  ReferenceTrainer trainer(small_model(true), small_train(), data);
  const StepResult r = trainer.step();
  EXPECT_GT(r.activation_peak, 0);
  EXPECT_GE(r.memory.total_peak, r.memory.total_in_use);
  EXPECT_EQ(r.memory.in_use_of(MemCategory::kActivation), 0);  // all released after the step
  // Tied, the reference also holds the model untied, which its nodes run on
  // (Note [Tying in the reference] in tests/common/reference_trainer.cc): the weights twice and the
  // LM head once more.
  const ModelConfig& m = trainer.model_config();
  const int64_t untied =
      m.tied_embeddings() ? trainer.params().numel() + m.vocab_size * m.hidden_size : 0;
  EXPECT_EQ(r.memory.in_use_of(MemCategory::kParameter), (trainer.params().numel() + untied) * 4);
}

TEST(Trainer, VocabularyTooSmallForTheDataIsAnError) {
  data::AdditionDataset data(1);
  EXPECT_THROW(ReferenceTrainer(small_model(false), small_train(), data), Error);
}

TEST(Checkpoint, SavedModelLoadsWithTheSameWeights) {
  RandomTokens data(32);
  ReferenceTrainer trainer(small_model(true), small_train(), data);
  trainer.step();
  const std::string dir = ::testing::TempDir() + "/tandem_ckpt_test/model";
  std::filesystem::remove_all(::testing::TempDir() + "/tandem_ckpt_test");
  save_model_checkpoint(dir, trainer.params());
  save_model_checkpoint(dir, trainer.params());  // replacing an existing one works too
  const auto loaded = load_model_checkpoint(dir);
  ASSERT_EQ(loaded->numel(), trainer.params().numel());
  const float* a = trainer.params().flat_params().data<float>();
  const float* b = loaded->flat_params().data<float>();
  for (int64_t i = 0; i < loaded->numel(); ++i) ASSERT_EQ(a[i], b[i]) << i;
  EXPECT_THROW(load_model_checkpoint(::testing::TempDir() + "/no_such_dir"), Error);
}

}  // namespace
}  // namespace tandem::runtime
