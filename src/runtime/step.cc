// What every training step shares (step.h).
#include "runtime/step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "data/document_masks.h"

namespace tandem::runtime {

namespace {

// Note [Document masks on the device]: each stage's attention, RoPE and loss nodes read the
// micro-batch's document masks on the training device. They are formed on the host from the ids
// (data::document_masks), packed as 4-byte words (i32 bounds and positions, the f32 loss mask's
// bits) into one [count * N] buffer and copied to the GPU in one transfer per micro-batch,
// ordered on the current stream; the masks are views of that buffer, which the micro-batch
// holds (as other memory, beside its ids) until its state is next overwritten. On the CPU they
// are the host buffer's views.
void document_mask_tensors(MicroBatchTokens& out, const ModelConfig& m, const TrainConfig& t) {
  const int64_t b = t.micro_batch_size, s = m.seq_length;
  const data::DocumentMasks dm =
      data::document_masks(out.ids.data<int32_t>(), b, s,
                           {.eod = t.eod_token_id,
                            .document_positions = t.document_positions,
                            .reset_attention_mask = t.reset_attention_mask,
                            .eod_mask_loss = t.eod_mask_loss});
  const int64_t n = b * s;
  const int64_t count = t.document_mask_count();
  Tensor host =
      Tensor::empty({count * n}, DType::kI32, MemCategory::kOther, "batch.document_masks");
  int64_t next = 0;  // the next free part of `host`
  const auto pack = [&](const auto& values) {
    std::memcpy(host.data<int32_t>() + next * n, values.data(), static_cast<size_t>(n) * 4);
    return next++;
  };
  const int64_t key_begin = t.reset_attention_mask ? pack(dm.key_begin) : -1;
  const int64_t positions = t.document_positions ? pack(dm.position) : -1;
  const int64_t loss_mask = t.eod_mask_loss ? pack(dm.loss_mask) : -1;
  const Tensor masks = t.device == Device::kCPU ? host : host.to(t.device);
  if (key_begin >= 0) out.key_begin = masks.narrow_rows(key_begin * n, n);
  if (positions >= 0) out.positions = masks.narrow_rows(positions * n, n);
  if (loss_mask >= 0) {
    out.loss_mask = masks.narrow_rows(loss_mask * n, n).view_as(DType::kF32);
    out.loss_tokens =
        static_cast<int64_t>(std::count(dm.loss_mask.begin(), dm.loss_mask.end(), 1.0f));
    // Note [MTP loss mask] in model/mtp.cc: depth k keeps row i of a sequence where mask[i + k].
    for (int64_t k = 1; k <= m.mtp_num_layers; ++k) {
      int64_t kept = 0;
      for (int64_t r = 0; r < b; ++r) {
        const auto row = dm.loss_mask.begin() + r * s;
        kept += static_cast<int64_t>(std::count(row + k, row + s, 1.0f));
      }
      out.mtp_loss_tokens.push_back(kept);
    }
  }
}

}  // namespace

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
  if (t.document_masking()) document_mask_tensors(out, m, t);
  return out;
}

double per_token_divisor(const data::Dataset& data, const ModelConfig& m, const TrainConfig& t,
                         int64_t iteration) {
  if (!t.calculate_per_token_loss) return -1;
  const int64_t s = m.seq_length;
  const int64_t micro_batches = t.global_batch_size / t.micro_batch_size;
  int64_t kept = t.global_batch_size * s;
  if (t.eod_mask_loss) {  // the loss mask's rule (data::document_masks): no loss at an eod input
    std::vector<int32_t> row(static_cast<size_t>(s + 1));
    for (int64_t i = 0; i < t.global_batch_size; ++i) {
      data.sample(iteration * t.global_batch_size + i, row.data(), s + 1);
      kept -= std::count(row.begin(), row.begin() + s, static_cast<int32_t>(t.eod_token_id));
    }
  }
  return static_cast<double>(kept) / static_cast<double>(micro_batches);
}

void check_document_masking(const ModelConfig& m, const TrainConfig& t) {
  if (!t.document_masking()) return;
  const char* option = t.reset_attention_mask ? "--reset-attention-mask"
                       : t.document_positions ? "--document-positions"
                                              : "--eod-mask-loss";
  TANDEM_CHECK(t.eod_token_id < m.vocab_size, option, ": --eod-token-id ", t.eod_token_id,
               " is outside the vocabulary [0, ", m.vocab_size, ")");
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
