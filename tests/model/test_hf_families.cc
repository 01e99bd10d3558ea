// Each model family against transformers itself. Oracle: tests/fixtures/hf, written by
// transformers (tools/hf_fixtures.py): small models saved by save_pretrained with weights drawn
// wide enough that a misread changes the loss, one window of tokens, and transformers' fp32 loss
// on it. tandem loads each (config.json as transformers 5.x wrote it, and config.v4.json, the
// same model in 4.x form), and its loss must equal transformers' within 1e-5 relative.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "runtime/checkpoint.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(TANDEM_SOURCE_DIR) / "tests/fixtures/hf";

std::vector<std::vector<int32_t>> read_rows(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::vector<int32_t>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<int32_t> row;
    for (int32_t id; words >> id;) row.push_back(id);
    if (!row.empty()) rows.push_back(row);
  }
  return rows;
}

// The mean next-token cross-entropy over every row and position, in double from tandem's f32
// logits: what transformers returns with labels = input ids.
double loss_of(const fs::path& dir, const std::vector<std::vector<int32_t>>& rows) {
  const std::unique_ptr<model::Parameters> params = runtime::load_model_checkpoint(dir.string());
  const model::ModelChunk chunk(*params);
  const int64_t batch = static_cast<int64_t>(rows.size());
  const int64_t seq = static_cast<int64_t>(rows[0].size());
  const int64_t vocab = params->config().vocab_size;
  Tensor ids = Tensor::empty({batch * seq}, DType::kI32, MemCategory::kOther, "ids");
  for (int64_t r = 0; r < batch; ++r) {
    std::copy(rows[r].begin(), rows[r].end(), ids.data<int32_t>() + r * seq);
  }
  const Tensor logits = chunk.infer_logits(ids, batch, seq);
  double sum = 0;
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t t = 0; t + 1 < seq; ++t) {
      const float* row = logits.data<float>() + (r * seq + t) * vocab;
      double top = row[0], z = 0;
      for (int64_t v = 1; v < vocab; ++v) top = std::max(top, static_cast<double>(row[v]));
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v]) - top);
      sum += top + std::log(z) - static_cast<double>(row[rows[r][t + 1]]);
    }
  }
  return sum / static_cast<double>(batch * (seq - 1));
}

// A copy of the fixture with config.v4.json as its config.json.
fs::path v4_copy(const fs::path& dir) {
  const fs::path out = fs::temp_directory_path() / ("tandem_hf_v4_" + dir.filename().string() +
                                                    "_" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  fs::copy_file(dir / "model.safetensors", out / "model.safetensors");
  fs::copy_file(dir / "config.v4.json", out / "config.json");
  return out;
}

void expect_transformers_loss(const std::string& name) {
  const fs::path dir = kFixtures / name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::ifstream in(dir / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const double want = expected.at("loss").get<double>();
  const auto rows = read_rows(dir / "tokens.txt");
  ASSERT_FALSE(rows.empty());
  const double got = loss_of(dir, rows);
  EXPECT_LE(std::abs(got - want) / want, 1e-5)
      << name << " (5.x config): tandem " << got << ", transformers " << want;
  const fs::path v4 = v4_copy(dir);
  const double got4 = loss_of(v4, rows);
  fs::remove_all(v4);
  std::printf("%s: transformers %.9g, tandem %.9g (%.2e relative), 4.x config %.9g\n", name.c_str(),
              want, got, std::abs(got - want) / want, got4);
  EXPECT_LE(std::abs(got4 - want) / want, 1e-5)
      << name << " (4.x config): tandem " << got4 << ", transformers " << want;
}

TEST(HfFamilies, LlamaWithTheBaseInsideRopeParameters) { expect_transformers_loss("llama"); }
TEST(HfFamilies, LlamaWithLlama3RopeScalingAndItsOwnHeadDim) {
  expect_transformers_loss("llama3_rope");
}
TEST(HfFamilies, MixtralTop1) { expect_transformers_loss("mixtral_top1"); }
TEST(HfFamilies, MixtralTop2) { expect_transformers_loss("mixtral_top2"); }

TEST(HfFamilies, Qwen3MoeWithNormTopkProb) { expect_transformers_loss("qwen3_moe"); }
TEST(HfFamilies, Qwen3MoeWithoutNormTopkProb) { expect_transformers_loss("qwen3_moe_nonorm"); }
TEST(HfFamilies, Qwen3MoeWithDenseLayers) { expect_transformers_loss("qwen3_moe_dense"); }
TEST(HfFamilies, Qwen2MoeWithSharedExpertAndQkvBias) { expect_transformers_loss("qwen2_moe"); }

TEST(HfFamilies, DeepseekV3WithQLatentGroupsAndSharedExperts) {
  expect_transformers_loss("deepseek_v3");
}
TEST(HfFamilies, DeepseekV3WithoutQLatent) { expect_transformers_loss("deepseek_v3_noq"); }
TEST(HfFamilies, DeepseekV3WithYarn) { expect_transformers_loss("deepseek_v3_yarn"); }

}  // namespace
}  // namespace tandem
