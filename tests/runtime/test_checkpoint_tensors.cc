// The tensors a Hugging Face checkpoint holds beyond its config's model, on every layout.
// Oracles: transformers' fixtures (tests/fixtures/hf) with a layer added: a layer config.json
// does not describe is refused by every chunk a rank may hold (the whole model, a pipeline
// stage, an expert range), and DeepSeek-V3's multi-token prediction layer (num_nextn_predict_layers
// after num_hidden_layers) is skipped by every one, which then holds the fixture's own weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "runtime/checkpoint.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(TANDEM_SOURCE_DIR) / "tests/fixtures/hf";

// The chunks of a model that ranks hold: the whole, each of two pipeline stages, each half of
// the experts.
std::vector<model::ChunkSpec> chunk_layouts(const ModelConfig& cfg) {
  std::vector<model::ChunkSpec> out = {model::ChunkSpec::whole(cfg)};
  const int64_t half_layers = cfg.num_layers / 2;
  for (int stage = 0; stage < 2; ++stage) {
    model::ChunkSpec s = model::ChunkSpec::whole(cfg);
    s.layer_begin = stage == 0 ? 0 : half_layers;
    s.layer_end = stage == 0 ? half_layers : cfg.num_layers;
    s.has_embed = stage == 0;
    s.has_head = stage == 1;
    out.push_back(s);
  }
  for (int half = 0; half < 2; ++half) {
    model::ChunkSpec s = model::ChunkSpec::whole(cfg);
    s.expert_begin = half * cfg.num_experts / 2;
    s.expert_end = (half + 1) * cfg.num_experts / 2;
    out.push_back(s);
  }
  return out;
}

// A copy of fixture `name` whose weights hold a copy of layer `from` as layer `to`, and
// `extra_names` (one float each) besides.
fs::path with_extra_layer(const std::string& name, int64_t from, int64_t to,
                          const std::vector<std::string>& extra_names = {}) {
  const fs::path out =
      fs::temp_directory_path() /
      ("tandem_extra_" + name + "_" + std::to_string(to) + "_" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  fs::copy_file(kFixtures / name / "config.json", out / "config.json");
  const auto stored =
      io::load_safetensors((kFixtures / name / "model.safetensors").string(), MemCategory::kOther);
  NamedTensors tensors(stored.begin(), stored.end());
  const std::string prefix = "model.layers." + std::to_string(from) + ".";
  for (const auto& [n, t] : stored) {
    if (n.rfind(prefix, 0) != 0) continue;
    tensors.emplace_back("model.layers." + std::to_string(to) + "." + n.substr(prefix.size()), t);
  }
  for (const std::string& n : extra_names) {
    tensors.emplace_back(n, Tensor::zeros({1}, DType::kF32, MemCategory::kOther));
  }
  io::save_safetensors((out / "model.safetensors").string(), tensors);
  return out;
}

TEST(CheckpointTensors, ALayerTheConfigDoesNotDescribeIsRefusedOnEveryLayout) {
  const fs::path dir = with_extra_layer("mixtral_top2", 1, 2);
  const CheckpointState st = load_checkpoint(dir.string());
  for (const model::ChunkSpec& spec : chunk_layouts(st.model_config)) {
    SCOPED_TRACE(std::to_string(spec.layer_begin) + ".." + std::to_string(spec.layer_end) +
                 " experts " + std::to_string(spec.expert_begin) + ".." +
                 std::to_string(spec.expert_end));
    model::Parameters chunk(st.model_config, spec, DType::kF32);
    try {
      restore_model(chunk, st);
      ADD_FAILURE() << "the extra layer was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("not part of the model"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(CheckpointTensors, DeepSeekV3MultiTokenPredictionLayerIsSkippedOnEveryLayout) {
  // The fixture: 3 layers and num_nextn_predict_layers 1, so layer 3 is the MTP layer.
  const fs::path dir = with_extra_layer(
      "deepseek_v3", 2, 3, {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight"});
  const CheckpointState st = load_checkpoint(dir.string());
  const CheckpointState plain = load_checkpoint((kFixtures / "deepseek_v3").string());
  EXPECT_EQ(st.model.size(), plain.model.size());
  for (const model::ChunkSpec& spec : chunk_layouts(st.model_config)) {
    model::Parameters chunk(st.model_config, spec, DType::kF32),
        want(st.model_config, spec, DType::kF32);
    restore_model(chunk, st);
    restore_model(want, plain);
    ASSERT_EQ(std::memcmp(chunk.flat_params().data<float>(), want.flat_params().data<float>(),
                          static_cast<size_t>(want.flat_params().nbytes())),
              0);
  }
  fs::remove_all(dir);
  // A layer past the MTP layers is no MTP layer: refused.
  const fs::path past = with_extra_layer("deepseek_v3", 2, 4);
  const CheckpointState bad = load_checkpoint(past.string());
  model::Parameters stage(bad.model_config, chunk_layouts(bad.model_config)[1], DType::kF32);
  EXPECT_THROW(restore_model(stage, bad), Error);
  fs::remove_all(past);
}

}  // namespace
}  // namespace tandem::runtime
