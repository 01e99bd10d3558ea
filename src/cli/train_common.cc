// Pieces of `tandem train` around its loop (train_common.h).
#include "cli/train_common.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

#include "cli/validation.h"
#include "comm/mpi_communicator.h"
#include "comm/self_communicator.h"
#include "core/device.h"
#include "core/test_faults.h"
#include "core/tuning.h"
#if TANDEM_WITH_CUDA
#include "core/cuda/context.h"
#include "core/cuda/wait.h"
#endif
#include "data/addition.h"
#include "data/file_dataset.h"
#include "data/mock.h"
#include "ops/ops.h"
#include "runtime/step.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::cli {

void check_supported(const RunOptions& o) {
  const ParallelConfig& p = o.parallel;
  TANDEM_CHECK(comm::launched_by_mpirun() ||
                   (p.pipeline_model_parallel_size == 1 && p.expert_model_parallel_size == 1),
               "--pipeline-model-parallel-size ", p.pipeline_model_parallel_size,
               " and --expert-model-parallel-size ", p.expert_model_parallel_size,
               " need one process per rank: start tandem with mpirun -np N (N a multiple of ",
               p.pipeline_model_parallel_size * p.expert_model_parallel_size, ")");
  TANDEM_CHECK(o.node_times_out.empty() || o.train.device != Device::kCPU, "--node-times-out ",
               o.node_times_out,
               ": node times are measured with CUDA events, with or without mpirun; use "
               "--device cuda");
  TANDEM_CHECK(o.routing_out.empty() || o.model.is_moe(), "--routing-out ", o.routing_out,
               ": routing needs experts (--num-experts > 0)");
  // The document options' rules (TrainConfig::validate's; those of one data-parallel rank hold
  // whenever those of several do) before the device is opened, so that a refusal (with
  // --mtp-num-layers, say) names the option on any machine.
  if (o.train.document_masking()) {
    o.train.validate();
    runtime::check_document_masking(o.model, o.train);
  }
}

void open_device(const RunOptions& o) {
  set_tuning(o.tuning);  // Note [Performance settings] in core/tuning.h
  if (o.train.device == Device::kCPU) return;
#if TANDEM_WITH_CUDA
  const int gpus = cuda::device_count();
  TANDEM_CHECK(gpus > 0,
               "--device cuda: no GPU is visible on this machine (valid here: "
               "--device cpu)");
  const int local = comm::launched_by_mpirun() ? comm::local_rank() : 0;
  TANDEM_CHECK(local < gpus, "--device cuda: local rank ", local, " needs GPU ", local,
               " but this machine has ", gpus, "; start at most ", gpus, " ranks per machine");
  cuda::initialize(local);
  // Note [Bounded waits on the GPU]: under mpirun a wait for the GPU may wait for a peer.
  if (comm::launched_by_mpirun()) cuda::set_wait_limit(o.parallel.comm_timeout_s);
#else
  TANDEM_CHECK(false, "--device ", enum_name(o.train.device),
               " is not available in this build: valid is cpu (built without CUDA)");
#endif
}

std::string device_text(Device device) {
  if (device == Device::kCPU) return "the CPU";
#if TANDEM_WITH_CUDA
  return cuda::device_description();
#else
  return "a GPU";
#endif
}

std::unique_ptr<comm::Communicator> make_world(const RunOptions& o) {
  if (comm::launched_by_mpirun()) return comm::mpi_world(o.parallel.comm_timeout_s);
  return comm::self_world();
}

RunLayout make_layout(std::unique_ptr<comm::Communicator> world, RunOptions& o) {
  const ParallelConfig& p = o.parallel;
  RunLayout out;
  out.groups = std::make_unique<runtime::Groups>(runtime::Groups::make(
      std::move(world), static_cast<int>(p.pipeline_model_parallel_size),
      static_cast<int>(p.expert_model_parallel_size),
      static_cast<int>(p.tensor_model_parallel_size), o.train.device,
      /*second_expert_group=*/p.comm_overlap == CommOverlap::kSplit, p.comm_timeout_s));
  const comm::ParallelLayout& L = out.groups->layout;
  o.train.validate(L.dp());
  out.shape = {static_cast<int32_t>(L.pp),
               static_cast<int32_t>(p.virtual_pipeline_model_parallel_size),
               static_cast<int32_t>(o.train.num_microbatches(L.dp())), p.pair_first_forwards};
  out.sched = schedule::generate_schedule(schedule_kind(p), out.shape);
  schedule::validate_schedule(out.sched);
  return out;
}

