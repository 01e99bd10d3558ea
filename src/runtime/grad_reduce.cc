// Gradients reduced over the data-parallel groups while the backward still runs: each unit of a
// chunk (the embedding, a layer, the head) as soon as its last weight gradient of the step has
// been issued.
//
// Note [Gradients reduced beside the backward]: a unit's gradients are final once every one of
// its nodes that writes weight gradients has done so for every micro-batch of the step: the
// host counts those passes as it issues them (num_mb per weighted node; schedules that split the
// weight gradient off, zb-h1 and dualpipev, count their W actions), so the rule holds for every
// schedule. Units are whole layers because a node may write the gradient of a weight another
// node reads (the router's, written by the attention node's backward, sits among the layer's MoE
// weights); within one micro-batch's backward a layer's nodes run from its last to its first,
// so the layer is final at its attention. The last backward then reduces the head first and the
// embedding last, each unit beside the backward of the units below it.
// On the GPU the reduction of a unit goes on a stream of its own (DeviceStreams::reduce, low
// priority), after an event on the stream that ran the unit's last weight gradient (every
// earlier write to the unit is ordered before that one: earlier actions were joined to the
// compute stream, and both halves of a pair start after it), through the data-parallel NCCL
// groups; the compute stream waits for it before the gradient norm reads the gradients. On the
// CPU (MPI) each unit made final by an action is reduced right after that action, so the CPU
// ranks run the same bookkeeping and the same calls in the same order (their tests check it)
// without an overlap to gain. Every data-parallel rank runs the same schedule, so each group sees
// its reductions in the same order everywhere; a rank that waits in one waits only for its own
// stage's replicas, which run the same actions. On the GPU the reduce stream's all-reduces run
// beside the all-to-alls and pipeline messages of other NCCL communicators; NCCL asks that
// communicators used at once get their operations in the same order on every rank, which holds:
// one host thread issues all of them in the schedule's order, the same on every rank.
// Each element is summed over the same ranks as at the step's end; with two ranks a sum has one
// order (a + b), so the values are bitwise those of reducing at the end; with more, the
// library's summation order may depend on the size of the call (last bits).
#include <algorithm>
#include <string>

#include "runtime/distributed.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#endif

