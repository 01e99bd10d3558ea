// Each model family on the GPU against transformers itself. Oracle: tests/fixtures/hf (written by
// transformers' save_pretrained, with its fp32 loss on one window of 128 tokens; see
// tests/model/test_hf_families.cc for the CPU's 1e-5 check). The GPU runs the training forward:
// bf16 activations and weights with fp32 accumulation, the fused LM head; tokens 0..126 predict
// 1..127, the positions transformers' shifted loss counts.
//
// Tolerance, 1e-2 relative: bf16 keeps 8 bits of mantissa, so every activation the forward
// stores is rounded to within 2^-9 (2e-3) relative, and the weights too; the fixtures' weights are
// drawn at unit gain (far from the 0.02 init), so those errors reach the logits at about that
// size through each layer rather than shrinking, and the loss, a mean over 127 tokens of a log of
// a sum of exponentials, moves by a fraction of one such step: 1e-3 to 1e-2 relative is what
// bf16 permits; a misread (a wrong RoPE base, a missing norm, a wrong routing weight) moves these
// fixtures' losses by more (4.7e-3 and more for the RoPE base alone, tens of percent for most).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "model/chunk.h"
#include "runtime/checkpoint.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// From the repository root when run there (the GPU machine's copy), else the source tree built.
const fs::path kFixtures = fs::exists("tests/fixtures/hf")
                               ? fs::path("tests/fixtures/hf")
                               : fs::path(TANDEM_SOURCE_DIR) / "tests/fixtures/hf";
constexpr double kTolerance = 1e-2;

std::vector<int32_t> first_row(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::vector<int32_t> row;
  for (int32_t id; words >> id;) row.push_back(id);
  return row;
}

double gpu_loss(const std::string& name) {
  const fs::path dir = kFixtures / name;
  const std::unique_ptr<model::Parameters> cpu = runtime::load_model_checkpoint(dir.string());
  const std::vector<int32_t> row = first_row(dir / "tokens.txt");
  const int64_t seq = static_cast<int64_t>(row.size()) - 1;
  ModelConfig cfg = cpu->config();
  cfg.seq_length = seq;
  DeviceScope on(Device::kCUDA);
  model::Parameters gpu(cfg, model::ChunkSpec::whole(cfg), DType::kF32, Device::kCUDA);
  gpu.copy_weights_from(*cpu);
  const model::ModelChunk chunk(gpu);
  model::MicroBatchState mb;
  Tensor ids = Tensor::empty({seq}, DType::kI32, MemCategory::kOther, "ids");
  Tensor targets = Tensor::empty({seq}, DType::kI32, MemCategory::kOther, "targets");
  std::copy(row.begin(), row.end() - 1, ids.data<int32_t>());
  std::copy(row.begin() + 1, row.end(), targets.data<int32_t>());
  mb.ids = ids.to(Device::kCUDA);
  mb.targets = targets.to(Device::kCUDA);
  chunk.forward(mb, chunk.context(1, 1.0));
  return mb.lm_loss();
}

class CudaHf : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHf, LossIsTransformersWithinBf16) {
  const std::string name = GetParam();
  std::ifstream in(kFixtures / name / "expected.json");
  const double want = nlohmann::json::parse(in).at("loss").get<double>();
  const double got = gpu_loss(name);
  const double rel = std::abs(got - want) / want;
  std::printf("%s: transformers fp32 %.7f, tandem GPU bf16 %.7f, relative %.2e\n", name.c_str(),
              want, got, rel);
  EXPECT_LE(rel, kTolerance) << name;
}

INSTANTIATE_TEST_SUITE_P(Families, CudaHf,
                         ::testing::Values("llama", "llama3_rope", "mixtral_top1", "mixtral_top2",
                                           "qwen3_moe", "qwen3_moe_nonorm", "qwen3_moe_dense",
                                           "qwen2_moe", "deepseek_v3", "deepseek_v3_noq",
                                           "deepseek_v3_yarn"));

}  // namespace
}  // namespace tandem
