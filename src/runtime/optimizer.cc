// AdamW, clipping and the learning-rate schedule.
#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"

namespace tandem::runtime {

double learning_rate(const TrainConfig& t, int64_t update) { return lr_at(t, update); }

UpdateRates learning_rates(const TrainConfig& t, int64_t update) {
  return {lr_at(t, update), decoupled_lr_at(t, update)};
}

namespace {

// Whether weight decay applies to `e`: Megatron-LM's default rule, every weight of two or more
// dimensions but the biases (the embedding table and the LM head included), no vector (norm
// gains, biases, the expert bias).
bool decayed(const model::ParamEntry& e) {
  return e.shape.size() >= 2 && e.kind != model::ParamKind::kBias &&
         e.kind != model::ParamKind::kBuffer;
}

// Note [Decoupled learning rate] (core/lr_schedule.h): the input embedding and the output layer,
// the weights Megatron-LM marks is_embedding_or_output_parameter. A chunk holds the embedding on
// the first pipeline stage and the output layer on the last; tied, the output layer is the table
// or its copy (Note [Tied embeddings] in model/parameters.h), an embedding entry either way.
bool embedding_or_output(const model::ParamEntry& e) {
  return e.kind == model::ParamKind::kEmbedding || e.name == "lm_head.weight";
}

// The [begin, end) ranges of the entries for which `keep` holds (the entries lie in offset order,
// back to back), neighbours merged: adamw_step_flat's `decayed` for decayed(), a few per layer.
template <class Keep>
std::vector<int64_t> entry_ranges(const model::Parameters& params, Keep keep) {
  std::vector<int64_t> r;
  for (const model::ParamEntry& e : params.entries()) {
    if (!keep(e)) continue;
    const int64_t end = e.offset + shape_numel(e.shape);
    if (!r.empty() && r.back() == e.offset) {
      r.back() = end;
    } else {
      r.push_back(e.offset);
      r.push_back(end);
    }
  }
  return r;
}

}  // namespace

AdamW::AdamW(model::Parameters& params, const TrainConfig& t)
    : AdamW(params, t, {OwnedRange{0, params.numel(), 0}}, params.numel()) {}

AdamW::AdamW(model::Parameters& params, const TrainConfig& t, std::vector<OwnedRange> owned,
             int64_t state_numel)
    : params_(&params),
      hp_(t),
      owned_(std::move(owned)),
      m_(Tensor::zeros({state_numel}, params.dtype(), MemCategory::kOptimizer, "adam.m",
                       params.device())),
      v_(Tensor::zeros({state_numel}, params.dtype(), MemCategory::kOptimizer, "adam.v",
                       params.device())),
      decayed_(entry_ranges(params, decayed)),
      embedding_output_(entry_ranges(params, embedding_or_output)),
      done_(params.numel()) {
  int64_t end = 0;
  for (const OwnedRange& r : owned_) {
    TANDEM_ASSERT(r.begin >= end && r.count >= 0 && r.begin + r.count <= params.numel() &&
                      r.state_at >= 0 && r.state_at + r.count <= state_numel,
                  "owned range [", r.begin, ", ", r.begin + r.count, ") of the optimizer");
    end = r.begin + r.count;
  }
}

// Note [Decoupled learning rate]: the piece in runs of one rate, cut at the embedding's and
// output layer's ends when their rate differs (each element's update is its own, so the cuts
// change no value).
void AdamW::update_piece(const OwnedRange& r, int64_t begin, int64_t end) {
  if (rates_.embedding_output == rates_.lr) {
    update_run(r, begin, end, rates_.lr);
    return;
  }
  int64_t at = begin;
  while (at < end) {
    int64_t next = end;
    double lr = rates_.lr;
    for (size_t i = 0; i + 1 < embedding_output_.size(); i += 2) {
      const int64_t b = embedding_output_[i], e = embedding_output_[i + 1];
      if (b <= at && at < e) {
        next = std::min(end, e);
        lr = rates_.embedding_output;
        break;
      }
      if (b > at) next = std::min(next, b);
    }
    update_run(r, at, next, lr);
    at = next;
  }
}

void AdamW::update_run(const OwnedRange& r, int64_t begin, int64_t end, double lr) {
  const int64_t n = end - begin;
  std::vector<int64_t> decayed;  // decayed_ within [begin, end), from begin
  for (size_t i = 0; i + 1 < decayed_.size(); i += 2) {
    const int64_t b = std::max(decayed_[i], begin), e = std::min(decayed_[i + 1], end);
    if (b < e) {
      decayed.push_back(b - begin);
      decayed.push_back(e - begin);
    }
  }
  auto part = [&](const Tensor& t) { return t.defined() ? t.narrow_rows(begin, n) : Tensor(); };
  auto state = [&](const Tensor& t) { return t.narrow_rows(r.state_at + (begin - r.begin), n); };
  const ops::AdamWParams hp{lr,           hp_.adam_beta1,   hp_.adam_beta2,
                            hp_.adam_eps, hp_.weight_decay, step_};
  ops::adamw_step_flat(part(params_->flat_params()), state(m_), state(v_),
                       part(params_->flat_compute()), part(params_->flat_grads()), decayed,
                       grad_scale_, hp);
}

// One piece of the step's pass (Note [Deferred update]): the owned elements in
// [updated_until(), end); step() the whole buffer at once.
void AdamW::update_range(int64_t end) {
  for (const OwnedRange& r : owned_) {
    const int64_t b = std::max(r.begin, done_), e = std::min(r.begin + r.count, end);
    if (b < e) update_piece(r, b, e);
  }
  done_ = end;
}

void AdamW::start_step(const char* who, UpdateRates rates, double grad_scale) {
  TANDEM_CHECK(!update_pending(), "AdamW::", who, ": the deferred step ", step_, " has updated ",
               done_, " of ", params_->numel(), " elements; finish it first");
  ++step_;
  rates_ = rates;
  grad_scale_ = grad_scale;
  done_ = 0;
}

void AdamW::step(UpdateRates rates, double grad_scale) {
  start_step("step", rates, grad_scale);
  update_range(params_->numel());
}

// Note [Deferred update]: a step's update of one element reads only that element's weight,
// gradient and moments, so it may be split into pieces along the flat buffers and run later, as
// long as each piece runs before anything reads its weights or adds to its gradients. The
// pipeline trainer (TrainConfig::defer_optimizer) updates each layer's weights just before the
// next step's first forward reads them, so that forward's expert all-to-all runs beside the
// update of the layers after it (Note [The update beside the first forward] in
// runtime/deferred_update.cc). Each piece zeroes the gradients it read, as the next step's
// zero_grads would have done, so a step never adds to a gradient an update has yet to read; but
// for the local experts', whose first weight-gradient pass of the step writes them
// (Note [Expert gradients written first] in model/parameters.h: the trainer marks them fresh
// where a step starts with an update pending). step() runs the same pass in one piece.
void AdamW::defer_step(UpdateRates rates, double grad_scale) {
  start_step("defer_step", rates, grad_scale);
}

void AdamW::update_until(int64_t end) {
  end = std::min(end, params_->numel());
  if (end <= done_) return;
  const int64_t begin = done_;
  update_range(end);
  params_->zero_grads_outside_experts(begin, end);
}

double grad_sum_squares(const model::Parameters& params) {
  return ops::sum_squares(params.flat_grads());
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  return coeff >= 1.0 ? 1.0 : coeff;
}

}  // namespace tandem::runtime