std::unique_ptr<data::Dataset> make_dataset(const RunOptions& o) {
  if (o.mock_data) return std::make_unique<data::MockDataset>(o.train.seed, o.model.vocab_size);
  if (o.data_path.empty() && o.train_data_path.empty()) {
    TANDEM_CHECK(o.addition_max_digits <= data::kAdditionMaxDigitsLimit, "--addition-max-digits ",
                 o.addition_max_digits, " is invalid: it must be between 1 and ",
                 data::kAdditionMaxDigitsLimit);
    return std::make_unique<data::AdditionDataset>(o.train.seed,
                                                   static_cast<int>(o.addition_max_digits));
  }
  return open_data_path(o, data::SplitPart::kTrain);
}

ReporterConfig reporter_config(const RunOptions& o) {
  ReporterConfig rc;
  rc.total_iters = o.train.train_iters;
  rc.log_interval = o.train.log_interval;
  rc.log_json_path = o.log_json;
  rc.tensorboard_dir = o.tensorboard_dir;
  rc.timers_to_tensorboard = o.log_timers_to_tensorboard;
  rc.verbosity = o.quiet ? Verbosity::kQuiet : Verbosity::kNormal;
  return rc;
}

IterationRecord to_record(const runtime::StepResult& r) {
  IterationRecord rec;
  rec.iter = r.iteration;
  rec.status =
      r.status == runtime::StepStatus::kSkipped ? UpdateStatus::kSkipped : UpdateStatus::kApplied;
  rec.loss = r.loss;
  rec.lm_loss = r.lm_loss;
  rec.aux_loss = r.aux_loss;
  rec.mtp_loss = r.mtp_loss > 0 ? r.mtp_loss : -1;
  rec.lr = r.lr;
  rec.grad_norm = r.grad_norm;
  rec.step_seconds = r.seconds;
  rec.tokens_per_s = r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0;
  rec.mem_in_use_bytes = {r.memory.total_in_use};
  rec.mem_peak_bytes = {r.memory.total_peak};
  rec.activation_peak_bytes = {r.activation_peak};
  rec.expert_load_max_over_mean = r.expert_load_max_over_mean;
  return rec;
}

void check_same_config(comm::Communicator& world, const RunOptions& o) {
  const std::vector<std::string> all = world.all_gather_bytes(canonical_options(o));
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    throw Error(detail::concat("rank ", r,
                               " was started with a different configuration than rank "
                               "0: ",
                               lb, " on rank ", r, " but ", la,
                               " on rank 0; start every rank with the same options"));
  }
}

namespace {

// The first element of a gradient buffer set to NaN.
void poison_gradient(const Tensor& g) {
  if (g.dtype() == DType::kF32) g.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  if (g.dtype() == DType::kF64) g.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

void install_test_faults(runtime::PipelineTrainer& trainer) {
  const TestFaults f = test_faults();
  const bool mine = f.fault_mode == "nan" && f.fault_rank == trainer.groups().rank;
  if (!mine && f.poison_grad_iteration < 0) return;
  const int64_t at = mine ? f.fault_iteration : f.poison_grad_iteration;
  trainer.set_after_backward_hook([at](std::vector<runtime::StageRuntime>& stages, int64_t it) {
    if (it == at) poison_gradient(stages.front().params->flat_grads());
  });
}

void test_faults_before_step(int rank, int64_t iteration) {
  const TestFaults f = test_faults();
  if (f.fault_rank != rank || f.fault_iteration != iteration) return;
  if (f.fault_mode == "exit") std::_Exit(9);
  if (f.fault_mode != "hang") return;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

}  // namespace tandem::cli
