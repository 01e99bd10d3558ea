// What every training step shares (step.h).
#include "runtime/step.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/document_masks.h"

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
  if (t.document_masking()) {
    const data::DocumentMasks dm =
        data::document_masks(out.ids.data<int32_t>(), b, s,
                             {.eod = t.eod_token_id,
                              .reset_position_ids = t.reset_position_ids,
                              .reset_attention_mask = t.reset_attention_mask,
                              .eod_mask_loss = t.eod_mask_loss});
    const auto to_tensor = [&](const std::vector<int32_t>& v, const char* name) {
      Tensor x = Tensor::empty({b * s}, DType::kI32, MemCategory::kOther, name, Device::kCPU);
      std::copy(v.begin(), v.end(), x.data<int32_t>());
      return x;
    };
    if (t.reset_attention_mask) out.key_begin = to_tensor(dm.key_begin, "batch.key_begin");
    if (t.reset_position_ids) out.positions = to_tensor(dm.position, "batch.positions");
    if (t.eod_mask_loss) {
      out.loss_mask =
          Tensor::empty({b * s}, DType::kF32, MemCategory::kOther, "batch.loss_mask", Device::kCPU);
      std::copy(dm.loss_mask.begin(), dm.loss_mask.end(), out.loss_mask.data<float>());
    }
  }
  return out;
}

void check_document_masking(const ModelConfig& m, const TrainConfig& t) {
  if (!t.document_masking()) return;
  const char* option = t.reset_attention_mask ? "--reset-attention-mask"
                       : t.reset_position_ids ? "--reset-position-ids"
                                              : "--eod-mask-loss";
  TANDEM_CHECK(t.eod_token_id < m.vocab_size, option, ": --eod-token-id ", t.eod_token_id,
               " is outside the vocabulary [0, ", m.vocab_size, ")");
  TANDEM_CHECK(m.mtp_num_layers == 0, option,
               " with --mtp-num-layers is not in tandem yet (Megatron-LM rolls the masks for "
               "each MTP depth): leave one of them out");
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
