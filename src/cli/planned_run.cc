// The plan of a training run as `tandem train` runs it: its memory before the first step
// (printed, logged beside the measured peaks, a warning when it will not fit on the GPU) and the
// inputs `tandem plan` shares with it.
#include "cli/planned_run.h"

#include <algorithm>
#include <iostream>

#include "cli/options.h"
#include "cli/progress.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/footprint.h"

namespace tandem::cli {

schedule::PlanInputs run_inputs(const RunOptions& o, int64_t dp) {
  schedule::PlanInputs in;
  // Note [Tensor parallelism] (core/config_tp.cc): a tensor-parallel rank holds and computes the
  // shard model of tensor_parallel_shard (its q/k/v, o, gate/up and down; the rest whole), so its
  // weights, gradients, Adam moments and saved activations are that model's, planned as one
  // rank's. The all-reduces over the tensor-parallel group run in place (no buffer); their time
  // is Note [Tensor-parallel all-reduces in the plan] (planner/pipeline_model.cc).
  const int64_t tp = o.parallel.tensor_model_parallel_size;
  in.model = tp > 1 ? tensor_parallel_shard(o.model, tp) : o.model;
  in.tensor_parallel_size = tp;
  in.micro_batch_size = o.train.micro_batch_size;
  in.expert_parallel_size = o.parallel.expert_model_parallel_size;
  in.gpu = o.train.device == Device::kCUDA;
  in.activation_elem_bytes = in.gpu ? 2 : 4;
  in.recompute_experts = o.train.recompute_experts;
  in.recompute = parse_recompute(o.train.recompute);
  in.moe_wgrad_merge = o.train.moe_wgrad_merge;
  in.first_stage_layers = o.train.first_stage_layers;  // Note [Uneven stages] in core/config.h
  in.last_stage_layers = o.train.last_stage_layers;
  // Note [Offload in the plan]; refuses (exit 2) what the model has not before anything runs.
  in.offload_kinds = parse_offload_kinds(o.train.offload_activations, o.model);
  in.defer_optimizer = o.train.defer_optimizer;  // Note [Deferred update in the plan]
  in.data_parallel_size = dp;                    // Note [Gradient reduction in the plan]
  in.overlap_grad_reduce = o.train.overlap_grad_reduce;
  // Note [Distributed optimizer in the plan] (planner/pipeline_model.h).
  in.distributed_optimizer = o.train.use_distributed_optimizer;
  // Note [Document masks in the plan] (planner/simulator_state.cc).
  in.document_masks = o.train.document_mask_count();
  in.eod_mask_loss = o.train.eod_mask_loss;
  return in;
}

schedule::PlanRequest run_request(const RunOptions& o, const std::string& schedule_name,
                                  const schedule::ScheduleShape& shape, int64_t dp) {
  schedule::PlanRequest req;
  req.schedule_name = schedule_name;
  req.shape = shape;
  req.inputs = run_inputs(o, dp);
  return req;
}

schedule::Plan plan_training_run(const RunOptions& o, const std::string& schedule_name,
                                 const schedule::ScheduleShape& shape, int64_t dp) {
  return schedule::make_plan(run_request(o, schedule_name, shape, dp));
}

std::optional<schedule::Plan> plan_of_run(const RunOptions& o, const std::string& schedule_name,
                                          const schedule::ScheduleShape& shape, int64_t dp,
                                          std::string& why) {
  try {
    return plan_training_run(o, schedule_name, shape, dp);
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

void set_planned_peaks(IterationRecord& rec, const schedule::Plan& plan,
                       const std::vector<int32_t>& pipeline_rank_of_world_rank) {
  rec.planned_peak_bytes.clear();
  rec.planned_activation_peak_bytes.clear();
  for (const int32_t p : pipeline_rank_of_world_rank) {
    const schedule::RankResult& r = plan.sim.ranks.at(static_cast<size_t>(p));
    rec.planned_peak_bytes.push_back(r.peak_bytes);
    rec.planned_activation_peak_bytes.push_back(r.activation_peak_bytes);
  }
  if (plan.inputs.offload_kinds != 0) {
    rec.planned_offload_host_peak_bytes.clear();
    for (const int32_t p : pipeline_rank_of_world_rank) {
      rec.planned_offload_host_peak_bytes.push_back(
          plan.sim.ranks.at(static_cast<size_t>(p)).offload_host_peak_bytes);
    }
  }
}

std::string planned_memory_line(const schedule::Plan& plan) {
  std::string peaks, acts, host;
  for (const schedule::RankResult& r : plan.sim.ranks) {
    peaks += (peaks.empty() ? "" : ", ") + format_bytes(r.peak_bytes);
    acts += (acts.empty() ? "" : ", ") + format_bytes(r.activation_peak_bytes);
    host += (host.empty() ? "" : ", ") + format_bytes(r.offload_host_peak_bytes);
  }
  const bool many = plan.sim.ranks.size() > 1;
  return detail::concat("memory as planned (tandem plan",
                        plan.inputs.expert_parallel_size > 1 ? ", balanced routing" : "",
                        "): peak ", peaks, many ? " per pipeline rank" : "", ", of it activations ",
                        acts,
                        plan.inputs.offload_kinds != 0 ? ", offloaded to the host " + host : "");
}

}  // namespace tandem::cli
