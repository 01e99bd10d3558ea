// What every training step shares (step.h).
#include "runtime/step.h"

#include <cmath>
#include <string>
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

void check_data_fits(const data::Dataset& data, const ModelConfig& m) {
  TANDEM_CHECK(data.vocab_size() <= m.vocab_size, "the data set (", data.describe(),
               ") has token ids up to ", data.vocab_size() - 1, " but --vocab-size is ",
               m.vocab_size, ": use --vocab-size ", data.vocab_size(), " or more");
}

namespace {

// Which of the loss and the gradients is non-finite, for the message of --nan-policy stop.
std::string non_finite_parts(double loss, double grad_norm) {
  const bool bad_loss = !std::isfinite(loss), bad_grads = !std::isfinite(grad_norm);
  if (bad_loss && bad_grads) return "the loss and the gradients are";
  return bad_loss ? "the loss is" : "the gradients are";
}

}  // namespace

void check_step_verdict(const TrainConfig& t, int64_t iteration, double loss, double grad_norm,
                        bool finite) {
  TANDEM_CHECK(finite || t.non_finite_policy != NonFinitePolicy::kStop, "iteration ", iteration,
               ": ", non_finite_parts(loss, grad_norm), " not finite (loss ", loss,
               ", gradient norm ", grad_norm,
               "); stopped before the optimizer update, so the last checkpoint is intact. Lower "
               "--lr, check the data, or pass --nan-policy skip to skip such steps");
}

}  // namespace tandem::runtime
