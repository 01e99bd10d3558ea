// The pipeline trainer on GPUs (one rank per GPU): combined 1F1B with expert parallelism gives
// bit for bit the same steps whether the all-to-all runs on its own high-priority stream or in
// order on the compute stream (Note [Combined 1F1B on streams] in runtime/combined.cc), and the
// measured timeline comes from CUDA events (Note [Measured on the GPU] in device_streams.h):
// all-to-all spans on the comm track only when overlapped, exposed time never above busy time,
// every node kind timed. Needs two GPUs, so it is never registered with ctest. Run it by hand:
//   mpirun -np 2 build/tests/cuda/test_gpu_pipeline
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "common/random_tokens.h"
#include "core/cuda/context.h"
#include "core/device.h"
#include "core/tensor.h"
#include "planner/planner.h"
#include "runtime/checkpoint_parallel.h"
#include "runtime/pipeline_trainer.h"
#include "schedule/generators.h"
#include "schedule/validator.h"

namespace tandem::runtime {
namespace {

comm::Communicator* g_world = nullptr;

// Two MoE layers small enough to run in moments, with GQA and four experts over two ranks. The
// output layer is the embedding table (Note [Tied embeddings] in model/parameters.h): the split
// streams then order the pair's writes of its gradient (Note [Tied gradient in a pair] in
// runtime/combined.cc), and a pipeline of two sums it over the embedding group.
ModelConfig small_moe() {
  return ModelConfig{.vocab_size = 96,
                     .hidden_size = 64,
                     .num_layers = 2,
                     .num_attention_heads = 4,
                     .num_query_groups = 2,
                     .ffn_hidden_size = 96,
                     .num_experts = 4,
                     .moe_router_topk = 2,
                     .moe_aux_loss_coeff = 0.01,
                     .seq_length = 32};
}

struct TrainRun {
  std::vector<double> losses, norms;
  std::vector<float> params;  // every master weight after the last step
  // Rank 0: every weight and Adam moment of the model by name (gather_checkpoint); others empty.
  NamedTensors state;
  int rebalances = 0;  // steps that re-placed experts (Note [Rebalancing experts])
  std::vector<Span> timeline;
  double busy = 0, exposed = 0, waiting = -1, forward_backward = 0, step_seconds = 0;
  schedule::NodeTimesTable node_times;
  int64_t optimizer_bytes = 0;  // the trainer's, in the GPU allocator's optimizer category
};

// pp 2: a pipeline of two stages (1f1b) instead of two expert ranks (combined-1f1b).
TrainRun train(CommOverlap overlap, int steps, bool pair_first_forwards = false,
               int64_t rebalance_experts = 0, bool defer_optimizer = false, int pp = 1,
               bool overlap_grad_reduce = true, bool distributed_optimizer = false,
               bool overlap_param_gather = false) {
  const ModelConfig m = small_moe();
  TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 16;  // 4 micro-batches on each of the 2 data-parallel ranks
  t.train_iters = steps;
  t.lr = 1e-3;
  t.device = Device::kCUDA;
  t.rebalance_experts = rebalance_experts;
  t.defer_optimizer = defer_optimizer;
  t.overlap_grad_reduce = overlap_grad_reduce;
  t.use_distributed_optimizer = distributed_optimizer;
  t.overlap_param_gather = overlap_param_gather;
  Groups groups = Groups::make(g_world->subgroup({0, 1}, "world"), pp, 2 / pp, 1, Device::kCUDA,
                               /*second_expert_group=*/overlap == CommOverlap::kSplit);
  // 16 samples of 2: 4 micro-batches on each of 2 data-parallel ranks, or 8 down the pipeline.
  const schedule::ScheduleShape shape{pp, 1, 4 * pp, pair_first_forwards};
  const schedule::Schedule sched = schedule::generate_schedule(
      pp == 1 ? schedule::ScheduleKind::kCombined1f1b : schedule::ScheduleKind::k1f1b, shape);
  schedule::validate_schedule(sched);
  const testing::RandomTokens data(m.vocab_size);
  const int64_t before = allocator_for(Device::kCUDA).stats().in_use_of(MemCategory::kOptimizer);
  PipelineTrainer trainer(m, t, sched, groups, data, DType::kF32, overlap);
  TrainRun r;
  r.optimizer_bytes =
      allocator_for(Device::kCUDA).stats().in_use_of(MemCategory::kOptimizer) - before;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = trainer.step();
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
    r.step_seconds = s.seconds;
    r.rebalances += trainer.last_rebalance().has_value();
  }
  const CheckpointState gathered = gather_checkpoint(trainer, nlohmann::json::object());
  r.state = gathered.model;
  r.state.insert(r.state.end(), gathered.optimizer.begin(), gathered.optimizer.end());
  const Tensor host = trainer.stages().front().params->flat_params().to(Device::kCPU);
  r.params.assign(host.data<float>(), host.data<float>() + host.numel());
  r.timeline = trainer.timeline();
  r.busy = trainer.comm_busy_seconds();
  r.exposed = trainer.comm_exposed_seconds();
  r.waiting = trainer.comm_exposed_waiting_seconds();
  r.forward_backward = trainer.measured_forward_backward_seconds();
  r.node_times = trainer.measured_node_times();
  return r;
}

int comm_track_all_to_all(const std::vector<Span>& spans) {
  int n = 0;
  for (const Span& s : spans) {
    const bool a2a =
        s.name.find("dispatch") != std::string::npos || s.name.find("combine") != std::string::npos;
    if (s.stream == "comm" && a2a) ++n;
  }
  return n;
}

bool has_span(const std::vector<Span>& spans, const std::string& stream, const std::string& name) {
  for (const Span& s : spans) {
    if (s.stream == stream && s.name == name) return true;
  }
  return false;
}

// The same losses, gradient norms and master weights, bit for bit.
void expect_bitwise_equal(const TrainRun& a, const TrainRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.norms[i], b.norms[i]) << "step " << i + 1;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.params.size(); ++i) differ += a.params[i] != b.params[i];
  EXPECT_EQ(differ, 0u) << "of " << a.params.size() << " master weights";
}

