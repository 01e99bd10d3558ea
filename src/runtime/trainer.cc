// Sequential reference training step.
#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <vector>

namespace tandem::runtime {

MicroBatchTokens load_micro_batch(const data::Dataset& data, const ModelConfig& m,
                                  const TrainConfig& t, int64_t iteration, int64_t mb) {
  const int64_t b = t.micro_batch_size, s = m.seq_length;
  MicroBatchTokens out;
  out.ids = Tensor::empty({b * s}, DType::kI32, MemCategory::kOther, "batch.ids");
  out.targets = Tensor::empty({b * s}, DType::kI32, MemCategory::kOther, "batch.targets");
  std::vector<int32_t> row(static_cast<size_t>(s + 1));
  for (int64_t r = 0; r < b; ++r) {
    const int64_t index = iteration * t.global_batch_size + mb * b + r;
    data.sample(index, row.data(), s + 1);
    for (int64_t j = 0; j < s; ++j) {
      out.ids.data<int32_t>()[r * s + j] = row[static_cast<size_t>(j)];
      out.targets.data<int32_t>()[r * s + j] = row[static_cast<size_t>(j + 1)];
    }
  }
  return out;
}

Trainer::Trainer(const ModelConfig& m, const TrainConfig& t, const data::Dataset& data,
                 DType dtype)
    : model_(m), train_(t), data_(&data) {
  model_.validate();
  train_.validate();
  TANDEM_CHECK(data.vocab_size() <= m.vocab_size, "the data set (", data.describe(),
               ") has token ids up to ", data.vocab_size() - 1, " but --vocab-size is ",
               m.vocab_size, ": use --vocab-size ", data.vocab_size(), " or more");
  params_ = std::make_unique<model::Parameters>(model_, model::ChunkSpec::whole(model_), dtype);
  params_->initialize(train_.seed);
  chunk_ = std::make_unique<model::ModelChunk>(*params_);
  optimizer_ = std::make_unique<AdamW>(*params_, train_);
}

StepResult Trainer::forward_backward(int64_t iteration) {
  const int64_t num_mb = train_.num_microbatches();
  const model::NodeContext ctx =
      chunk_->context(train_.micro_batch_size, 1.0 / static_cast<double>(num_mb));
  StepResult r;
  for (int64_t mb = 0; mb < num_mb; ++mb) {
    MicroBatchTokens tokens = load_micro_batch(*data_, model_, train_, iteration, mb);
    model::MicroBatchState state;
    state.ids = tokens.ids;
    state.targets = tokens.targets;
    chunk_->forward(state, ctx);
    chunk_->backward(state, ctx);
    r.lm_loss += state.lm_loss / static_cast<double>(num_mb);
    r.aux_loss += state.aux_loss / static_cast<double>(num_mb);
  }
  r.loss = r.lm_loss + r.aux_loss;
  r.tokens = train_.global_batch_size * model_.seq_length;
  return r;
}

StepResult Trainer::step() {
  Allocator& alloc = cpu_allocator();
  alloc.reset_peaks();
  const auto start = std::chrono::steady_clock::now();
  params_->zero_grads();
  StepResult r = forward_backward(iteration_);
  r.grad_norm = std::sqrt(grad_sum_squares(*params_));
  TANDEM_CHECK(std::isfinite(r.loss) && std::isfinite(r.grad_norm), "iteration ",
               iteration_ + 1, ": the loss (", r.loss, ") or the gradient norm (", r.grad_norm,
               ") is not finite; lower --lr or check the data");
  clip_gradients(*params_, r.grad_norm, train_.clip_grad);
  ++iteration_;
  r.iteration = iteration_;
  r.lr = learning_rate(train_, iteration_);
  optimizer_->step(r.lr);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.memory = alloc.stats();
  r.activation_peak = r.memory.peak_of(MemCategory::kActivation);
  return r;
}

}  // namespace tandem::runtime
