// Multi-token prediction modules in checkpoints (Note [Multi-token prediction layers] in
// runtime/checkpoint.cc). Oracles: the weights written (saved then loaded bit for bit, through
// tandem's model checkpoint and through the Hugging Face layout), and transformers' DeepSeek-V3
// fixture (tests/fixtures/hf) given an MTP module under DeepSeek-V3's names, copies of the shared
// embedding and head included: --mtp-num-layers 1 loads exactly those tensors on every layout,
// 0 leaves them out, 2 (more than num_nextn_predict_layers) is refused, and a copy of the head
// that differs from lm_head is refused.
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

fs::path temp_dir(const std::string& name) {
  const fs::path out =
      fs::temp_directory_path() / ("tandem_mtp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(out);
  return out;
}

float value_of(int64_t i) { return 0.01f * static_cast<float>((i * 7919) % 200 - 100); }

// The DeepSeek-V3 fixture (3 layers, num_nextn_predict_layers 1) with MTP module 0 as
// layer 3: a copy of layer 2's transformer layer, enorm, hnorm, eh_proj and shared_head.norm of
// distinct values, and copies of the embedding and the LM head (the head's changed when
// `bad_head`).
fs::path deepseek_with_mtp(bool bad_head) {
  const fs::path out = temp_dir(bad_head ? "bad_head" : "v3");
  fs::create_directories(out);
  fs::copy_file(kFixtures / "deepseek_v3" / "config.json", out / "config.json");
  const auto stored = io::load_safetensors(
      (kFixtures / "deepseek_v3" / "model.safetensors").string(), MemCategory::kOther);
  NamedTensors tensors(stored.begin(), stored.end());
  int64_t h = 0;
  for (const auto& [n, t] : stored) {
    if (n == "model.norm.weight") h = t.size(0);
    if (n.rfind("model.layers.2.", 0) == 0) {
      tensors.emplace_back("model.layers.3." + n.substr(15), t);
    }
    if (n == "model.embed_tokens.weight")
      tensors.emplace_back("model.layers.3.embed_tokens.weight", t);
    if (n == "lm_head.weight") {
      Tensor head = t.to(Device::kCPU);
      if (bad_head) {
        head = Tensor::empty(t.shape(), DType::kF32, MemCategory::kOther, "head");
        head.copy_from(io::to_float(t, DType::kF32));
        head.data<float>()[0] += 1.0f;
      }
      tensors.emplace_back("model.layers.3.shared_head.head.weight", head);
    }
  }
  const auto filled = [](Shape shape, int64_t seed) {
    Tensor t = Tensor::empty(shape, DType::kF32, MemCategory::kOther, "mtp");
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value_of(i + seed);
    return t;
  };
  tensors.emplace_back("model.layers.3.enorm.weight", filled({h}, 1));
  tensors.emplace_back("model.layers.3.hnorm.weight", filled({h}, 2));
  tensors.emplace_back("model.layers.3.eh_proj.weight", filled({h, 2 * h}, 3));
  tensors.emplace_back("model.layers.3.shared_head.norm.weight", filled({h}, 4));
  io::save_safetensors((out / "model.safetensors").string(), tensors);
  return out;
}

const Tensor* named(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

TEST(CheckpointMtp, DeepSeekV3ModulesLoadWithMtpNumLayersOnEveryLayout) {
  const fs::path dir = deepseek_with_mtp(false);
  const CheckpointState st = load_checkpoint(dir.string(), 1);
  const auto stored =
      io::load_safetensors((dir / "model.safetensors").string(), MemCategory::kOther);
  const NamedTensors file(stored.begin(), stored.end());
  ModelConfig cfg = st.model_config;
  cfg.mtp_num_layers = 1;
  // The whole model and an expert half: each holds the module with the file's values.
  for (const bool half : {false, true}) {
    model::ChunkSpec spec = model::ChunkSpec::whole(cfg);
    if (half) spec.expert_end = cfg.num_experts / 2;
    model::Parameters params(cfg, spec, DType::kF32);
    restore_model(params, st);
    int64_t modules = 0;
    for (const model::ParamEntry& e : params.entries()) {
      if (e.name.rfind("model.layers.3.", 0) != 0) continue;
      ++modules;
      const Tensor* want = named(file, e.name);
      ASSERT_NE(want, nullptr) << e.name;
      const Tensor w = io::to_float(*want, DType::kF32);
      ASSERT_EQ(std::memcmp(params.param(e).data<float>(), w.data<float>(),
                            static_cast<size_t>(w.nbytes())),
                0)
          << e.name;
    }
    EXPECT_GT(modules, 10);
  }
  // --mtp-num-layers 0: the module is left out (the model of config.json alone loads).
  const CheckpointState none = load_checkpoint(dir.string(), 0);
  model::Parameters plain(none.model_config, model::ChunkSpec::whole(none.model_config),
                          DType::kF32);
  EXPECT_NO_THROW(restore_model(plain, none));
  // More modules than the checkpoint holds: refused, naming the option and the count.
  try {
    load_checkpoint(dir.string(), 2);
    ADD_FAILURE() << "two modules of one were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mtp-num-layers 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_nextn_predict_layers 1"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(CheckpointMtp, AHeadCopyThatDiffersFromTheModelsIsRefused) {
  const fs::path dir = deepseek_with_mtp(true);
  try {
    load_checkpoint(dir.string(), 1);
    ADD_FAILURE() << "a differing shared_head.head was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared_head.head.weight differs"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(load_checkpoint(dir.string(), 0));  // without the modules it is not read
  fs::remove_all(dir);
}

// tandem's own model checkpoint of an MTP model (a Mixtral-family one: config.json gets
// num_nextn_predict_layers too) loads bit for bit, as itself and as a Hugging Face checkpoint
// with --mtp-num-layers.
TEST(CheckpointMtp, SavedModulesRoundTrip) {
  ModelConfig cfg;
  cfg.vocab_size = 32;
  cfg.hidden_size = 16;
  cfg.num_layers = 2;
  cfg.num_attention_heads = 2;
  cfg.num_query_groups = 2;
  cfg.ffn_hidden_size = 24;
  cfg.num_experts = 4;
  cfg.seq_length = 8;
  cfg.mtp_num_layers = 2;
  model::Parameters params(cfg, model::ChunkSpec::whole(cfg), DType::kF32);
  params.initialize(3);
  const fs::path dir = temp_dir("roundtrip");
  save_model_checkpoint(dir.string(), params);
  const CheckpointState st = load_checkpoint(dir.string(), 2);
  EXPECT_NE(named(st.model, "model.layers.3.eh_proj.weight"), nullptr);
  model::Parameters back(cfg, model::ChunkSpec::whole(cfg), DType::kF32);
  restore_model(back, st);
  ASSERT_EQ(back.numel(), params.numel());
  EXPECT_EQ(std::memcmp(back.flat_params().data<float>(), params.flat_params().data<float>(),
                        static_cast<size_t>(params.flat_params().nbytes())),
            0);
  // Loaded as a model of its own (--mtp-num-layers left to the checkpoint): the modules are
  // dropped, the rest is the model.
  EXPECT_NO_THROW(load_model_checkpoint(dir.string()));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::runtime
