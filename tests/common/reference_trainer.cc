// The reference trainer: micro-batches one after another through the whole model.
#include "common/reference_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "runtime/expert_bias.h"

namespace tandem::runtime {

ReferenceTrainer::ReferenceTrainer(const ModelConfig& m, const TrainConfig& t,
                                   const data::Dataset& data, DType dtype)
    : model_(m), train_(t), data_(&data) {
  model_.validate();
  train_.validate();
  check_data_fits(data, model_);
  check_document_masking(model_, train_);
  TANDEM_CHECK(train_.device == Device::kCPU || dtype == DType::kF32,
               "GPU training keeps f32 master weights; ", dtype_name(dtype), " is CPU-only");
  DeviceScope on(train_.device);
  params_ = std::make_unique<model::Parameters>(model_, model::ChunkSpec::whole(model_), dtype,
                                                train_.device);
  params_->initialize(train_.seed);
  if (model_.tied_embeddings()) {  // Note [Tying in the reference]
    ModelConfig untied = model_;
    untied.untie_embeddings_and_output_weights = true;
    untied_ = std::make_unique<model::Parameters>(untied, model::ChunkSpec::whole(untied), dtype,
                                                  train_.device);
  }
  chunk_ = std::make_unique<model::ModelChunk>(untied_ ? *untied_ : *params_);
  optimizer_ = std::make_unique<AdamW>(*params_, train_);
}

// Note [Tying in the reference]: the oracle of tied embeddings does not share their mechanism
// (one tensor viewed twice, the embedding group: Note [Tied embeddings] in model/parameters.h).
// Before each forward_backward it copies the weights into a model with an LM head of its own,
// the head a copy of the table; the nodes run there, each use of the table with a gradient of
// its own; after it, the two are added into the table's gradient in params_, and the rest are
// added as they are. The norm, the clipping and AdamW then see the table once, in params_.
// The entry of `tied` that the untied model's entry `e` is a use of.
static const model::ParamEntry& tied_entry(const model::Parameters& tied,
                                           const model::ParamEntry& e) {
  const std::string name = e.name == "lm_head.weight" ? "model.embed_tokens.weight" : e.name;
  const auto it = std::find_if(tied.entries().begin(), tied.entries().end(),
                               [&](const model::ParamEntry& p) { return p.name == name; });
  TANDEM_ASSERT(it != tied.entries().end(), "no weight ", name, " in the tied model");
  return *it;
}

void ReferenceTrainer::untie_weights() {
  for (const model::ParamEntry& e : untied_->entries()) {
    untied_->param(e).copy_from(params_->param(tied_entry(*params_, e)));
  }
  untied_->refresh_compute_copy();
  untied_->zero_grads();
}

void ReferenceTrainer::tie_gradients() {
  for (const model::ParamEntry& e : untied_->entries()) {
    ops::axpy(params_->grad(tied_entry(*params_, e)), untied_->grad(e), 1.0);
  }
  // The step's tally of routed rows, which the expert bias's update reads (Note [Expert bias]).
  if (params_->expert_load().defined()) {
    params_->expert_load().copy_from(untied_->expert_load());
    untied_->expert_load().zero_();
  }
}

StepResult ReferenceTrainer::forward_backward(int64_t iteration) {
  DeviceScope on(train_.device);
  const int64_t num_mb = train_.num_microbatches();
  model::NodeContext ctx =
      chunk_->context(train_.micro_batch_size, 1.0 / static_cast<double>(num_mb));
  ctx.recompute_experts = train_.recompute_experts;
  ctx.recompute = parse_recompute(train_.recompute);
  ctx.force_balanced_routing = train_.moe_router_force_balance;
  ctx.per_token_divisor = per_token_divisor(*data_, model_, train_, iteration);
  if (untied_) untie_weights();  // Note [Tying in the reference]
  model::Parameters& run = untied_ ? *untied_ : *params_;
  if (run.aux_total().defined()) run.aux_total().zero_();  // global_aux_loss: per step
  // Note [Merged expert weight gradients] (model/nodes.h).
  model::MergedExpertGrads merged;
  if (train_.moe_wgrad_merge > 1 && model_.is_moe()) {
    merged.merge = train_.moe_wgrad_merge;
    merged.begin_step(model_.num_layers, num_mb);
    ctx.merged_expert_grads = &merged;
  }
  StepResult r;
  // Each micro-batch's losses, summed in order at the end (Note [Reads to the host ahead of use]):
  // the host does not wait for the GPU between micro-batches.
  std::vector<ops::PendingScalar> lm_losses;
  std::vector<std::vector<ops::PendingScalar>> aux_losses, mtp_losses;
  double mtp_weight = 0;
  for (int64_t mb = 0; mb < num_mb; ++mb) {
    MicroBatchTokens tokens = load_micro_batch(*data_, model_, train_, iteration, mb);
    ctx.routing_key = model::routing_key(train_.seed, iteration, mb);
    ctx.key_begin = tokens.key_begin;
    ctx.positions = tokens.positions;
    ctx.loss_mask = tokens.loss_mask;
    ctx.loss_tokens = tokens.loss_tokens;
    ctx.mtp_loss_tokens = tokens.mtp_loss_tokens;
    model::MicroBatchState state;
    state.ids = tokens.ids;
    state.targets = tokens.targets;
    chunk_->forward(state, ctx);
    chunk_->backward(state, ctx);
    // Note [Document masks in the plan] (planner/simulator_state.cc): the masks go with the
    // backward, before the next micro-batch forms its own.
    ctx.key_begin = ctx.positions = ctx.loss_mask = Tensor();
    tokens.key_begin = tokens.positions = tokens.loss_mask = Tensor();
    lm_losses.push_back(state.pending_lm_loss);
    aux_losses.push_back(std::move(state.aux_losses));
    mtp_losses.push_back(std::move(state.mtp_losses));
    mtp_weight = state.mtp_weight;
  }
  TANDEM_ASSERT(merged.idle(), "an expert weight gradient still waits at the step's end");
  if (untied_) tie_gradients();
  for (int64_t mb = 0; mb < num_mb; ++mb) {
    r.lm_loss += lm_losses[mb].get() / static_cast<double>(num_mb);
    r.aux_loss += model::sum_aux_losses(aux_losses[mb]) / static_cast<double>(num_mb);
    r.mtp_loss += mtp_weight * model::sum_aux_losses(mtp_losses[mb]) / static_cast<double>(num_mb);
  }
  r.loss = r.lm_loss + r.aux_loss + r.mtp_loss;
  r.tokens = train_.global_batch_size * model_.seq_length;
  return r;
}

StepResult ReferenceTrainer::step() {
  DeviceScope on(train_.device);
  Allocator& alloc = allocator_for(train_.device);
  alloc.reset_peaks();
  const auto start = std::chrono::steady_clock::now();
  // Note [Expert gradients written first]; tied, the gradients are added into params_ whole.
  if (untied_) {
    params_->zero_grads();
  } else {
    params_->zero_grads_for_backward();
  }
  StepResult r = forward_backward(iteration_);
  const int64_t this_iteration = iteration_ + 1;
  if (after_backward_) after_backward_(*params_, this_iteration);
  const double grad_sum_sq = grad_sum_squares(*params_);
  r.grad_norm = std::sqrt(grad_sum_sq);
  // Note [Non-finite steps]: the decision is taken from this one value.
  const double verdict =
      grad_sum_sq + (std::isfinite(r.loss) ? 0.0 : std::numeric_limits<double>::infinity());
  const bool finite = std::isfinite(verdict);
  check_step_verdict(train_, this_iteration, r.loss, r.grad_norm, finite);
  iteration_ = this_iteration;
  r.iteration = iteration_;
  // Note [Learning-rate schedule]: the schedule counts the updates the optimizer has made.
  const UpdateRates rates = learning_rates(train_, optimizer_->steps() + 1);
  r.lr = rates.lr;
  r.decoupled_lr = rates.embedding_output;
  const bool applies = update_applies(train_, finite);
  if (applies) {
    // Clipping scales the gradients as the step reads them; the step also writes the compute
    // copy (Note [Compute copy] in model/parameters.h).
    optimizer_->step(rates, clip_coefficient(r.grad_norm, train_.clip_grad));
  } else {
    params_->zero_grads();
    r.status = StepStatus::kSkipped;
  }
  r.expert_load_max_over_mean =
      update_expert_bias(*params_, model_.moe_router_bias_update_rate, nullptr, applies);
  synchronize_device(train_.device);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.memory = alloc.stats();
  r.activation_peak = r.memory.peak_of(MemCategory::kActivation);
  return r;
}

CheckpointState trainer_checkpoint(const ReferenceTrainer& trainer, const nlohmann::json& data) {
  CheckpointState st;
  st.kind = CheckpointKind::kTandem;
  st.model_config = trainer.model_config();
  st.model = model_tensors(trainer.params());
  st.optimizer = optimizer_tensors(trainer.params(), trainer.optimizer());
  st.trainer_state = training_position_json(trainer.iteration(), trainer.optimizer().steps(),
                                            trainer.model_config(), trainer.train_config(), data);
  return st;
}

void restore_trainer(ReferenceTrainer& trainer, const CheckpointState& state) {
  trainer.set_iteration(
      restore_chunks({{&trainer.params(), &trainer.optimizer()}}, trainer.train_config(), state));
}

}  // namespace tandem::runtime