namespace tandem::runtime {

std::vector<StageRuntime::GradUnit> gradient_units(const model::Parameters& params,
                                                   const std::vector<model::NodeRef>& nodes,
                                                   std::vector<int32_t>& node_unit) {
  const int64_t layer_begin = params.spec().layer_begin;
  const auto layers = static_cast<size_t>(params.spec().layer_end - layer_begin);
  // Unit index by kind: 0 the embedding, 1 + l layer l, 1 + layers the head.
  std::vector<StageRuntime::GradUnit> all(layers + 2);
  all[0].name = "embed";
  for (size_t l = 0; l < layers; ++l) {
    all[1 + l].name = "layer " + std::to_string(layer_begin + static_cast<int64_t>(l));
  }
  all[1 + layers].name = "head";
  std::vector<int64_t> numel(all.size(), 0);
  for (auto& u : all) u.begin = params.numel();
  const std::string prefix = "model.layers.";
  for (const model::ParamEntry& e : params.entries()) {
    size_t k = 1 + layers;  // model.norm and lm_head
    if (e.name.rfind(prefix, 0) == 0) {
      k = 1 + static_cast<size_t>(std::stoll(e.name.substr(prefix.size())) - layer_begin);
      TANDEM_ASSERT(k >= 1 && k <= layers, "weight ", e.name, " outside the chunk's layers");
    } else if (e.name.rfind("model.embed_tokens.", 0) == 0) {
      k = 0;
    }
    const int64_t n = shape_numel(e.shape);
    all[k].begin = std::min(all[k].begin, e.offset);
    all[k].end = std::max(all[k].end, e.offset + n);
    numel[k] += n;
  }
  std::vector<int32_t> index(all.size(), -1);
  std::vector<StageRuntime::GradUnit> out;
  node_unit.clear();
  for (const model::NodeRef& node : nodes) {
    const size_t k = node.kind == NodeKind::kEmbed  ? 0
                     : node.kind == NodeKind::kLoss ? 1 + layers
                                                    : 1 + static_cast<size_t>(node.layer);
    TANDEM_ASSERT(k < all.size(), "node outside the chunk's units");
    if (index[k] < 0) {
      // One range each, and nothing else inside it: the flat buffers hold a unit's weights
      // side by side (Parameters' order: embedding, layers, head).
      TANDEM_ASSERT(numel[k] == all[k].end - all[k].begin, "unit ", all[k].name,
                    "'s weights are not contiguous");
      index[k] = static_cast<int32_t>(out.size());
      out.push_back(all[k]);
    }
    if (schedule::node_has_weights(node.kind)) ++out[static_cast<size_t>(index[k])].weighted_nodes;
    node_unit.push_back(index[k]);
  }
  return out;
}

bool PipelineTrainer::grad_reduce_overlapped() const {
  const comm::ParallelLayout& L = groups_->layout;
  return train_.overlap_grad_reduce && (L.dp() > 1 || (L.ep > 1 && L.edp() > 1));
}

void PipelineTrainer::begin_grad_units() {
  ready_units_.clear();
  for (StageRuntime& s : stages_) {
    for (StageRuntime::GradUnit& u : s.grad_units) {
      u.pending = u.weighted_nodes * num_mb_;
      u.reduced = false;
    }
  }
}

void PipelineTrainer::weight_grad_issued(StageRuntime& s, size_t node, DeviceStream stream) {
  // Only nodes with weights count (StageRuntime::GradUnit::weighted_nodes).
  if (!grad_reduce_overlapped() || !schedule::node_has_weights(s.chunk->nodes()[node].kind)) return;
  const auto k = static_cast<size_t>(s.node_unit[node]);
  StageRuntime::GradUnit& u = s.grad_units[k];
  TANDEM_ASSERT(u.pending > 0, "unit ", u.name, " of stage ", s.stage,
                " got more weight gradients than the step's micro-batches");
  if (--u.pending > 0) return;
  if (!dev_) {
    ready_units_.emplace_back(&s, k);  // reduced after the action (reduce_ready_units)
    return;
  }
#if TANDEM_WITH_CUDA
  const DeviceStream reduce = dev_->reduce();
  DeviceStreams::wait(reduce, dev_->mark(stream));
  cuda::StreamScope on(reduce);
  const DeviceEvent begin = dev_->begin(reduce);
  DeviceStreams::SpanInfo info;
  info.bus_bytes = reduce_unit(s, u);
  info.track = "reduce";
  info.name = "reduce " + u.name;
  dev_->end(reduce, begin, std::move(info));
#else
  (void)stream;
#endif
}

void PipelineTrainer::reduce_ready_units() {
  for (const auto& [stage, k] : ready_units_) reduce_unit(*stage, stage->grad_units[k]);
  ready_units_.clear();
}

double PipelineTrainer::reduce_unit(StageRuntime& s, StageRuntime::GradUnit& u) {
  const comm::ParallelLayout& L = groups_->layout;
  double bus_bytes = 0;
  for (const GradRun& run : gradient_runs(*s.params)) {  // Note [Gradient runs]
    const int64_t begin = std::max(run.begin, u.begin);
    const int64_t end = std::min(run.begin + run.count, u.end);
    const int n = run.expert ? L.edp() : L.dp();
    if (begin >= end || n <= 1) continue;
    comm::Communicator& group = run.expert ? groups_->edp_data() : groups_->dp_data();
    const Tensor grads = s.params->flat_grads().narrow_rows(begin, end - begin);
    group.all_reduce_sum(grads);
    bus_bytes += static_cast<double>(grads.nbytes()) * 2.0 * (n - 1) / n;
  }
  u.reduced = true;
  return bus_bytes;
}

}  // namespace tandem::runtime
