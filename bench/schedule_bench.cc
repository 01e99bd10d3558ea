// Planner speed: generate, validate and simulate an interleaved schedule of 64 stages and 512
// micro-batches (the target: a whole plan in under a second), and its parts.
#include <benchmark/benchmark.h>

#include "planner/planner.h"
#include "schedule/validator.h"

namespace tandem::schedule {
namespace {

// A MoE model with one layer per stage, EP 8, the default (roughly H200) roofline.
PlanRequest request(int32_t p, int32_t v, int32_t m) {
  PlanRequest req;
  req.schedule_name = "interleaved-1f1b";
  req.shape = {p, v, m};
  ModelConfig& c = req.inputs.model;
  c.hidden_size = 2048;
  c.num_attention_heads = 16;
  c.num_query_groups = 4;
  c.ffn_hidden_size = 1024;
  c.num_experts = 64;
  c.moe_router_topk = 8;
  c.vocab_size = 32000;
  c.seq_length = 4096;
  c.num_layers = p * v;
  req.inputs.micro_batch_size = 1;
  req.inputs.expert_parallel_size = 8;
  req.inputs.activation_elem_bytes = 2;
  return req;
}

void args(benchmark::internal::Benchmark* b) {
  b->Args({32, 2, 512})->Args({16, 4, 512})->Args({64, 2, 512})->Unit(benchmark::kMillisecond);
}

void BM_Plan(benchmark::State& state) {
  const PlanRequest req =
      request(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
              static_cast<int32_t>(state.range(2)));
  for (auto _ : state) benchmark::DoNotOptimize(make_plan(req));
  state.SetLabel("PP x VPP x micro-batches, generate + validate + simulate");
}
BENCHMARK(BM_Plan)->Apply(args);

void BM_Generate(benchmark::State& state) {
  const PlanRequest req =
      request(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
              static_cast<int32_t>(state.range(2)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(generate_schedule(ScheduleKind::kInterleaved1f1b, req.shape));
  }
}
BENCHMARK(BM_Generate)->Apply(args);

void BM_Validate(benchmark::State& state) {
  const PlanRequest req =
      request(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
              static_cast<int32_t>(state.range(2)));
  const Schedule s = generate_schedule(ScheduleKind::kInterleaved1f1b, req.shape);
  for (auto _ : state) validate_schedule(s);
  state.counters["actions"] = static_cast<double>(s.num_actions());
}
BENCHMARK(BM_Validate)->Apply(args);

void BM_Simulate(benchmark::State& state) {
  const PlanRequest req =
      request(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
              static_cast<int32_t>(state.range(2)));
  const Schedule s = generate_schedule(ScheduleKind::kInterleaved1f1b, req.shape);
  const PipelineModel model = build_pipeline_model(s, req.inputs);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(s, model));
}
BENCHMARK(BM_Simulate)->Apply(args);

}  // namespace
}  // namespace tandem::schedule

BENCHMARK_MAIN();
