// The pipeline trainer: a rank's schedule actions over its stages, P2P between pipeline ranks,
// expert all-to-all inside the nodes, and the gradient reduction. See distributed.h.
#include "runtime/distributed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/device.h"
#include "ops/ops.h"
#if TANDEM_WITH_CUDA
#include "comm/nccl_communicator.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/cuda_allocator.h"
#endif

namespace tandem::runtime {

using schedule::Action;
using schedule::ActionKind;

Groups Groups::make(std::unique_ptr<comm::Communicator> world, int pp, int ep, Device device,
                    bool second_expert_group, double timeout_s) {
  Groups g;
  g.rank = world->rank();
  g.layout = comm::ParallelLayout::make(world->size(), pp, ep);
  g.pp = world->subgroup(g.layout.pp_group(g.rank), "pp");
  g.dp = world->subgroup(g.layout.dp_group(g.rank), "dp");
  g.ep = world->subgroup(g.layout.ep_group(g.rank), "ep");
  g.edp = world->subgroup(g.layout.edp_group(g.rank), "expert-dp");
  if (device == Device::kCUDA) {
#if TANDEM_WITH_CUDA
    // Note [Pipeline streams on the GPU]: NCCL runs a communicator's operations in the order
    // they were issued, and a send waits on the GPU for its receive. Activations and gradients
    // flow in opposite directions, so one communicator for both would deadlock (each rank's
    // first operation a send); one per direction keeps each in the validated schedule's order.
    const double timeout = timeout_s;
    g.pp_fwd_dev = comm::make_nccl_communicator(*g.pp, timeout);
    g.pp_bwd_dev = comm::make_nccl_communicator(*g.pp, timeout);
    g.dp_dev = comm::make_nccl_communicator(*g.dp, timeout);
    g.ep_dev = comm::make_nccl_communicator(*g.ep, timeout);
    if (ep > 1 && second_expert_group) g.ep2_dev = comm::make_nccl_communicator(*g.ep, timeout);
    g.edp_dev = comm::make_nccl_communicator(*g.edp, timeout);
#else
    (void)second_expert_group, (void)timeout_s;
    TANDEM_CHECK(false, "device groups need a binary built with CUDA");
#endif
  }
  g.world = std::move(world);
  return g;
}

model::ChunkSpec stage_spec(const ModelConfig& m, int32_t stage, int32_t num_stages,
                            const comm::ParallelLayout& layout, int rank) {
  TANDEM_CHECK(m.num_layers % num_stages == 0, "--num-layers ", m.num_layers,
               " does not divide into ", num_stages,
               " pipeline stages (pipeline size x virtual stages): use a multiple of ",
               num_stages);
  const int64_t per = m.num_layers / num_stages;
  model::ChunkSpec s;
  s.layer_begin = stage * per;
  s.layer_end = s.layer_begin + per;
  s.has_embed = stage == 0;
  s.has_head = stage == num_stages - 1;
  if (m.is_moe()) {
    TANDEM_CHECK(m.num_experts % layout.ep == 0, "--num-experts ", m.num_experts,
                 " is not a multiple of --expert-model-parallel-size ", layout.ep);
    const int64_t el = m.num_experts / layout.ep;
    s.expert_begin = layout.ep_rank(rank) * el;
    s.expert_end = s.expert_begin + el;
  }
  return s;
}

PipelineTrainer::PipelineTrainer(const ModelConfig& m, const TrainConfig& t,
                                 const schedule::Schedule& sched, Groups& groups,
                                 const data::Dataset& data, DType dtype, CommOverlap overlap)
    : model_(m), train_(t), sched_(sched), groups_(&groups), data_(&data) {
  DeviceScope on(train_.device);
  overlap_ = overlap;
  compute_stream_ = std::make_unique<CpuStream>("compute", StreamMode::kInline);
  if (train_.device != Device::kCPU) {
    dev_ = std::make_unique<DeviceStreams>();  // CUDA streams; no host threads
  } else if (overlap != CommOverlap::kOff) {
    TANDEM_CHECK(overlap == CommOverlap::kOn, "--comm-overlap split runs on GPUs (--device cuda)");
    comm_stream_ = std::make_unique<CpuStream>("comm", StreamMode::kWorker);
  }
  TANDEM_CHECK(!dev_ || overlap != CommOverlap::kSplit || groups.layout.ep == 1 ||
                   groups.ep2_dev != nullptr,
               "CommOverlap::kSplit needs Groups made with second_expert_group");
  const comm::ParallelLayout& L = groups.layout;
  model_.validate();
  train_.validate(L.dp());
  TANDEM_CHECK(sched.num_ranks == L.pp, "schedule '", sched.name, "' has ", sched.num_ranks,
               " pipeline ranks but --pipeline-model-parallel-size is ", L.pp);
  num_mb_ = train_.num_microbatches(L.dp());
  TANDEM_CHECK(sched.num_microbatches == num_mb_, "schedule '", sched.name, "' has ",
               sched.num_microbatches, " micro-batches but the batch sizes give ", num_mb_,
               " per data-parallel rank");
  loss_scale_ = 1.0 / static_cast<double>(num_mb_ * L.dp());
  for (int32_t s : sched.stages_of_rank(L.pp_rank(groups.rank))) {
    StageRuntime st;
    st.stage = s;
    st.params = std::make_unique<model::Parameters>(
        model_, stage_spec(model_, s, sched.num_stages, L, groups.rank), dtype, train_.device);
    st.params->initialize(train_.seed);
    st.chunk = std::make_unique<model::ModelChunk>(*st.params);
    st.optimizer = std::make_unique<AdamW>(*st.params, train_);
    st.weight_ends = node_weight_ends(*st.params, st.chunk->nodes());
    st.grad_units = gradient_units(*st.params, st.chunk->nodes(), st.node_unit);
    stages_.push_back(std::move(st));
  }
  if (train_.rebalance_experts > 0) {  // Note [Rebalancing experts]
    TANDEM_CHECK(model_.is_moe() && L.ep > 1, "--rebalance-experts ", train_.rebalance_experts,
                 " moves experts between expert-parallel ranks; it needs experts and "
                 "--expert-model-parallel-size > 1 (it is ",
                 L.ep, "), or 0");
    expert_load_.assign(static_cast<size_t>(model_.num_layers * model_.num_experts), 0);
  }
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

model::NodeContext PipelineTrainer::context(const StageRuntime& s) const {
  model::NodeContext c = s.chunk->context(train_.micro_batch_size, loss_scale_);
  c.ep = groups_->layout.ep > 1 ? &groups_->ep_data() : nullptr;
  c.recompute_experts = train_.recompute_experts;
  c.force_balanced_routing = train_.moe_router_force_balance;
  return c;
}

model::MicroBatchState& PipelineTrainer::prepare_forward(int32_t stage, int32_t mb,
                                                        int64_t iteration) {
  StageRuntime& s = local(stage);
  model::MicroBatchState& state = s.mbs[mb];
  const bool first = s.params->spec().has_embed, last = s.params->spec().has_head;
  if (first || last) {
    const int64_t global_mb = groups_->layout.dp_rank(groups_->rank) * num_mb_ + mb;
    MicroBatchTokens tokens = load_micro_batch(*data_, model_, train_, iteration, global_mb);
    if (first) state.ids = tokens.ids;
    if (last) state.targets = tokens.targets;
  }
  if (!first && is_local(stage - 1)) {  // the previous stage ran on this rank (V placement)
    state.input = std::exchange(local(stage - 1).mbs[mb].layers.back().out, Tensor());
  }
  TANDEM_CHECK(first || state.input.defined(), "schedule '", sched_.name, "': stage ", stage,
               " runs the forward of micro-batch ", mb, " before its input arrived");
  return state;
}

void PipelineTrainer::finish_forward(StageRuntime& s, int32_t mb,
                                     const model::MicroBatchState& state) {
  if (s.params->spec().has_head) pending_lm_.push_back(state.pending_lm_loss);
  // Summed at the step's end, in this order (Note [Routing counts on the host]).
  pending_aux_.push_back(state.aux_losses);
  record_expert_load(s, state);
  if (routing_.empty()) return;
  // The experts node keeps its input rows [R, H] until its backward: R is what it received.
  const auto first = static_cast<int32_t>(s.params->spec().layer_begin);
  for (size_t l = 0; l < state.layers.size(); ++l) {
    routing_.at(mb, first + static_cast<int32_t>(l)) = state.layers[l].experts.x_in.size(0);
  }
}

std::vector<schedule::RoutingCounts> PipelineTrainer::gather_routing(comm::Communicator& group) {
  const auto n = static_cast<int64_t>(routing_.expert_rows.size());
  Tensor mine = Tensor::empty({n}, DType::kI64, MemCategory::kOther, "routing.mine");
  std::copy(routing_.expert_rows.begin(), routing_.expert_rows.end(), mine.data<int64_t>());
  Tensor all = Tensor::empty({group.size() * n}, DType::kI64, MemCategory::kOther, "routing.all");
  group.all_gather(all, mine);
  std::vector<schedule::RoutingCounts> out(static_cast<size_t>(group.size()), routing_);
  for (int r = 0; r < group.size(); ++r) {
    std::copy(all.data<int64_t>() + r * n, all.data<int64_t>() + (r + 1) * n,
              out[static_cast<size_t>(r)].expert_rows.begin());
  }
  return out;
}

schedule::RoutingCounts PipelineTrainer::pipeline_routing_counts() {
  if (routing_.empty()) return routing_;
  // Each layer lives on one pipeline rank; the others report -1 for it.
  schedule::RoutingCounts out = routing_;
  for (const schedule::RoutingCounts& t : gather_routing(*groups_->pp)) {
    for (size_t i = 0; i < out.expert_rows.size(); ++i) {
      out.expert_rows[i] = std::max(out.expert_rows[i], t.expert_rows[i]);
    }
  }
  return out;
}

std::vector<schedule::RoutingCounts> PipelineTrainer::expert_group_routing_counts() {
  if (routing_.empty()) return {};
  return gather_routing(*groups_->ep);
}

void PipelineTrainer::forward(int32_t stage, int32_t mb, int64_t iteration) {
  model::MicroBatchState& state = prepare_forward(stage, mb, iteration);
  StageRuntime& s = local(stage);
  run_nodes(s, state, mb, ActionKind::kForward);
  finish_forward(s, mb, state);
}

DeviceStreams::SpanInfo PipelineTrainer::node_span(NodeKind kind, NodePhase phase, int32_t mb,
                                                   bool on_comm_stream, int half) const {
  const char* letter = phase == NodePhase::kForward ? "F" : phase == NodePhase::kBackwardInput
                                                               ? "B"
                                                               : "W";
  DeviceStreams::SpanInfo info;
  info.track = std::string(on_comm_stream ? "comm" : "compute") + (half ? "2" : "");
  info.name = letter + std::to_string(mb) + " " + std::string(node_kind_name(kind));
  info.kind = static_cast<int>(kind);
  info.phase = phase;
  info.all_to_all = schedule::node_is_communication(kind) && groups_->layout.ep > 1;
  return info;
}

void PipelineTrainer::run_nodes(StageRuntime& s, model::MicroBatchState& state, int32_t mb,
                                ActionKind kind) {
  const model::NodeContext c = context(s);
  const size_t n = s.chunk->nodes().size();
  if (dev_) {
    const bool ep_overlap = overlap_ != CommOverlap::kOff && groups_->layout.ep > 1;
    if (kind == ActionKind::kForward && ep_overlap && s.optimizer->update_pending()) {
      forward_beside_update_on_device(s, state, mb);  // Note [The update beside the first forward]
      return;
    }
    // Note [The unpaired backward's all-to-all] (combined.cc).
    const bool overlap = kind == ActionKind::kBackward && ep_overlap;
    const DeviceStream compute = DeviceStreams::compute();
    DeviceChain chain{compute, overlap ? dev_->mark(compute) : nullptr};
    for (size_t k = 0; k < n; ++k) {
      const size_t i = kind == ActionKind::kForward ? k : n - 1 - k;
      issue_node_on_device(s, state, c, i, kind, mb, overlap, chain);
    }
    join_chain(chain, "B" + std::to_string(mb));
    return;
  }
  if (kind == ActionKind::kForward) {
    for (size_t i = 0; i < n; ++i) {
      update_weights(s, s.weight_ends[i]);  // Note [The update beside the first forward]
      s.chunk->forward_node(i, state, c);
    }
    return;
  }
  update_weights(s, s.params->numel());
  for (size_t i = n; i-- > 0;) {
    if (kind != ActionKind::kBackwardWeight) s.chunk->backward_node(i, state, c);
    if (kind != ActionKind::kBackwardInput) {
      s.chunk->backward_weights_node(i, state, c);
      weight_grad_issued(s, i);
    }
  }
}

model::MicroBatchState& PipelineTrainer::prepare_backward(int32_t stage, int32_t mb) {
  StageRuntime& s = local(stage);
  model::MicroBatchState& state = s.mbs[mb];
  if (!s.params->spec().has_head && is_local(stage + 1)) {
    state.d_output = std::exchange(local(stage + 1).mbs[mb].layers.front().d_x, Tensor());
  }
  return state;
}

void PipelineTrainer::backward(int32_t stage, int32_t mb, model::WeightGrad wg) {
  model::MicroBatchState& state = prepare_backward(stage, mb);
  StageRuntime& s = local(stage);
  const bool with_w = wg == model::WeightGrad::kWithBackward;
  run_nodes(s, state, mb, with_w ? ActionKind::kBackward : ActionKind::kBackwardInput);
}

double PipelineTrainer::step_start_seconds() const {
  return std::chrono::duration<double>(step_start_.time_since_epoch()).count();
}

void PipelineTrainer::record_action_span(const Action& a,
                                         std::chrono::steady_clock::time_point start) {
  auto secs = [&](auto t) { return std::chrono::duration<double>(t - step_start_).count(); };
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(spans_mutex_);
  spans_.push_back({schedule::is_communication(a.kind) ? "comm" : "compute",
                    schedule::to_string(a), secs(start), secs(now)});
}

void PipelineTrainer::record_span(const char* stream, NodeKind kind, bool forward,
                                  int32_t mb, std::chrono::steady_clock::time_point start) {
  const auto now = std::chrono::steady_clock::now();
  auto secs = [&](auto t) { return std::chrono::duration<double>(t - step_start_).count(); };
  std::lock_guard lock(spans_mutex_);
  spans_.push_back({stream, std::string(forward ? "F" : "B") + std::to_string(mb) + " " +
                                std::string(node_kind_name(kind)),
                    secs(start), secs(now)});
  if (std::string_view(stream) == "comm") comm_busy_s_ += secs(now) - secs(start);
}

void PipelineTrainer::weights(int32_t stage, int32_t mb) {
  StageRuntime& s = local(stage);
  run_nodes(s, s.mbs[mb], mb, ActionKind::kBackwardWeight);
}

// Note [Pipeline messages]: activations go on tag 0 and gradients on tag 1; messages between a
// pair of ranks match in the order sent, which the validator has checked for the schedule.
void PipelineTrainer::communicate(const Action& a) {
  // Note [The update beside the first forward] (deferred_update.cc): a stage that receives its
  // input updates all its weights while it waits for it (the pipeline's warm-up bubble).
  if (a.kind == ActionKind::kRecvF) update_weights(local(a.stage), local(a.stage).params->numel());
  if (dev_) {
    communicate_on_device(a);
    return;
  }
  StageRuntime& s = local(a.stage);
  model::MicroBatchState& state = s.mbs[a.microbatch];
  const int64_t n = train_.micro_batch_size * model_.seq_length, h = model_.hidden_size;
  const DType dt = s.params->dtype();
  comm::Communicator& pp = *groups_->pp;
  switch (a.kind) {
    case ActionKind::kSendF: {
      // The stage output is in flight (not an activation); copy it into a communication buffer
      // so its storage goes now rather than when the receiver gets round to it.
      Tensor& out = state.layers.back().out;
      Tensor buf = Tensor::empty({n, h}, dt, MemCategory::kCommunication, "pp.send_f",
                                 current_device());
      buf.copy_from(out);
      release_storage({&out});
      out = Tensor();
      pending_.push_back(pp.isend(buf, sched_.stage_rank[a.stage + 1], 0));
      return;
    }
    case ActionKind::kRecvF:
      // In flight until layer 0's attention adopts it (Note [Hand-over]).
      state.input = Tensor::empty({n, h}, dt, MemCategory::kCommunication, "pp.recv_f",
                                  current_device());
      pp.recv(state.input, sched_.stage_rank[a.stage - 1], 0);
      return;
    case ActionKind::kSendB:
      pending_.push_back(pp.isend(std::exchange(state.layers.front().d_x, Tensor()),
                                  sched_.stage_rank[a.stage - 1], 1));
      return;
    case ActionKind::kRecvB:
      state.d_output = Tensor::empty({n, h}, dt, MemCategory::kOther, "pp.recv_b",
                                     current_device());
      pp.recv(state.d_output, sched_.stage_rank[a.stage + 1], 1);
      return;
    default:
      TANDEM_ASSERT(false, "not a communication action");
  }
}

// The GPU's pipeline messages (Note [Pipeline streams on the GPU]): each goes on its
// direction's stream after an event from the compute stream (the tensor is ready, and a
// received buffer's block is no longer used there), and a received tensor is used on the
// compute stream only after an event from the pipeline stream.
void PipelineTrainer::communicate_on_device(const Action& a) {
#if TANDEM_WITH_CUDA
  StageRuntime& s = local(a.stage);
  model::MicroBatchState& state = s.mbs[a.microbatch];
  const int64_t n = train_.micro_batch_size * model_.seq_length, h = model_.hidden_size;
  const DType dt = s.params->activation_dtype();
  const cudaStream_t compute = cuda::current_stream();
  const bool fwd = a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvF;
  const cudaStream_t side = fwd ? dev_->fwd() : dev_->bwd();
  comm::Communicator& group = fwd ? groups_->pp_fwd() : groups_->pp_bwd();
  dev_->wait_all(side, compute);
  const DeviceEvent begin = dev_->begin(side);
  DeviceStreams::SpanInfo span;
  span.track = "comm";
  span.name = schedule::to_string(a);
  switch (a.kind) {
    case ActionKind::kSendF:
    case ActionKind::kSendB: {
      Tensor& src = a.kind == ActionKind::kSendF ? state.layers.back().out
                                                 : state.layers.front().d_x;
      Tensor buf = std::exchange(src, Tensor());
      const int peer = sched_.stage_rank[a.kind == ActionKind::kSendF ? a.stage + 1 : a.stage - 1];
      cuda::StreamScope on_side(side);
      pending_.push_back(group.isend(buf, peer, fwd ? 0 : 1));
      dev_->end(side, begin, std::move(span));
      return;
    }
    case ActionKind::kRecvF:
    case ActionKind::kRecvB: {
      Tensor& dst = a.kind == ActionKind::kRecvF ? state.input : state.d_output;
      dst = Tensor::empty({n, h}, dt,
                          fwd ? MemCategory::kCommunication : MemCategory::kOther,
                          fwd ? "pp.recv_f" : "pp.recv_b", current_device());
      // The wait above already orders the receive after the new block's last use on the
      // compute stream (allocating enqueues nothing).
      {
        cuda::StreamScope on_side(side);
        group.recv(dst, sched_.stage_rank[fwd ? a.stage - 1 : a.stage + 1], fwd ? 0 : 1);
      }
      dev_->end(side, begin, std::move(span));
      dev_->wait_all(compute, side);
      return;
    }
    default:
      TANDEM_ASSERT(false, "not a communication action");
  }
#else
  (void)a;
#endif
}

void PipelineTrainer::run_action(const Action& a, int64_t iteration) {
  switch (a.kind) {
    case ActionKind::kForward: forward(a.stage, a.microbatch, iteration); return;
    case ActionKind::kBackward:
      backward(a.stage, a.microbatch, model::WeightGrad::kWithBackward);
      return;
    case ActionKind::kBackwardInput:
      backward(a.stage, a.microbatch, model::WeightGrad::kDeferred);
      return;
    case ActionKind::kBackwardWeight: weights(a.stage, a.microbatch); return;
    case ActionKind::kForwardBackward:
    case ActionKind::kForwardForward:
      run_combined(a, iteration);
      return;
    default: communicate(a); return;
  }
}

// Note [Gradient runs]: the gradients are reduced (and their norm summed) over runs of
// neighbouring entries of the flat buffer that share a group, not entry by entry: one NCCL call
// (or one sum-of-squares readback) per run instead of one per tensor. With one expert rank the
// experts' group is the data-parallel group itself, so the whole buffer is one run; with EP > 1
// a layer makes about two (its dense tensors, its experts). On 2 H200s per-tensor all-reduces of
// shape (b)'s 2.6 GB of f32 gradients took ~25 ms a step, about a third of NVLink's rate.
std::vector<PipelineTrainer::GradRun> PipelineTrainer::gradient_runs(
    const model::Parameters& params) const {
  std::vector<GradRun> runs;
  for (const model::ParamEntry& e : params.entries()) {
    const bool expert = e.shard == model::ParamShard::kExpert && groups_->layout.ep > 1;
    const int64_t n = shape_numel(e.shape);
    if (!runs.empty() && runs.back().expert == expert &&
        runs.back().begin + runs.back().count == e.offset) {
      runs.back().count += n;
    } else {
      runs.push_back({e.offset, n, expert});
    }
  }
  return runs;
}

void PipelineTrainer::reduce_gradients() {
  if (grad_reduce_overlapped()) {  // Note [Gradients reduced beside the backward]
    for (StageRuntime& s : stages_) {
      for (const StageRuntime::GradUnit& u : s.grad_units) {
        TANDEM_ASSERT(u.reduced, "unit ", u.name, " of stage ", s.stage, " still waits for ",
                      u.pending, " weight-gradient passes at the step's end");
      }
    }
    if (dev_) dev_->wait_all(DeviceStreams::compute(), dev_->reduce());
    return;
  }
  const comm::ParallelLayout& L = groups_->layout;
  for (StageRuntime& s : stages_) {
    for (const GradRun& run : gradient_runs(*s.params)) {  // Note [Gradient runs]
      comm::Communicator& group = run.expert ? groups_->edp_data() : groups_->dp_data();
      if ((run.expert ? L.edp() : L.dp()) > 1) {
        group.all_reduce_sum(s.params->flat_grads().narrow_rows(run.begin, run.count));
      }
    }
  }
}

// Note [Non-finite steps on several ranks]: the step's verdict must be the same on every rank,
// or some ranks would update and others not. The norm counts each gradient once (dense ones on
// data-parallel rank 0, experts on expert-data-parallel rank 0), so a NaN in a copy that is not
// counted would go unseen; each rank therefore also adds a flag, 1 when any of its own gradients
// is not finite, and the flags are summed with the norm in one all-reduce. The result (NaN when
// any flag is set) is the same on every rank, and so is the global loss.
// Note [Norm by expert]: experts that move between ranks (Note [Rebalancing experts]) would
// change which rank's partial sum holds each expert's squares, and so the norm's last bits (and
// the clipping's). With rebalancing on, each expert's squares go to a slot of its own, by layer
// and global id, in the all-reduce (one rank fills each slot, so the sum there is exact), and the
// slots are added in that order: the norm does not depend on the placement.
double PipelineTrainer::global_grad_norm() {
  const comm::ParallelLayout& L = groups_->layout;
  const bool by_expert = train_.rebalance_experts > 0;
  double sq = 0, non_finite = 0;
  std::vector<double> experts(by_expert ? model_.num_layers * model_.num_experts : 0, 0.0);
  // Every sum is enqueued before the first is read (one wait for the GPU, not one per sum),
  // then added in the same order as ever. slot: -1 the dense part, -2 none, else experts[slot].
  struct Part {
    ops::PendingScalar value;
    int64_t slot;
  };
  std::vector<Part> parts;
  for (StageRuntime& s : stages_) {
    const Tensor& g = s.params->flat_grads();
    for (const GradRun& run : gradient_runs(*s.params)) {  // Note [Gradient runs]
      if (run.expert && by_expert) continue;  // below, expert by expert
      const bool counted =
          (run.expert ? L.edp_rank(groups_->rank) : L.dp_rank(groups_->rank)) == 0;
      parts.push_back({ops::sum_squares_start(g.narrow_rows(run.begin, run.count)),
                       counted ? -1 : -2});
    }
    if (!by_expert) continue;
    for (const ExpertBlock& b : expert_blocks(*s.params)) {
      const int64_t slot = L.edp_rank(groups_->rank) == 0 ? b.layer * model_.num_experts + b.expert
                                                          : -2;
      parts.push_back({ops::sum_squares_start(g.narrow_rows(b.offset, expert_block_numel())),
                       slot});
    }
  }
  for (Part& p : parts) {
    const double part = p.value.get();
    if (!std::isfinite(part)) non_finite = 1;
    if (p.slot == -1) sq += part;
    if (p.slot >= 0) experts[static_cast<size_t>(p.slot)] = part;
  }
  Tensor t = Tensor::empty({2 + static_cast<int64_t>(experts.size())}, DType::kF64,
                           MemCategory::kOther, "grad_norm");
  t.data<double>()[0] = sq;
  t.data<double>()[1] = non_finite;
  std::copy(experts.begin(), experts.end(), t.data<double>() + 2);
  groups_->world->all_reduce_sum(t);
  if (t.data<double>()[1] > 0) return std::numeric_limits<double>::quiet_NaN();
  double total = t.data<double>()[0];
  for (size_t i = 0; i < experts.size(); ++i) total += t.data<double>()[2 + i];
  return std::sqrt(total);
}

StepResult PipelineTrainer::forward_backward(int64_t iteration) {
  DeviceScope on(train_.device);
  lm_sum_ = aux_sum_ = 0;
  pending_lm_.clear();
  pending_aux_.clear();
  spans_.clear();
  comm_busy_s_ = 0;
  step_start_ = std::chrono::steady_clock::now();
  if (dev_) dev_->begin_step();
  const double waited_before = compute_stream_->waited_seconds();
  for (StageRuntime& s : stages_) {
    s.mbs.assign(static_cast<size_t>(num_mb_), model::MicroBatchState{});
  }
  if (model_.is_moe()) {
    routing_ = schedule::RoutingCounts(static_cast<int32_t>(num_mb_),
                                       static_cast<int32_t>(model_.num_layers));
  }
  begin_grad_units();
  for (const Action& a : sched_.ranks[groups_->layout.pp_rank(groups_->rank)]) {
    const auto start = std::chrono::steady_clock::now();
    run_action(a, iteration);
    reduce_ready_units();  // CPU: Note [Gradients reduced beside the backward]
    if (!dev_ && !schedule::is_pair(a.kind)) record_action_span(a, start);
    // Note [Sends done early]: a delivered message's buffer goes now, not at the step's end,
    // as the planner frees it (its "in flight" ends at the receive).
    std::erase_if(pending_, [](const std::unique_ptr<comm::PendingSend>& p) { return p->done(); });
  }
  for (auto& p : pending_) p->wait();
  pending_.clear();
  // Before the gradients are reduced and the optimizer reads them: a loss whose targets were
  // bad throws here.
  for (ops::PendingScalar& l : pending_lm_) lm_sum_ += l.get();
  pending_lm_.clear();
  for (std::vector<ops::PendingScalar>& layers : pending_aux_) {
    aux_sum_ += model::sum_aux_losses(layers);
  }
  pending_aux_.clear();
  comm_exposed_s_ = compute_stream_->waited_seconds() - waited_before;
  for (StageRuntime& s : stages_) s.mbs.clear();
  reduce_gradients();
  Tensor losses = Tensor::empty({2}, DType::kF64, MemCategory::kOther, "losses");
  losses.data<double>()[0] = lm_sum_;
  losses.data<double>()[1] = aux_sum_;
  groups_->world->all_reduce_sum(losses);
  StepResult r;
  r.lm_loss = losses.data<double>()[0] * loss_scale_;
  r.aux_loss = losses.data<double>()[1] * loss_scale_;
  r.loss = r.lm_loss + r.aux_loss;
  r.tokens = train_.global_batch_size * model_.seq_length;
  return r;
}

StepResult PipelineTrainer::step() {
  DeviceScope on(train_.device);
  Allocator& alloc = allocator_for(train_.device);
  alloc.reset_peaks();
  const auto start = std::chrono::steady_clock::now();
  // A deferred update zeroes the gradients it reads (Note [Deferred update] in optimizer.cc).
  for (StageRuntime& s : stages_) {
    if (!s.optimizer->update_pending()) s.params->zero_grads();
  }
  StepResult r = forward_backward(iteration_);
  const int64_t this_iteration = iteration_ + 1;
  if (after_backward_) after_backward_(stages_, this_iteration);
  r.grad_norm = global_grad_norm();
  // Note [Non-finite steps on several ranks]: both values are the same on every rank.
  const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  check_step_verdict(train_, this_iteration, r.loss, r.grad_norm, finite);
  iteration_ = this_iteration;
  r.iteration = iteration_;
  r.lr = learning_rate(train_, iteration_);
  for (StageRuntime& s : stages_) {
    if (finite) {
      // Every rank steps all of its stages' weights (the gradients are all-reduced, nothing is
      // gathered after): the step writes the compute copy itself, as in Trainer::step.
      // Note [The update beside the first forward] (deferred_update.cc).
      const double coeff = clip_coefficient(r.grad_norm, train_.clip_grad);
      if (train_.defer_optimizer) {
        s.optimizer->defer_step(r.lr, coeff);
      } else {
        s.optimizer->step(r.lr, coeff);
      }
    } else {
      s.params->zero_grads();
    }
  }
  if (!finite) r.status = StepStatus::kSkipped;
  rebalance_experts();  // part of the step's time
  synchronize_device(train_.device);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (dev_) {  // every event of the step has completed
    DeviceStreams::StepTimes t = dev_->resolve();
    spans_ = std::move(t.spans);
    comm_busy_s_ = t.all_to_all_s;
    comm_exposed_s_ = t.exposed_s;
    // Note [Waiting for the slowest expert rank]: every rank of the expert group is here.
    comm_waiting_s_ = -1;
    if (groups_->layout.ep > 1) {
      const std::vector<std::string> group =
          groups_->ep->all_gather_bytes(alltoall_durations_text(t.all_to_all));
      comm_waiting_s_ = exposed_waiting_seconds(t.all_to_all, group, t.compute);
    }
    node_times_ = t.node_times;
    fb_seconds_ = t.end_s;
    // Note [The step's end in the plan] (schedule/simulator.cc): the host's step past the
    // forward-backward and the all-reduce, per weight of this rank's stages.
    int64_t weights = 0;
    for (const StageRuntime& s : stages_) weights += s.params->numel();
    const double end = r.seconds - std::max(t.end_s, t.reduce_end_s);
    if (end > 0 && weights > 0) {
      node_times_.step_end_s_per_weight = end / static_cast<double>(weights);
    }
    node_times_.defer_optimizer = train_.defer_optimizer;
  }
  r.memory = alloc.stats();
  r.activation_peak = r.memory.peak_of(MemCategory::kActivation);
  return r;
}

}  // namespace tandem::runtime
