// The trainer's forward-only evaluation (pipeline_trainer.h, Note [Forward-only evaluation]): the
// forward actions of the rank's list over batches of another dataset, no gradient formed.
#include <chrono>
#include <vector>

#include "core/device.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::runtime {

using schedule::Action;
using schedule::ActionKind;

namespace {

// Note [Forward-only evaluation]: the actions of a rank's list that a forward-only pass keeps.
std::vector<Action> forward_only_actions(const std::vector<Action>& actions) {
  std::vector<Action> out;
  for (const Action& a : actions) {
    if (schedule::is_pair(a.kind)) {
      for (const Action& half : {a.first_half(), a.second_half()}) {
        if (half.kind == ActionKind::kForward) out.push_back(half);
      }
    } else if (a.kind == ActionKind::kForward || a.kind == ActionKind::kSendF ||
               a.kind == ActionKind::kRecvF) {
      out.push_back(a);
    }
  }
  return out;
}

}  // namespace

EvalResult PipelineTrainer::evaluate(const data::Dataset& data, int64_t batches) {
  TANDEM_CHECK(batches >= 1, "an evaluation needs at least one batch (asked for ", batches, ")");
  check_data_fits(data, model_);
  DeviceScope on(train_.device);
  finish_updates();
  const std::vector<Action> actions =
      forward_only_actions(sched_.ranks[groups_->layout.pp_rank(groups_->rank)]);
  // The micro-batches come from `data` during the pass (prepare_forward reads data_), and from
  // the training data again after it, however it ends.
  struct Restore {
    const data::Dataset*& slot;
    const data::Dataset* saved;
    ~Restore() { slot = saved; }
  } restore{data_, data_};
  data_ = &data;
  per_token_iteration_ = -1;  // the divisor of an evaluation batch, not of a training step's
  EvalResult out;
  for (int64_t b = 0; b < batches; ++b) {
    const StepResult r = evaluate_batch(actions, b);
    out.lm_loss += r.lm_loss;
    out.aux_loss += r.aux_loss;
    out.tokens += r.tokens;
  }
  out.batches = batches;
  per_token_iteration_ = -1;
  out.lm_loss /= static_cast<double>(batches);
  out.aux_loss /= static_cast<double>(batches);
  return out;
}

StepResult PipelineTrainer::evaluate_batch(const std::vector<Action>& actions, int64_t batch) {
  streams_->begin_step(std::chrono::steady_clock::now());
  zero_aux_totals();
  for (StageRuntime& s : stages_) {
    s.mbs.assign(static_cast<size_t>(num_mb_), model::MicroBatchState{});
  }
  for (const Action& a : actions) {
    streams_->begin_action(a);
    if (schedule::is_communication(a.kind)) {
      communicate(a);
      // The output is on its way (Note [Pipeline messages]); nothing else of it is needed.
      if (a.kind == ActionKind::kSendF) local(a.stage).mbs[a.microbatch] = {};
    } else {
      NodeWork w = prepare(a, batch);
      w.context.grads = nullptr;  // Note [Loss gradient in the forward]: none formed
      w.context.mtp = false;      // the LM loss only: MTP changes the training loss
      w.offload = false;          // no backward to keep anything for
      executor_->run(w);
      keep_losses(w);
      // A stage before this one on the same rank handed its output over in prepare().
      if (!w.stage->params->spec().has_embed && is_local(a.stage - 1)) {
        local(a.stage - 1).mbs[a.microbatch] = {};
      }
      if (w.stage->params->spec().has_head) *w.state = {};
    }
    streams_->end_action(a);
    drop_delivered_sends();
  }
  wait_for_sends();
  Tensor aux;
  double mtp = 0;
  const double lm = take_pending_losses(aux, mtp);
  for (StageRuntime& s : stages_) s.mbs.clear();
  // The streams' next measurement (the next batch's or step's) starts from an idle device, as
  // after a step.
  synchronize_device(train_.device);
  return global_losses(lm, mtp, aux);
}

}  // namespace tandem::runtime
