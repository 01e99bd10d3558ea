// --calculate-per-token-loss with --eod-mask-loss (Note [Per-token loss] in runtime/step.h)
// against the same model trained one micro-batch at a time without it. Oracle: Megatron-LM's
// per-token loss is sum(loss * mask) / G over the global batch, G the tokens of weight 1 of all
// its micro-batches; so it is the micro-batches' own means L_b weighed by n_b / G, n_b each one's
// count, and so is every gradient of it. The counts are taken here from the data set's tokens.
// The MTP modules' terms weigh the same way (Megatron-LM's n_b / (n_bk G) of depth k's sum);
// the router's losses keep the weight 1 / micro-batches, which the test separates by running
// each micro-batch with and without them. fp64, CPU, runtime::ReferenceTrainer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "model/tiny.h"

namespace tandem::runtime {
namespace {

constexpr int32_t kEod = 5;

struct LossAndGrads {
  StepResult r;
  std::vector<double> grads;
};

LossAndGrads run(const ModelConfig& m, const TrainConfig& t, const data::Dataset& data,
                 int64_t iteration) {
  ReferenceTrainer trainer(m, t, data, DType::kF64);
  trainer.params().zero_grads();
  LossAndGrads out;
  out.r = trainer.forward_backward(iteration);
  const double* g = trainer.params().flat_grads().data<double>();
  out.grads.assign(g, g + trainer.params().numel());
  return out;
}

TrainConfig documents_config(bool per_token) {
  TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 8;
  t.reset_attention_mask = t.document_positions = t.eod_mask_loss = true;
  t.eod_token_id = kEod;
  t.calculate_per_token_loss = per_token;
  return t;
}

// The tokens of weight 1 of micro-batch `mb` of step 0: inputs that are not the eod.
int64_t kept_tokens(const data::Dataset& data, const ModelConfig& m, const TrainConfig& t,
                    int64_t mb) {
  int64_t kept = 0;
  std::vector<int32_t> row(static_cast<size_t>(m.seq_length + 1));
  for (int64_t r = 0; r < t.micro_batch_size; ++r) {
    data.sample(mb * t.micro_batch_size + r, row.data(), m.seq_length + 1);
    for (int64_t j = 0; j < m.seq_length; ++j) kept += row[static_cast<size_t>(j)] != kEod ? 1 : 0;
  }
  return kept;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double g : want) scale = std::max(scale, std::abs(g));
  ASSERT_GT(scale, 0);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-12 * scale) << "gradient element " << i;
  }
}

// aux: whether the model has router losses (their weight is separated as the header says).
void check_per_token(ModelConfig m, bool aux) {
  m.seq_length = 8;
  testing::RandomTokens data(m.vocab_size);
  const TrainConfig pt = documents_config(true);
  const int64_t num_mb = pt.global_batch_size / pt.micro_batch_size;
  std::vector<int64_t> kept;
  int64_t total = 0;
  for (int64_t mb = 0; mb < num_mb; ++mb) {
    kept.push_back(kept_tokens(data, m, pt, mb));
    total += kept.back();
  }
  // The test needs micro-batches of different counts, or the two averages agree.
  ASSERT_NE(*std::min_element(kept.begin(), kept.end()),
            *std::max_element(kept.begin(), kept.end()));

  // Each micro-batch alone (global batch = one micro-batch, its step number its index), the
  // default average; without router losses too, which leaves the LM and MTP terms.
  TrainConfig one = documents_config(false);
  one.global_batch_size = one.micro_batch_size;
  ModelConfig no_router = m;
  no_router.moe_aux_loss_coeff = 0;
  no_router.moe_z_loss_coeff = 0;
  LossAndGrads want;
  want.grads.assign(run(m, one, data, 0).grads.size(), 0.0);
  double mean_of_means = 0;
  for (int64_t mb = 0; mb < num_mb; ++mb) {
    const LossAndGrads whole = run(m, one, data, mb);
    const LossAndGrads lm = aux ? run(no_router, one, data, mb) : whole;
    const double w = static_cast<double>(kept[static_cast<size_t>(mb)]) / total;
    const double per_mb = 1.0 / static_cast<double>(num_mb);
    want.r.lm_loss += w * whole.r.lm_loss;
    want.r.mtp_loss += w * whole.r.mtp_loss;
    want.r.aux_loss += per_mb * whole.r.aux_loss;
    mean_of_means += per_mb * whole.r.loss;
    for (size_t i = 0; i < want.grads.size(); ++i) {
      want.grads[i] += w * lm.grads[i] + per_mb * (whole.grads[i] - lm.grads[i]);
    }
  }
  const LossAndGrads got = run(m, pt, data, 0);
  EXPECT_NEAR(got.r.lm_loss, want.r.lm_loss, 1e-12 * want.r.lm_loss);
  EXPECT_NEAR(got.r.mtp_loss, want.r.mtp_loss, 1e-12 * std::max(1.0, want.r.mtp_loss));
  EXPECT_NEAR(got.r.aux_loss, want.r.aux_loss, 1e-12 * std::max(1.0, want.r.aux_loss));
  expect_close(got.grads, want.grads);
  // The default average is another value: the test can tell them apart.
  EXPECT_GT(std::abs(got.r.loss - mean_of_means), 1e-6);
  if (m.has_mtp()) {
    EXPECT_GT(got.r.mtp_loss, 0.01);
  }
  if (aux) {
    EXPECT_GT(got.r.aux_loss, 0);
  }
}

TEST(PerTokenLoss, DenseIsTheMicroBatchesWeighedByTheirTokens) {
  check_per_token(testing::tiny_config(false), false);
}

ModelConfig with_mtp(ModelConfig m, int64_t layers, double factor) {
  m.mtp_num_layers = layers;
  m.mtp_loss_scaling_factor = factor;
  return m;
}

TEST(PerTokenLoss, MtpModulesWeighAsMegatronLms) {
  check_per_token(with_mtp(testing::tiny_config(false), 2, 0.3), false);
}

TEST(PerTokenLoss, RouterLossesKeepTheirWeightPerMicroBatch) {
  ModelConfig m = with_mtp(testing::tiny_config(true), 1, 0.5);
  m.moe_z_loss_coeff = 0.01;
  check_per_token(m, true);
}

// Without --eod-mask-loss every micro-batch counts all its tokens: the per-token loss is the
// default one, bitwise.
TEST(PerTokenLoss, WithoutALossMaskIsTheDefaultAverage) {
  ModelConfig m = testing::tiny_config(true);
  m.seq_length = 8;
  testing::RandomTokens data(m.vocab_size);
  TrainConfig t = documents_config(false);
  t.eod_mask_loss = false;
  const LossAndGrads plain = run(m, t, data, 0);
  t.calculate_per_token_loss = true;
  const LossAndGrads per_token = run(m, t, data, 0);
  EXPECT_EQ(per_token.r.loss, plain.r.loss);
  EXPECT_EQ(per_token.grads, plain.grads);
}

}  // namespace
}  // namespace tandem::runtime
