// One-GPU training throughput of tandem, printed as one 'RESULT {json}' line in the same form
// as the PyTorch peer (torch_peer.py) so that bench/gpu_suite.sh can set them side by side.
// Options take torch_peer.py's names. Random tokens (like the peer), fp32 master weights, bf16
// activations; the full step: forward, backward, clipping, AdamW.
//
//   build/bench/gpu_train_bench --num-layers 12 --hidden-size 768 ... --steps 10
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/options.h"
#include "common/reference_trainer.h"
#include "core/cuda/context.h"
#include "core/cuda/cuda_allocator.h"
#include "core/device.h"
#include "core/setting_tables.h"
#include "data/dataset.h"
#include "data/random.h"
#include "ops/cuda/gemm.h"

namespace {

using namespace tandem;

// Uniform random token ids, a pure function of (seed, sample, position).
class RandomTokens final : public data::Dataset {
 public:
  RandomTokens(uint64_t seed, int64_t vocab) : seed_(seed), vocab_(vocab) {}
  void sample(int64_t index, int32_t* out, int64_t length) const override {
    for (int64_t i = 0; i < length; ++i) {
      const uint64_t r =
          data::stream_key(seed_, static_cast<uint64_t>(index), static_cast<uint64_t>(i));
      out[i] = static_cast<int32_t>(r % static_cast<uint64_t>(vocab_));
    }
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return "random tokens"; }

 private:
  uint64_t seed_;
  int64_t vocab_;
};

// torch_peer.py's flops_per_token: 6 x matmul weights a token passes through + 12 L heads D T.
double flops_per_token(const ModelConfig& c) {
  const double h = double(c.hidden_size), l = double(c.num_layers), t = double(c.seq_length);
  const double d = double(c.head_dim()), heads = double(c.num_attention_heads);
  const double attn = 2 * h * heads * d + 2 * h * double(c.num_query_groups) * d;
  const double mlp = c.num_experts > 0
                         ? h * double(c.num_experts) +
                               double(c.moe_router_topk) * 3 * h * double(c.ffn_hidden_size)
                         : 3 * h * double(c.ffn_hidden_size);
  return 6 * (l * (attn + mlp) + double(c.vocab_size) * h) + 12 * l * heads * d * t;
}

}  // namespace

int main(int argc, char** argv) {
  ModelConfig m;
  TrainConfig t;
  int64_t num_microbatches = 4, steps = 10, warmup = 3;
  CLI::App app("tandem one-GPU training benchmark (torch_peer.py's options)");
  app.add_option("--num-layers", m.num_layers);
  app.add_option("--hidden-size", m.hidden_size);
  app.add_option("--num-attention-heads", m.num_attention_heads);
  app.add_option("--num-query-groups", m.num_query_groups);
  app.add_option("--ffn-hidden-size", m.ffn_hidden_size);
  app.add_option("--num-experts", m.num_experts);
  app.add_option("--moe-router-topk", m.moe_router_topk);
  app.add_option("--vocab-size", m.vocab_size);
  app.add_option("--seq-length", m.seq_length);
  app.add_option("--micro-batch-size", t.micro_batch_size);
  app.add_option("--num-microbatches", num_microbatches);
  app.add_option("--steps", steps);
  app.add_option("--warmup-steps", warmup);
  Tuning tuned;  // Note [Performance settings] in core/tuning.h
  cli::add_settings(app, tuning_settings(tuned));
  CLI11_PARSE(app, argc, argv);
  try {
    set_tuning(tuned);
    if (app.count("--num-query-groups") == 0) m.num_query_groups = m.num_attention_heads;
    t.global_batch_size = t.micro_batch_size * num_microbatches;
    t.train_iters = warmup + steps;
    t.lr_warmup_iters = 1;
    t.device = Device::kCUDA;
    cuda::initialize(0);
    const std::string gpu = cuda::device_description();
    std::fprintf(stderr, "gpu_train_bench: %s\n", gpu.c_str());
    // The chip's bf16 matrix rate, measured now (the MFU's denominator).
    const double peak_tflops = ops::cuda::measure_bf16_matmul_tflops(8192, 8192, 8192, 20);
    std::fprintf(stderr, "gpu_train_bench: bf16 matmul 8192^3: %.1f TFLOP/s\n", peak_tflops);

    RandomTokens data(t.seed, m.vocab_size);
    runtime::ReferenceTrainer trainer(m, t, data);
    Allocator& alloc = allocator_for(Device::kCUDA);
    double loss = 0;
    for (int64_t i = 0; i < warmup; ++i) {
      loss = trainer.step().loss;
      std::fprintf(stderr, "warm-up step %lld: loss %.4f\n", static_cast<long long>(i + 1), loss);
    }
    synchronize_device(Device::kCUDA);
    alloc.reset_peaks();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      const runtime::StepResult r = trainer.step();
      loss = r.loss;
      std::fprintf(stderr, "step %lld: loss %.4f, %.1f ms\n", static_cast<long long>(i + 1), loss,
                   r.seconds * 1e3);
    }
    synchronize_device(Device::kCUDA);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_step = double(t.global_batch_size * m.seq_length);
    const double tps = tokens_per_step * double(steps) / elapsed;
    const double fpt = flops_per_token(m);
    const MemoryStats mem = alloc.stats();
    const double gib = double(int64_t{1} << 30);
    nlohmann::json res = {
        {"impl", "tandem"},
        {"mode", "single"},
        {"world", 1},
        {"gpu", gpu},
        {"tokens_per_s", tps},
        {"step_ms", 1e3 * elapsed / double(steps)},
        {"flops_per_token", fpt},
        {"tflops_per_gpu", fpt * tps / 1e12},
        {"matmul_peak_tflops", peak_tflops},
        {"mfu", fpt * tps / 1e12 / peak_tflops},
        {"peak_mem_gib", {double(mem.total_peak) / gib}},
        {"peak_activation_gib", double(mem.peak_of(MemCategory::kActivation)) / gib},
        {"reserved_peak_gib", double(cuda::cuda_allocator().peak_reserved_bytes()) / gib},
        {"loss", loss},
        {"tokens_per_step", tokens_per_step}};
    std::printf("RESULT %s\n", res.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
    return 2;
  }
}