// Rank 0: the same weights and Adam moments by name, bit for bit (TrainRun::state).
void expect_same_state(const TrainRun& got, const TrainRun& want) {
  ASSERT_EQ(got.state.size(), want.state.size());
  for (size_t i = 0; i < want.state.size(); ++i) {
    const Tensor& a = got.state[i].second;
    const Tensor& b = want.state[i].second;
    ASSERT_EQ(got.state[i].first, want.state[i].first);
    EXPECT_TRUE(a.nbytes() == b.nbytes() &&
                std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0)
        << want.state[i].first;
  }
}

TEST(GpuPipeline, CombinedOverlapIsBitwiseTheSameAsInOrder) {
  const TrainRun on = train(CommOverlap::kOn, 3);
  const TrainRun off = train(CommOverlap::kOff, 3);
  expect_bitwise_equal(on, off);
  EXPECT_LT(on.losses.back(), on.losses.front());  // it trains
}

// Note [Paired forwards]: (0F0;0F1) with the all-to-all on its own stream, bit for bit the
// unpaired schedule in order, and each first forward's all-to-all on the comm track.
TEST(GpuPipeline, PairedFirstForwardsAreBitwiseTheSameAsInOrder) {
  const TrainRun paired = train(CommOverlap::kOn, 3, true);
  const TrainRun off = train(CommOverlap::kOff, 3);
  expect_bitwise_equal(paired, off);
  EXPECT_TRUE(has_span(paired.timeline, "comm", "F0 dispatch"));
  EXPECT_TRUE(has_span(paired.timeline, "comm", "F1 combine"));
}

// Note [A stream pair per half]: each micro-batch of a pair on a compute and a communication
// stream of its own (the second half's all-to-alls through a second NCCL expert group), bit for
// bit the in-order run, with spans on all four tracks.
TEST(GpuPipeline, SplitStreamsAreBitwiseTheSameAsInOrder) {
  const TrainRun split = train(CommOverlap::kSplit, 3);
  const TrainRun off = train(CommOverlap::kOff, 3);
  expect_bitwise_equal(split, off);
  for (const char* track : {"compute", "comm", "compute2", "comm2"}) {
    bool found = false;
    for (const Span& s : split.timeline) found = found || s.stream == track;
    EXPECT_TRUE(found) << "no span on " << track;
  }
  EXPECT_LE(split.exposed, split.busy);
}

