// Note [Counted once]: a weight held by several ranks is counted by one of them. Without the
// distributed optimizer, a dense run of the flat buffers by data-parallel rank 0 and an experts'
// run by expert-data-parallel rank 0 (gradient_runs, as the gradient norm counts them); with it,
// each rank counts the part it owns (ShardPiece::own_*), the parts of a group covering each
// weight once, and the only gradients reduced in full. Pipeline ranks and expert ranks hold
// different weights, and tensor-parallel ranks different parts of the split ones (each counts
// its own) but the same replicated ones (counted by tp rank 0). The counts are summed over the
// world.
#include "runtime/step_figures.h"

#include <cmath>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "runtime/distributed_optimizer.h"
#include "runtime/grad_reduce.h"

namespace tandem::runtime {
namespace {

// The [begin, begin + count) ranges of a stage's flat buffers this rank counts.
std::vector<std::pair<int64_t, int64_t>> counted_ranges(const StageRuntime& s,
                                                        const Groups& groups) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (s.shards) {
    for (const ShardPiece& p : s.shards->pieces()) {
      if (p.own_count > 0) out.emplace_back(p.own_begin, p.own_count);
    }
    return out;
  }
  const comm::ParallelLayout& L = groups.layout;
  for (const GradRun& run : gradient_runs(*s.params, L.ep)) {
    if (counts_run(run, L, groups.rank)) out.emplace_back(run.begin, run.count);
  }
  return out;
}

double world_sum(Groups& groups, double v) {
  Tensor t = Tensor::empty({1}, DType::kF64, MemCategory::kOther, "step_figure");
  t.data<double>()[0] = v;
  groups.world->all_reduce_sum(t);
  return t.data<double>()[0];
}

template <typename T>
int64_t zeros_of(const Tensor& host) {
  const T* p = host.data<T>();
  int64_t n = 0;
  for (int64_t i = 0; i < host.numel(); ++i) n += p[i] == T(0);
  return n;
}

}  // namespace

double params_norm(PipelineTrainer& trainer) {
  trainer.finish_updates();
  double sq = 0;
  for (const StageRuntime& s : trainer.stages()) {
    for (const auto& [begin, count] : counted_ranges(s, trainer.groups())) {
      sq += ops::sum_squares(s.params->flat_params().narrow_rows(begin, count));
    }
  }
  return std::sqrt(world_sum(trainer.groups(), sq));
}

int64_t grad_zeros(PipelineTrainer& trainer) {
  double zeros = 0;
  for (const StageRuntime& s : trainer.stages()) {
    for (const auto& [begin, count] : counted_ranges(s, trainer.groups())) {
      const Tensor host =
          s.params->flat_grads().narrow_rows(begin, count).to(Device::kCPU, MemCategory::kOther);
      zeros += static_cast<double>(host.dtype() == DType::kF64 ? zeros_of<double>(host)
                                                               : zeros_of<float>(host));
    }
  }
  return static_cast<int64_t>(world_sum(trainer.groups(), zeros));
}

}  // namespace tandem::runtime
