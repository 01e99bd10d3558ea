// The trainer's step (pipeline_trainer.h): the rank's schedule actions over its stages, the
// losses, the norm and the update (the pipeline's messages are in pipeline_messages.cc, the
// forward-only evaluation in pipeline_evaluate.cc).
#include "runtime/pipeline_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "core/device.h"
#include "ops/ops.h"
#include "runtime/cpu_streams.h"
#include "runtime/device_streams.h"
#include "runtime/expert_bias.h"
#include "schedule/send_release.h"

namespace tandem::runtime {

using schedule::Action;
using schedule::ActionKind;

model::ChunkSpec stage_spec(const ModelConfig& m, int32_t stage, int32_t num_stages,
                            const comm::ParallelLayout& layout, int rank, int64_t first_layers,
                            int64_t last_layers) {
  // Note [Uneven stages] in core/config.h: the planner splits the layers the same way.
  const std::vector<int64_t> counts =
      stage_layer_counts(m.num_layers, num_stages, first_layers, last_layers);
  model::ChunkSpec s;
  s.layer_begin = 0;
  for (int32_t i = 0; i < stage; ++i) s.layer_begin += counts[static_cast<size_t>(i)];
  s.layer_end = s.layer_begin + counts[static_cast<size_t>(stage)];
  s.has_embed = stage == 0;
  s.has_head = stage == num_stages - 1;
  s.tp = layout.tp;  // Note [Tensor parallelism] in core/config_tp.cc
  s.tp_rank = layout.tp_rank(rank);
  check_expert_split(m, layout.ep);  // Note [Layout rules] in core/config.h
  check_mtp_layout(m, num_stages);
  if (m.is_moe()) {
    const int64_t el = m.num_experts / layout.ep;
    s.expert_begin = layout.ep_rank(rank) * el;
    s.expert_end = s.expert_begin + el;
  }
  return s;
}

namespace {

// The rank's streams: the GPU's, or the CPU's with a worker thread for the all-to-all unless
// overlap is off.
std::unique_ptr<Streams> make_streams(Device device, CommOverlap overlap) {
  if (device != Device::kCPU) return make_device_streams();
  return std::make_unique<CpuStreams>(overlap != CommOverlap::kOff);
}

}  // namespace

PipelineTrainer::PipelineTrainer(const ModelConfig& m, const TrainConfig& t,
                                 const schedule::Schedule& sched, Groups& groups,
                                 const data::Dataset& data, DType dtype, CommOverlap overlap)
    : model_(m), train_(t), sched_(sched), groups_(&groups), data_(&data) {
  DeviceScope on(train_.device);
  check_comm_overlap(train_, groups.layout.ep, overlap);  // Note [Layout rules] in core/config.h
  streams_ = make_streams(train_.device, overlap);
  TANDEM_CHECK(!streams_->issues_ahead() || overlap != CommOverlap::kSplit ||
                   groups.layout.ep == 1 || groups.ep2_dev != nullptr,
               "CommOverlap::kSplit needs Groups made with second_expert_group");
  const comm::ParallelLayout& L = groups.layout;
  model_.validate();
  bool paired = false;
  for (const std::vector<Action>& rank : sched.ranks) {
    for (const Action& a : rank) {
      paired =
          paired || a.kind == ActionKind::kForwardBackward || a.kind == ActionKind::kForwardForward;
    }
  }
  check_mtp_overlap(model_, L.ep, paired);  // Note [Layout rules] in core/config.h
  ParallelConfig tensor_layout;             // what check_tensor_parallel reads of the layout
  tensor_layout.tensor_model_parallel_size = L.tp;
  tensor_layout.pipeline_model_parallel_size = L.pp;
  check_tensor_parallel(model_, train_, tensor_layout);
  train_.validate(L.dp());
  check_data_fits(data, model_);
  check_document_masking(model_, train_);
  TANDEM_CHECK(sched.num_ranks == L.pp, "schedule '", sched.name, "' has ", sched.num_ranks,
               " pipeline ranks but --pipeline-model-parallel-size is ", L.pp);
  num_mb_ = train_.num_microbatches(L.dp());
  TANDEM_CHECK(sched.num_microbatches == num_mb_, "schedule '", sched.name, "' has ",
               sched.num_microbatches, " micro-batches but the batch sizes give ", num_mb_,
               " per data-parallel rank");
  loss_scale_ = 1.0 / static_cast<double>(num_mb_ * L.dp());
  releases_ =
      std::move(schedule::send_releases(sched_)[static_cast<size_t>(L.pp_rank(groups.rank))]);
  deferred_ = std::make_unique<DeferredUpdate>(*streams_);
  reducer_ = std::make_unique<GradReducer>(model_, train_, groups, *streams_);
  for (int32_t s : sched.stages_of_rank(L.pp_rank(groups.rank))) {
    StageRuntime st;
    st.stage = s;
    st.params = std::make_unique<model::Parameters>(
        model_,
        stage_spec(model_, s, sched.num_stages, L, groups.rank, train_.first_stage_layers,
                   train_.last_stage_layers),
        dtype, train_.device);
    st.params->initialize(train_.seed);
    st.chunk = std::make_unique<model::ModelChunk>(*st.params);
    if (train_.use_distributed_optimizer) {  // Note [Distributed optimizer]
      st.shards = std::make_unique<ShardedWeights>(
          *st.params, shard_pieces(*st.params, st.chunk->nodes(), L, groups.rank), groups);
      st.optimizer =
          std::make_unique<AdamW>(*st.params, train_, st.shards->owned(), st.shards->state_numel());
    } else {
      st.optimizer = std::make_unique<AdamW>(*st.params, train_);
    }
    st.weight_ends = node_weight_ends(*st.params, st.chunk->nodes());
    if (train_.moe_wgrad_merge > 1 && model_.is_moe()) {
      st.merged_expert_grads = std::make_unique<model::MergedExpertGrads>();
      st.merged_expert_grads->merge = train_.moe_wgrad_merge;
    }
    reducer_->add_stage(st);
    stages_.push_back(std::move(st));
  }
  // Note [The embedding group] (grad_reduce.cc): the ranks of the two ends, unless one holds both.
  if (model_.tied_embeddings() && !sched.stage_rank.empty() &&
      sched.stage_rank.front() != sched.stage_rank.back()) {
    groups.add_embedding_group(sched.stage_rank.front(), sched.stage_rank.back());
  }
  rebalancer_ = std::make_unique<ExpertRebalancer>(model_, train_, groups);  // checks the layout
  if (!train_.offload_activations.empty()) {  // Note [Activation offload]
    offload_ = std::make_unique<ActivationOffload>(
        *streams_, parse_offload_kinds(train_.offload_activations, model_), train_.device);
  }
  executor_ = std::make_unique<StreamExecutor>(*streams_, *deferred_, *reducer_, groups, overlap,
                                               offload_.get());
}

PipelineTrainer::~PipelineTrainer() = default;

bool PipelineTrainer::is_local(int32_t stage) const {
  for (const StageRuntime& s : stages_) {
    if (s.stage == stage) return true;
  }
  return false;
}

StageRuntime& PipelineTrainer::local(int32_t stage) {
  for (StageRuntime& s : stages_) {
    if (s.stage == stage) return s;
  }
  TANDEM_ASSERT(false, "stage ", stage, " is not on rank ", groups_->rank);
  return stages_.front();
}

// global_aux_loss's running totals (model/parameters.h) start each step, and each evaluation
// batch, at 0: Megatron-LM's statistics are those of one global batch.
void PipelineTrainer::zero_aux_totals() {
  for (StageRuntime& s : stages_) {
    if (s.params->aux_total().defined()) s.params->aux_total().zero_();
  }
}

model::NodeContext PipelineTrainer::context(const StageRuntime& s) const {
  model::NodeContext c = s.chunk->context(train_.micro_batch_size, loss_scale_);
  c.ep = groups_->layout.ep > 1 ? &groups_->ep_data() : nullptr;
  c.recompute_experts = train_.recompute_experts;
  c.recompute = parse_recompute(train_.recompute);  // Note [Recomputed modules]
  c.force_balanced_routing = train_.moe_router_force_balance;
  c.dp = groups_->layout.dp() > 1 ? &groups_->dp_data() : nullptr;
  c.tp = groups_->layout.tp > 1 ? groups_->tp.get() : nullptr;
  c.merged_expert_grads = s.merged_expert_grads.get();
  return c;
}

model::MicroBatchState& PipelineTrainer::prepare_forward(int32_t stage, int32_t mb,
                                                         int64_t iteration) {
  StageRuntime& s = local(stage);
  model::MicroBatchState& state = s.mbs[mb];
  const bool first = s.params->spec().has_embed, last = s.params->spec().has_head;
  // Every stage's attention reads the document masks: each stage reads them from the ids itself.
  if (first || last || train_.document_masking()) {
    const int64_t global_mb = groups_->layout.dp_rank(groups_->rank) * num_mb_ + mb;
    MicroBatchTokens tokens = load_micro_batch(*data_, model_, train_, iteration, global_mb);
    if (first) state.ids = tokens.ids;
    if (last) state.targets = tokens.targets;
    state.key_begin = tokens.key_begin;
    state.positions = tokens.positions;
    state.loss_mask = tokens.loss_mask;
    state.loss_tokens = tokens.loss_tokens;
    state.mtp_loss_tokens = tokens.mtp_loss_tokens;
  }
  if (!first && is_local(stage - 1)) {  // the previous stage ran on this rank (V placement)
    state.input = std::exchange(local(stage - 1).mbs[mb].layers.back().out, Tensor());
  }
  TANDEM_CHECK(first || state.input.defined(), "schedule '", sched_.name, "': stage ", stage,
               " runs the forward of micro-batch ", mb, " before its input arrived");
  return state;
}

model::MicroBatchState& PipelineTrainer::prepare_backward(int32_t stage, int32_t mb) {
  StageRuntime& s = local(stage);
  model::MicroBatchState& state = s.mbs[mb];
  if (!s.params->spec().has_head && is_local(stage + 1)) {
    state.d_output = std::exchange(local(stage + 1).mbs[mb].layers.front().d_x, Tensor());
  }
  return state;
}

void PipelineTrainer::keep_losses(const NodeWork& w) {
  const StageRuntime& s = *w.stage;
  const model::MicroBatchState& state = *w.state;
  if (s.params->spec().has_head) pending_lm_.push_back(state.pending_lm_loss);
  for (const ops::PendingScalar& l : state.mtp_losses) pending_mtp_.push_back(l);
  if (!state.mtp_losses.empty()) mtp_weight_ = state.mtp_weight;
  // Summed at the step's end, in this order (Note [Routing counts on the host]).
  pending_aux_.push_back({w.action.microbatch, s.params->spec().layer_begin, state.aux_losses});
}

void PipelineTrainer::finish_forward(const NodeWork& w) {
  const StageRuntime& s = *w.stage;
  const model::MicroBatchState& state = *w.state;
  keep_losses(w);
  rebalancer_->record(s, state);
  if (routing_.empty()) return;
  // The experts node keeps its input rows [R, H] until its backward: R is what it received
  // (none in a dense layer).
  const auto first = static_cast<int32_t>(s.params->spec().layer_begin);
  for (size_t l = 0; l < state.layers.size(); ++l) {
    const Tensor& rows = state.layers[l].experts.x_in;
    routing_.at(w.action.microbatch, first + static_cast<int32_t>(l)) =
        rows.defined() ? rows.size(0) : 0;
  }
}

NodeWork PipelineTrainer::prepare(const Action& a, int64_t iteration) {
  StageRuntime& s = local(a.stage);
  model::MicroBatchState* state = &s.mbs[a.microbatch];
  if (a.kind == ActionKind::kForward) {
    state = &prepare_forward(a.stage, a.microbatch, iteration);
  } else if (a.kind != ActionKind::kBackwardWeight) {
    state = &prepare_backward(a.stage, a.microbatch);
  }
  NodeWork w{a, &s, state, context(s), offload_ != nullptr};
  // The micro-batch's place in the global batch, as its data's (prepare_forward).
  const int64_t global_mb = groups_->layout.dp_rank(groups_->rank) * num_mb_ + a.microbatch;
  w.context.routing_key = model::routing_key(train_.seed, iteration, global_mb);
  w.context.key_begin = state->key_begin;
  w.context.positions = state->positions;
  w.context.loss_mask = state->loss_mask;
  w.context.loss_tokens = state->loss_tokens;
  w.context.mtp_loss_tokens = state->mtp_loss_tokens;
  if (s.params->spec().has_head) w.context.per_token_divisor = step_per_token_divisor(iteration);
  return w;
}

double PipelineTrainer::step_per_token_divisor(int64_t iteration) {
  if (!train_.calculate_per_token_loss) return -1;
  if (per_token_data_ != data_ || per_token_iteration_ != iteration) {
    per_token_divisor_ = per_token_divisor(*data_, model_, train_, iteration);
    per_token_data_ = data_;
    per_token_iteration_ = iteration;
  }
  return per_token_divisor_;
}

// Note [Document masks in the plan] (planner/simulator_state.cc): a micro-batch's document
// masks go when its backward on the stage is done (its input-gradient half where the weights'
// is split off); no later action reads them. The state and the work's context both hold them.
static void drop_document_masks(NodeWork& w) {
  const ActionKind kind = w.action.kind;
  if (kind != ActionKind::kBackward && kind != ActionKind::kBackwardInput) return;
  w.context.key_begin = w.context.positions = w.context.loss_mask = Tensor();
  w.state->key_begin = w.state->positions = w.state->loss_mask = Tensor();
}

void PipelineTrainer::run_action(const Action& a, int64_t iteration) {
  if (schedule::is_communication(a.kind)) {
    communicate(a);
    return;
  }
  if (!schedule::is_pair(a.kind)) {
    NodeWork w = prepare(a, iteration);
    executor_->run(w);
    if (a.kind == ActionKind::kForward) finish_forward(w);
    drop_document_masks(w);
    return;
  }
  // In the order the plain actions would prepare them: the forward's input first.
  NodeWork first = prepare(a.first_half(), iteration);
  std::array<NodeWork, 2> halves = {std::move(first), prepare(a.second_half(), iteration)};
  executor_->run_pair(a.kind, halves);
  for (NodeWork& half : halves) {
    if (half.action.kind == ActionKind::kForward) finish_forward(half);
    drop_document_masks(half);
  }
}

StepResult PipelineTrainer::forward_backward(int64_t iteration) {
  DeviceScope on(train_.device);
  pending_lm_.clear();
  pending_mtp_.clear();
  pending_aux_.clear();
  meter_.begin_step();
  streams_->begin_step(meter_.step_start());
  for (StageRuntime& s : stages_) {
    s.mbs.assign(static_cast<size_t>(num_mb_), model::MicroBatchState{});
    if (s.merged_expert_grads) {
      const model::ChunkSpec& spec = s.params->spec();
      s.merged_expert_grads->begin_step(spec.layer_end - spec.layer_begin, num_mb_);
    }
  }
  if (model_.is_moe()) {
    routing_ = schedule::RoutingCounts(static_cast<int32_t>(num_mb_),
                                       static_cast<int32_t>(model_.num_layers));
  }
  zero_aux_totals();
  reducer_->begin_step(num_mb_);
  const std::vector<Action>& list = sched_.ranks[groups_->layout.pp_rank(groups_->rank)];
  for (action_index_ = 0; action_index_ < list.size(); ++action_index_) {
    const Action& a = list[action_index_];
    streams_->begin_action(a);
    run_action(a, iteration);
    streams_->end_action(a);
    release_sends(action_index_);
  }
  wait_for_sends();
  for (const StageRuntime& s : stages_) {
    TANDEM_ASSERT(!s.merged_expert_grads || s.merged_expert_grads->idle(), "stage ", s.stage,
                  ": an expert weight gradient still waits at the step's end");
  }
  // Before the gradients are reduced and the optimizer reads them: a loss whose targets were
  // bad throws here.
  Tensor aux;
  double mtp = 0;
  const double lm = take_pending_losses(aux, mtp);
  // Note [One executor on two kinds of streams]: the host's clocks are final now.
  if (!streams_->issues_ahead()) meter_.record(streams_->times());
  for (StageRuntime& s : stages_) s.mbs.clear();
  reducer_->end_step(stages_);
  return global_losses(lm, mtp, aux);
}

double PipelineTrainer::take_pending_losses(Tensor& aux, double& mtp) {
  double lm = 0;
  for (ops::PendingScalar& l : pending_lm_) lm += l.get();
  mtp = 0;
  for (ops::PendingScalar& l : pending_mtp_) mtp += l.get();
  mtp *= mtp_weight_;
  // A slot per (micro-batch, layer), the MTP modules' layers after the model's.
  const int64_t slots = model_.num_layers + model_.mtp_num_layers;
  aux = Tensor::zeros({num_mb_ * slots}, DType::kF64, MemCategory::kOther, "aux_losses");
  for (PendingAux& p : pending_aux_) {
    for (size_t l = 0; l < p.layers.size(); ++l) {
      aux.data<double>()[p.microbatch * slots + p.first_layer + static_cast<int64_t>(l)] =
          p.layers[l].get();
    }
  }
  pending_lm_.clear();
  pending_mtp_.clear();
  pending_aux_.clear();
  return lm;
}

// Note [The loss summed as one rank sums it]: the aux losses of a step are gathered by
// (micro-batch, layer), each held by one rank of a data-parallel replica, and summed micro-batch
// by micro-batch in layer order on every rank: the order of one rank running the whole model
// micro-batch after micro-batch (the tests' oracle), so the loss is bitwise its loss when only
// the pipeline is split, whichever stages hold MoE layers. (Summed stage by stage, the order would
// depend on the split.)
StepResult PipelineTrainer::global_losses(double lm, double mtp, const Tensor& aux) {
  const int64_t n = aux.numel();
  Tensor losses = Tensor::zeros({2 + n}, DType::kF64, MemCategory::kOther, "losses");
  // Every tensor-parallel rank of a replica has the same losses (Note [Tensor parallelism] in
  // core/config_tp.cc): its rank 0 counts them.
  if (groups_->layout.tp_rank(groups_->rank) == 0) {
    losses.data<double>()[0] = lm;
    losses.data<double>()[1] = mtp;
    std::copy(aux.data<double>(), aux.data<double>() + n, losses.data<double>() + 2);
  }
  groups_->world->all_reduce_sum(losses);
  StepResult r;
  r.lm_loss = losses.data<double>()[0] * loss_scale_;
  r.mtp_loss = losses.data<double>()[1] * loss_scale_;
  const double* by = losses.data<double>() + 2;
  const int64_t slots = model_.num_layers + model_.mtp_num_layers;
  double sum = 0;
  for (int64_t mb = 0; mb < num_mb_; ++mb) {
    double layers = 0;
    for (int64_t l = 0; l < slots; ++l) layers += by[mb * slots + l];
    sum += layers;
  }
  r.aux_loss = sum * loss_scale_;
  r.loss = r.lm_loss + r.aux_loss + r.mtp_loss;
  r.tokens = train_.global_batch_size * model_.seq_length;
  return r;
}

void PipelineTrainer::finish_updates() {
  DeviceScope on(train_.device);
  deferred_->finish(stages_);
}

// Every rank steps all of its stages' weights (the gradients are all-reduced, nothing is
// gathered after), or with the distributed optimizer its parts of them, gathered after or
// beside the next forward; the step writes the compute copy itself. A step that is not finite
// zeroes the gradients instead (Note [Non-finite steps]).
void PipelineTrainer::apply_update(StepResult& r, bool finite) {
  const double coeff = clip_coefficient(r.grad_norm, train_.clip_grad);
  for (StageRuntime& s : stages_) {
    if (!finite) {
      s.params->zero_grads();
    } else if (train_.defer_optimizer) {  // Note [The update beside the first forward]
      s.optimizer->defer_step({r.lr, r.decoupled_lr}, coeff);
    } else {
      s.optimizer->step({r.lr, r.decoupled_lr}, coeff);
      // Note [Weights gathered beside the forward] (distributed_optimizer.cc).
      if (s.shards) s.shards->set_gather_pending();
      if (s.shards && !train_.overlap_param_gather) s.shards->gather_all();
    }
  }
  if (!finite) r.status = StepStatus::kSkipped;
}

StepResult PipelineTrainer::step() {
  DeviceScope on(train_.device);
  Allocator& alloc = allocator_for(train_.device);
  alloc.reset_peaks();
  if (offload_) offload_->reset_peak();
  const auto start = std::chrono::steady_clock::now();
  // The experts' gradients are left for their first weight-gradient pass to write
  // (Note [Expert gradients written first] in model/parameters.h); the rest are zeroed here, or
  // by a deferred update as it reads them (Note [Deferred update] in optimizer.cc).
  for (StageRuntime& s : stages_) {
    if (s.optimizer->update_pending()) {
      s.params->mark_experts_fresh();
    } else {
      s.params->zero_grads_for_backward();
    }
  }
  StepResult r = forward_backward(iteration_);
  const int64_t this_iteration = iteration_ + 1;
  if (after_backward_) after_backward_(stages_, this_iteration);
  r.grad_norm = reducer_->global_norm(stages_);
  // Note [Non-finite steps on several ranks]: both values are the same on every rank.
  const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  check_step_verdict(train_, this_iteration, r.loss, r.grad_norm, finite);
  iteration_ = this_iteration;
  r.iteration = iteration_;
  // Note [Learning-rate schedule]: the schedule counts the updates the optimizer has made.
  const UpdateRates rates = learning_rates(train_, stages_.front().optimizer->steps() + 1);
  r.lr = rates.lr;
  r.decoupled_lr = rates.embedding_output;
  const bool applies = update_applies(train_, finite);
  apply_update(r, applies);
  for (StageRuntime& s : stages_) {  // Note [Expert bias]
    r.expert_load_max_over_mean =
        std::max(r.expert_load_max_over_mean,
                 update_expert_bias(*s.params, model_.moe_router_bias_update_rate,
                                    groups_->dp.get(), applies));
  }
  rebalancer_->after_step(iteration_, stages_, *deferred_);  // part of the step's time
  synchronize_device(train_.device);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (streams_->issues_ahead()) measure_on_device(r.seconds);
  r.memory = alloc.stats();
  r.activation_peak = r.memory.peak_of(MemCategory::kActivation);
  if (offload_) {
    TANDEM_ASSERT(offload_->layers_out() == 0, offload_->layers_out(),
                  " layers' activations still offloaded after the step");
    r.offload_host_peak = offload_->host_peak();
  }
  return r;
}

// Note [Measured on the GPU] (device_streams.h): every event of the step has completed.
void PipelineTrainer::measure_on_device(double step_seconds) {
  const StepTimes t = streams_->times();
  meter_.record(t);
  // Note [Waiting for the slowest expert rank]: every rank of the expert group is here.
  if (groups_->layout.ep > 1) meter_.record_waiting(t, *groups_->ep);
  int64_t weights = 0;
  for (const StageRuntime& s : stages_) weights += s.params->numel();
  meter_.record_step_end(t, step_seconds, weights, train_.defer_optimizer);
}

}  // namespace tandem::runtime