// Note [Rebalancing experts]: experts re-placed after every step, their weights and moments
// moved over NCCL, train bit for bit as experts that stay (the norm summed by expert in both,
// Note [Norm by expert]): every loss, norm, weight and moment by name.
TEST(GpuPipeline, RebalancedExpertsTrainBitwiseAsExpertsThatStay) {
  const TrainRun moving = train(CommOverlap::kOn, 4, false, 1);
  const TrainRun staying = train(CommOverlap::kOn, 4, false, 1000);
  EXPECT_GT(moving.rebalances, 0) << "no step re-placed an expert: the test shows nothing";
  EXPECT_EQ(staying.rebalances, 0);
  ASSERT_EQ(moving.losses.size(), staying.losses.size());
  for (size_t i = 0; i < moving.losses.size(); ++i) {
    EXPECT_EQ(moving.losses[i], staying.losses[i]) << "step " << i + 1;
    EXPECT_EQ(moving.norms[i], staying.norms[i]) << "step " << i + 1;
  }
  expect_same_state(moving, staying);
}

bool has_span_starting(const std::vector<Span>& spans, const std::string& stream,
                       const std::string& prefix) {
  for (const Span& s : spans) {
    if (s.stream == stream && s.name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Note [The update beside the first forward]: each step's update run inside the next step's
// first forward, beside its all-to-all (on the comm track) or before the halves of a pair on
// split streams, or with the first forwards paired: bit for bit the in-order run that updates
// at each step's end, the update on the compute track of the timeline.
TEST(GpuPipeline, DeferredUpdateIsBitwiseTheUpdateAtTheStepsEnd) {
  const TrainRun off = train(CommOverlap::kOff, 3);
  for (const auto& [overlap, paired] :
       {std::pair{CommOverlap::kOn, false}, std::pair{CommOverlap::kSplit, false},
        std::pair{CommOverlap::kOn, true}, std::pair{CommOverlap::kOff, false}}) {
    SCOPED_TRACE(std::string("overlap ") + (overlap == CommOverlap::kOff ? "off" : "on/split") +
                 (paired ? ", paired" : ""));
    const TrainRun deferred = train(overlap, 3, paired, 0, true);
    expect_bitwise_equal(deferred, off);
    EXPECT_TRUE(has_span_starting(deferred.timeline, "compute", "update 0 [0, "));
    if (overlap != CommOverlap::kOff) {
      EXPECT_TRUE(has_span(deferred.timeline, "comm", "F0 dispatch"));
      EXPECT_TRUE(has_span(deferred.timeline, "comm", "F0 combine"));
    }
    EXPECT_LE(deferred.exposed, deferred.busy);
  }
  // Two pipeline stages: the second updates at its receive
  // (Note [The update beside the first forward]); bitwise the pipeline that updates at each step's
  // end.
  const TrainRun pipeline = train(CommOverlap::kOn, 3, false, 0, false, 2);
  const TrainRun deferred = train(CommOverlap::kOn, 3, false, 0, true, 2);
  expect_bitwise_equal(deferred, pipeline);
  EXPECT_TRUE(has_span_starting(deferred.timeline, "compute", "update "));
}

const Span* find_span(const std::vector<Span>& spans, const std::string& stream,
                      const std::string& name) {
  for (const Span& s : spans) {
    if (s.stream == stream && s.name == name) return &s;
  }
  return nullptr;
}

// Note [Gradients reduced beside the backward]: with two expert ranks the dense weights are
// replicated on both, so their gradients are all-reduced; unit by unit on the reduce track,
// the head's starting before the backward ends, bit for bit the reduction at the step's end
// (two ranks: a + b), with the all-to-all in order, overlapped, on split streams, and with the
// deferred update.
TEST(GpuPipeline, GradientsReducedBesideTheBackwardAreBitwiseThoseAtTheEnd) {
  for (const auto& [overlap, deferred] :
       {std::pair{CommOverlap::kOff, false}, std::pair{CommOverlap::kOn, false},
        std::pair{CommOverlap::kSplit, false}, std::pair{CommOverlap::kOn, true}}) {
    SCOPED_TRACE(std::string("overlap ") +
                 (overlap == CommOverlap::kOff  ? "off"
                  : overlap == CommOverlap::kOn ? "on"
                                                : "split") +
                 (deferred ? ", deferred update" : ""));
    const TrainRun beside = train(overlap, 3, false, 0, deferred, 1, true);
    const TrainRun at_end = train(overlap, 3, false, 0, deferred, 1, false);
    expect_bitwise_equal(beside, at_end);
    for (const char* unit : {"reduce head", "reduce layer 1", "reduce layer 0", "reduce embed"}) {
      EXPECT_NE(find_span(beside.timeline, "reduce", unit), nullptr) << unit;
    }
    const Span* head = find_span(beside.timeline, "reduce", "reduce head");
    if (head != nullptr) {
      EXPECT_LT(head->start, beside.forward_backward) << "the head's reduction waited for the "
                                                         "whole backward";
    }
    EXPECT_FALSE(has_span_starting(at_end.timeline, "reduce", "reduce "));
  }
}

// Note [Distributed optimizer]: with two expert ranks the dense weights are replicated on both
// GPUs, so the distributed optimizer splits their Adam moments over the two: the same losses,
// master weights and (gathered) moments as the plain optimizer, bit for bit (two ranks: a + b),
// the norms within rounding (Note [Norm from the parts]); with the all-to-all in order and
// overlapped, the reduction beside the backward and after it, the weights gathered after the
// update and beside the next forward. Its optimizer bytes are the plan's.
TEST(GpuPipeline, DistributedOptimizerIsBitwiseThePlainOptimizer) {
  for (const CommOverlap overlap : {CommOverlap::kOff, CommOverlap::kOn}) {
    const TrainRun plain = train(overlap, 3);
    for (const auto& [beside, gather] : {std::pair{true, false}, std::pair{true, true},
                                         std::pair{false, false}, std::pair{false, true}}) {
      SCOPED_TRACE(std::string("overlap ") + (overlap == CommOverlap::kOff ? "off" : "on") +
                   (beside ? ", reduce beside" : ", reduce after") +
                   (gather ? ", gather beside" : ", gather after"));
      const TrainRun split = train(overlap, 3, false, 0, false, 1, beside, true, gather);
      ASSERT_EQ(split.losses.size(), plain.losses.size());
      for (size_t i = 0; i < plain.losses.size(); ++i) {
        EXPECT_EQ(split.losses[i], plain.losses[i]) << "step " << i + 1;
        EXPECT_NEAR(split.norms[i], plain.norms[i], 1e-6 * plain.norms[i]) << "step " << i + 1;
      }
      EXPECT_EQ(split.params, plain.params);
      expect_same_state(split, plain);
      EXPECT_EQ(has_span_starting(split.timeline, "compute", "gather 0 until "), gather);
      schedule::PlanRequest req;
      req.schedule_name = "combined-1f1b";
      req.shape = {1, 1, 4};
      req.inputs.model = small_moe();
      req.inputs.micro_batch_size = 2;
      req.inputs.expert_parallel_size = 2;
      req.inputs.gpu = true;
      req.inputs.activation_elem_bytes = 2;
      req.inputs.distributed_optimizer = true;
      req.inputs.cost.kind = schedule::CostModelKind::kUniform;
      EXPECT_EQ(split.optimizer_bytes, schedule::make_plan(req).model.ranks[0].optimizer_bytes);
      EXPECT_LT(split.optimizer_bytes, plain.optimizer_bytes);
    }
  }
}

TEST(GpuPipeline, TimelineComesFromCudaEvents) {
  const TrainRun on = train(CommOverlap::kOn, 2);
  const TrainRun off = train(CommOverlap::kOff, 2);
  // Overlapped: dispatch and combine run on the comm track; in order: never.
  EXPECT_GT(comm_track_all_to_all(on.timeline), 0);
  EXPECT_EQ(comm_track_all_to_all(off.timeline), 0);
  // The last backward (B3) has no partner and runs alone, its all-to-all still on the comm
  // track (Note [The unpaired backward's all-to-all]); the first forward's stays in order.
  for (const char* node : {"B3 dispatch", "B3 combine"}) {
    EXPECT_TRUE(has_span(on.timeline, "comm", node)) << node;
  }
  EXPECT_TRUE(has_span(on.timeline, "compute", "F0 dispatch"));
  // A paired forward's counts go ahead of its rows (Note [Counts ahead of the rows]).
  EXPECT_TRUE(has_span(on.timeline, "comm", "F1 dispatch counts"));
  EXPECT_FALSE(has_span(off.timeline, "comm", "F1 dispatch counts"));
  // The host's issuing of each node is on a track of its own.
  EXPECT_TRUE(has_span(on.timeline, "host", "F1 attention"));
  for (const TrainRun* r : {&on, &off}) {
    EXPECT_GT(r->busy, 0);
    EXPECT_GE(r->exposed, 0);
    EXPECT_LE(r->exposed, r->busy + 1e-6) << "exposed all-to-all above its busy time";
    // Note [Waiting for the slowest expert rank]: the two ranks' spans matched, and the wait
    // is part of the exposed time.
    EXPECT_GE(r->waiting, 0);
    EXPECT_LE(r->waiting, r->exposed + 1e-9);
    EXPECT_GT(r->forward_backward, 0);
    EXPECT_LE(r->forward_backward, r->step_seconds) << "the GPU's forward-backward is part of "
                                                       "the step's wall time";
    for (const Span& s : r->timeline) {
      EXPECT_LE(s.start, s.end) << s.name;
      EXPECT_GE(s.start, 0) << s.name;
    }
    for (NodeKind k : {NodeKind::kEmbed, NodeKind::kAttention, NodeKind::kDispatch,
                       NodeKind::kExperts, NodeKind::kCombine, NodeKind::kLoss}) {
      const auto& t = r->node_times.nodes[static_cast<int>(k)];
      ASSERT_TRUE(t.has_value()) << node_kind_name(k);
      EXPECT_GT(t->forward_s, 0) << node_kind_name(k);
    }
    EXPECT_FALSE(r->node_times.nodes[static_cast<int>(NodeKind::kMlp)].has_value());
  }
  // In order, every all-to-all holds up the compute stream: all of it is exposed.
  EXPECT_NEAR(off.exposed, off.busy, 1e-9);
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  using namespace tandem;
  ::testing::InitGoogleTest(&argc, argv);
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast stays off (shared hosts)
  comm::mpi_initialize(&argc, &argv);
  int failed = 1;
  try {
    auto world = comm::mpi_world(120.0);
    const int gpu = comm::local_rank();
    if (world->size() != 2 || cuda::device_count() <= gpu) {
      if (world->rank() == 0) {
        std::fprintf(stderr,
                     "test_gpu_pipeline needs 2 ranks with one GPU each: mpirun -np 2 "
                     "test_gpu_pipeline\n");
      }
      world.reset();
      comm::mpi_finalize();
      return 1;
    }
    cuda::initialize(gpu);
    runtime::g_world = world.get();
    if (world->rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    failed = RUN_ALL_TESTS();
    // Every rank's verdict: a failure on rank 1 fails the run too.
    Tensor f = Tensor::empty({1}, DType::kI32, MemCategory::kOther, "failed");
    f.data<int32_t>()[0] = failed;
    world->all_reduce_sum(f);
    failed = f.data<int32_t>()[0] > 0 ? 1 : 0;
    runtime::g_world = nullptr;
    world.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_gpu_pipeline: error: %s\n", e.what());
    comm::mpi_finalize();
    return 1;
  }
  comm::mpi_finalize();
  return failed;
}
