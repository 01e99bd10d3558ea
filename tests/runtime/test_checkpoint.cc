// Checkpoints. Oracles: an uninterrupted run (a resumed run's losses, gradient norms and final
// weights must be bitwise equal to it); the tensors that were saved (a load or a load into any
// chunk layout gives them back bit for bit); the file system (layout, retention, leftovers); and
// the trainer's own state before a rejected restore (it must be bitwise unchanged).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/random_tokens.h"
#include "common/reference_trainer.h"
#include "core/rng.h"
#include "io/atomic_dir.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "runtime/checkpoint.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;

using testing::RandomTokens;

enum class Ffn { kDense, kMoe };

ModelConfig small_model(Ffn ffn) {
  ModelConfig m;
  m.vocab_size = 32;
  m.hidden_size = 16;
  m.num_layers = 2;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.ffn_hidden_size = 24;
  m.num_experts = ffn == Ffn::kMoe ? 4 : 0;
  m.seq_length = 8;
  return m;
}

TrainConfig small_train(int64_t iters) {
  TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = iters;
  t.lr = 1e-2;
  t.min_lr = 1e-3;
  t.lr_warmup_iters = 2;
  return t;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_ckpt_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

std::vector<float> weights_of(const ReferenceTrainer& t) {
  const Tensor& flat = t.params().flat_params();
  return std::vector<float>(flat.data<float>(), flat.data<float>() + flat.numel());
}

std::set<std::string> entries_of(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

SavedCheckpoint save_trainer(const std::string& root, const ReferenceTrainer& t, int64_t keep = 2) {
  return save_checkpoint(root, t.iteration(), trainer_checkpoint(t, {{"format", "random"}}), keep);
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << parts[0] << "'";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
    }
  }
}

void flip_bit(const std::string& file, int64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(offset);
  f.write(&c, 1);
}

// Train 2N steps; separately N steps, save, restore into a fresh trainer, N more steps: the last
// N losses and gradient norms and the final weights are bitwise equal.
void check_exact_resume(Ffn ffn, const std::string& root, bool untied = false) {
  RandomTokens data(32);
  const int64_t n = 3;
  const auto small_model = [&](Ffn f) {
    ModelConfig m = runtime::small_model(f);
    m.untie_embeddings_and_output_weights = untied;
    return m;
  };
  ReferenceTrainer full(small_model(ffn), small_train(2 * n), data);
  std::vector<StepResult> reference;
  for (int64_t i = 0; i < 2 * n; ++i) reference.push_back(full.step());

  ReferenceTrainer first(small_model(ffn), small_train(2 * n), data);
  for (int64_t i = 0; i < n; ++i) first.step();
  save_trainer(root, first);
  ReferenceTrainer resumed(small_model(ffn), small_train(2 * n), data);
  restore_trainer(resumed, load_checkpoint(root));
  EXPECT_EQ(resumed.iteration(), n);
  EXPECT_EQ(resumed.optimizer().steps(), n);
  for (int64_t i = n; i < 2 * n; ++i) {
    const StepResult r = resumed.step();
    EXPECT_EQ(r.loss, reference[static_cast<size_t>(i)].loss) << "step " << i + 1;
    EXPECT_EQ(r.grad_norm, reference[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
    EXPECT_EQ(r.lr, reference[static_cast<size_t>(i)].lr) << "step " << i + 1;
  }
  EXPECT_EQ(weights_of(resumed), weights_of(full));
}

TEST_F(CheckpointTest, ResumeIsBitwiseExactMoe) { check_exact_resume(Ffn::kMoe, path("moe")); }
TEST_F(CheckpointTest, ResumeIsBitwiseExactUntied) {
  check_exact_resume(Ffn::kMoe, path("untied"), true);
}
TEST_F(CheckpointTest, ResumeIsBitwiseExactDense) {
  check_exact_resume(Ffn::kDense, path("dense"));
}

TEST_F(CheckpointTest, LayoutOnDiskIsHuggingFacePlusState) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kMoe), small_train(4), data);
  t.step();
  const SavedCheckpoint saved = save_trainer(path("run"), t);
  EXPECT_EQ(saved.dir, path("run/iter_0000001"));
  EXPECT_EQ(io::read_file(path("run/latest")), "iter_0000001\n");
  EXPECT_EQ(entries_of(saved.dir),
            (std::set<std::string>{"model.safetensors", "config.json", "optimizer.safetensors",
                                   "trainer_state.json"}));
  const auto model = io::load_safetensors(saved.dir + "/model.safetensors", MemCategory::kOther);
  EXPECT_EQ(model.size(), t.params().entries().size());
  ASSERT_EQ(model.count("model.layers.1.block_sparse_moe.experts.3.w2.weight"), 1u);
  // Note [Tied embeddings]: the output layer is the table, kept once (as save_pretrained does).
  EXPECT_EQ(model.at("model.embed_tokens.weight").dtype(), DType::kF32);
  EXPECT_EQ(model.count("lm_head.weight"), 0u);
  EXPECT_TRUE(nlohmann::json::parse(io::read_file(saved.dir + "/config.json"))
                  .at("tie_word_embeddings")
                  .get<bool>());
  const auto opt = io::load_safetensors(saved.dir + "/optimizer.safetensors", MemCategory::kOther);
  EXPECT_EQ(opt.size(), 2 * model.size());
  EXPECT_EQ(opt.count("model.embed_tokens.weight.exp_avg_sq"), 1u);
  EXPECT_EQ(io::load_hf_config(saved.dir + "/config.json").num_experts, 4);
  const auto state = nlohmann::json::parse(io::read_file(saved.dir + "/trainer_state.json"));
  EXPECT_EQ(state["iteration"], 1);
  EXPECT_EQ(state["optimizer_steps"], 1);
  EXPECT_EQ(state["samples_consumed"], 4);
  EXPECT_EQ(state["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(state["data"]["format"], "random");
  EXPECT_EQ(state["model"]["untie_embeddings_and_output_weights"], false);
  EXPECT_EQ(state["files"]["model.safetensors"]["bytes"],
            fs::file_size(saved.dir + "/model.safetensors"));
}

// Note [Sharded weights]: above max_shard_bytes the weights go in shards of at most that many
// bytes (a larger tensor alone), named and indexed as transformers names them; every file is
// recorded, a corrupt shard is refused naming it, and a resumed run is the uninterrupted one.
TEST_F(CheckpointTest, ShardedWeightsAreTransformersShardsAndResumeBitwise) {
  RandomTokens data(32);
  const int64_t n = 2;
  ReferenceTrainer full(small_model(Ffn::kMoe), small_train(2 * n), data);
  std::vector<StepResult> reference;
  for (int64_t i = 0; i < 2 * n; ++i) reference.push_back(full.step());
  ReferenceTrainer first(small_model(Ffn::kMoe), small_train(2 * n), data);
  for (int64_t i = 0; i < n; ++i) first.step();
  const int64_t limit = 4096;  // bytes: the embedding (32 x 16 f32 = 2 KiB) and a few layers
  const SavedCheckpoint saved = save_checkpoint(
      path("run"), first.iteration(), trainer_checkpoint(first, {{"format", "random"}}), 2, limit);
  const auto index =
      nlohmann::json::parse(io::read_file(saved.dir + "/model.safetensors.index.json"));
  const auto& map = index["weight_map"];
  EXPECT_EQ(map.size(), first.params().entries().size());
  std::set<std::string> shards;
  for (const auto& [name, file] : map.items()) shards.insert(file.get<std::string>());
  ASSERT_GT(shards.size(), 2u);
  int64_t total = 0;
  int k = 0;
  for (const std::string& shard : shards) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05d-of-%05zu.safetensors", ++k, shards.size());
    EXPECT_EQ(shard, want);
    int64_t bytes = 0;
    size_t tensors = 0;
    for (const auto& [name, t] :
         io::load_safetensors(saved.dir + "/" + shard, MemCategory::kOther)) {
      EXPECT_EQ(map[name], shard) << name;
      bytes += t.numel() * 4;
      ++tensors;
    }
    EXPECT_TRUE(bytes <= limit || tensors == 1) << shard << " holds " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_FALSE(fs::exists(saved.dir + "/model.safetensors"));
  const auto state = nlohmann::json::parse(io::read_file(saved.dir + "/trainer_state.json"));
  for (const std::string& shard : shards) EXPECT_TRUE(state["files"].contains(shard)) << shard;
  EXPECT_TRUE(state["files"].contains("model.safetensors.index.json"));

  ReferenceTrainer resumed(small_model(Ffn::kMoe), small_train(2 * n), data);
  restore_trainer(resumed, load_checkpoint(path("run")));
  for (int64_t i = n; i < 2 * n; ++i) {
    EXPECT_EQ(resumed.step().loss, reference[static_cast<size_t>(i)].loss) << "step " << i + 1;
  }
  EXPECT_EQ(weights_of(resumed), weights_of(full));

  const std::string second = saved.dir + "/" + *std::next(shards.begin());
  flip_bit(second, static_cast<int64_t>(fs::file_size(second)) - 3);
  expect_error([&] { load_checkpoint(path("run")); }, {second, "CRC-32C"});
}

TEST_F(CheckpointTest, RetentionKeepsTheNewestAndThePointer) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kDense), small_train(10), data);
  for (int i = 0; i < 4; ++i) {
    t.step();
    save_trainer(path("run"), t);
  }
  EXPECT_EQ(entries_of(path("run")),
            (std::set<std::string>{"iter_0000003", "iter_0000004", "latest"}));
  t.step();
  const SavedCheckpoint saved = save_trainer(path("run"), t, 1);
  EXPECT_EQ(entries_of(path("run")), (std::set<std::string>{"iter_0000005", "latest"}));
  EXPECT_EQ(saved.removed.size(), 2u);
  EXPECT_TRUE(saved.warnings.empty());
  expect_error([&] { save_trainer(path("run"), t, -1); }, {"--keep-checkpoints -1"});
}

// --keep-checkpoints 0 (the command line's default, as Megatron-LM deletes none): every
// iteration directory stays.
TEST_F(CheckpointTest, RetentionZeroKeepsEveryCheckpoint) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kDense), small_train(10), data);
  for (int i = 0; i < 4; ++i) {
    t.step();
    EXPECT_TRUE(save_trainer(path("run"), t, 0).removed.empty());
  }
  EXPECT_EQ(entries_of(path("run")),
            (std::set<std::string>{"iter_0000001", "iter_0000002", "iter_0000003", "iter_0000004",
                                   "latest"}));
}

TEST_F(CheckpointTest, RetentionTreatsHigherIterationsOfAnEarlierRunAsOlder) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kDense), small_train(10), data);
  t.step();
  save_trainer(path("run"), t);
  fs::rename(path("run/iter_0000001"), path("run/iter_0000009"));  // an earlier, longer run
  ReferenceTrainer fresh(small_model(Ffn::kDense), small_train(10), data);
  fresh.step();
  save_trainer(path("run"), fresh);
  EXPECT_EQ(entries_of(path("run")),
            (std::set<std::string>{"iter_0000001", "iter_0000009", "latest"}));
  fresh.step();
  save_trainer(path("run"), fresh);
  EXPECT_EQ(entries_of(path("run")),
            (std::set<std::string>{"iter_0000001", "iter_0000002", "latest"}));
}

TEST_F(CheckpointTest, LeftoversOfAnInterruptedSaveAreCleanedOrRecovered) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kDense), small_train(10), data);
  t.step();
  save_trainer(path("run"), t);
  // A crash between moving iter_0000001 aside and moving its replacement in, plus debris.
  fs::rename(path("run/iter_0000001"), path("run/iter_0000001.old-abc123"));
  fs::create_directories(path("run/iter_0000001.tmp-def456"));
  fs::create_directories(path("run/iter_0000000.deleted-xyz789"));
  std::ofstream(path("run/latest.tmp-qwerty")) << "junk";
  std::ofstream(path("run/notes.txt")) << "the user's file stays";
  const CheckpointState st = load_checkpoint(path("run"));  // restores iter_0000001
  EXPECT_EQ(st.dir, path("run/iter_0000001"));
  t.step();
  save_trainer(path("run"), t);
  EXPECT_EQ(entries_of(path("run")),
            (std::set<std::string>{"iter_0000001", "iter_0000002", "latest", "notes.txt"}));
}

TEST_F(CheckpointTest, CorruptCheckpointsAreRejectedNamingFileAndProblem) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kMoe), small_train(10), data);
  t.step();
  save_trainer(path("good"), t);
  struct Case {
    std::string name;
    std::function<void(const std::string& root)> damage;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"truncated weights",
       [](const std::string& r) {
         fs::resize_file(r + "/iter_0000001/model.safetensors",
                         fs::file_size(r + "/iter_0000001/model.safetensors") - 1);
       },
       {"model.safetensors", "truncated"}},
      {"bit flip in tensor data",
       [](const std::string& r) { flip_bit(r + "/iter_0000001/optimizer.safetensors", 5000); },
       {"optimizer.safetensors", "CRC-32C", "corrupt"}},
      {"config edited",
       [](const std::string& r) {
         std::ofstream(r + "/iter_0000001/config.json", std::ios::app) << " ";
       },
       {"config.json", "bytes"}},
      {"missing optimizer",
       [](const std::string& r) { fs::remove(r + "/iter_0000001/optimizer.safetensors"); },
       {"optimizer.safetensors", "missing"}},
      {"garbage state",
       [](const std::string& r) {
         std::ofstream(r + "/iter_0000001/trainer_state.json") << "{\"iteration\": ";
       },
       {"trainer_state.json", "not a JSON object"}},
      {"newer format",
       [](const std::string& r) {
         auto j = nlohmann::json::parse(io::read_file(r + "/iter_0000001/trainer_state.json"));
         j["format_version"] = 99;
         std::ofstream(r + "/iter_0000001/trainer_state.json") << j.dump();
       },
       {"format_version is 99", "newer"}},
      {"garbage pointer",
       [](const std::string& r) { std::ofstream(r + "/latest") << "../../etc"; },
       {"latest", "../../etc"}},
      {"pointer to nothing",
       [](const std::string& r) { std::ofstream(r + "/latest") << "iter_0000007\n"; },
       {"iter_0000007", "does not exist"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string root = path("bad");
    fs::remove_all(root);
    fs::create_directories(root);
    fs::copy(path("good"), root, fs::copy_options::recursive);
    c.damage(root);
    expect_error([&] { load_checkpoint(root); }, c.message);
  }
  expect_error([&] { load_checkpoint(path("nowhere")); }, {"nowhere", "no such directory"});
  expect_error([&] { load_checkpoint(dir_); }, {"not a checkpoint"});
}

TEST_F(CheckpointTest, RejectedRestoreLeavesTheTrainerUnchanged) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kMoe), small_train(10), data);
  t.step();
  save_trainer(path("run"), t);
  const CheckpointState st = load_checkpoint(path("run"));

  ModelConfig other_model = small_model(Ffn::kMoe);
  other_model.num_layers = 3;
  ReferenceTrainer wrong_shape(other_model, small_train(10), data);
  TrainConfig other_train = small_train(10);
  other_train.seed = 99;
  ReferenceTrainer wrong_seed(small_model(Ffn::kMoe), other_train, data);
  other_train = small_train(10);
  other_train.global_batch_size = 8;
  ReferenceTrainer wrong_batch(small_model(Ffn::kMoe), other_train, data);
  const struct {
    ReferenceTrainer* trainer;
    std::vector<std::string> message;
  } cases[] = {{&wrong_shape, {"num_layers is 2 in the checkpoint but 3", "--num-layers"}},
               {&wrong_seed, {"seed is 1234 in the checkpoint but 99", "--seed"}},
               {&wrong_batch, {"global_batch_size is 4", "--global-batch-size"}}};
  for (const auto& c : cases) {
    const std::vector<float> before = weights_of(*c.trainer);
    expect_error([&] { restore_trainer(*c.trainer, st); }, c.message);
    EXPECT_EQ(weights_of(*c.trainer), before);
    EXPECT_EQ(c.trainer->iteration(), 0);
    EXPECT_EQ(c.trainer->optimizer().steps(), 0);
  }
  // A tensor of the wrong shape that slipped past the file checks is caught before any copy.
  CheckpointState bad = st;
  for (auto& [name, tensor] : bad.model) {
    if (name == "model.norm.weight")
      tensor = Tensor::zeros({2, 2}, DType::kF32, MemCategory::kOther);
  }
  ReferenceTrainer target(small_model(Ffn::kMoe), small_train(10), data);
  const std::vector<float> before = weights_of(target);
  expect_error([&] { restore_trainer(target, bad); }, {"model.norm.weight", "shape"});
  EXPECT_EQ(weights_of(target), before);
}

// Saved from the whole model, loaded into pipeline stages and expert ranges, gathered back from
// those chunks and saved again: every tensor is bitwise the original.
TEST_F(CheckpointTest, AnyChunkLayoutLoadsAndGathersTheSameTensors) {
  RandomTokens data(32);
  const ModelConfig cfg = small_model(Ffn::kMoe);
  ReferenceTrainer t(cfg, small_train(10), data);
  t.step();
  save_trainer(path("run"), t);
  const CheckpointState st = load_checkpoint(path("run"));
  std::map<std::string, std::vector<float>> original;
  for (const auto& [name, tensor] : st.model) {
    original[name] =
        std::vector<float>(tensor.data<float>(), tensor.data<float>() + tensor.numel());
  }
  CheckpointState gathered = st;
  gathered.model.clear();
  std::set<std::string> names;
  for (int stage = 0; stage < 2; ++stage) {
    for (int experts = 0; experts < 2; ++experts) {
      model::ChunkSpec spec;
      spec.layer_begin = stage;
      spec.layer_end = stage + 1;
      spec.has_embed = stage == 0;
      spec.has_head = stage == 1;
      spec.expert_begin = 2 * experts;
      spec.expert_end = 2 * experts + 2;
      model::Parameters chunk(cfg, spec, DType::kF32);
      restore_model(chunk, st);
      for (const auto& [name, tensor] : model_tensors(chunk)) {
        const std::vector<float>& want = original.at(name);
        ASSERT_EQ(std::memcmp(tensor.data<float>(), want.data(), want.size() * 4), 0) << name;
        if (names.insert(name).second) gathered.model.emplace_back(name, tensor);
      }
    }
  }
  EXPECT_EQ(names.size(), original.size());
  save_checkpoint(path("regathered"), 1, gathered, 2);
  EXPECT_EQ(io::read_file(path("regathered/iter_0000001/model.safetensors")).size(),
            io::read_file(path("run/iter_0000001/model.safetensors")).size());
  for (const auto& [name, tensor] : load_checkpoint(path("regathered")).model) {
    ASSERT_EQ(std::memcmp(tensor.data<float>(), original.at(name).data(), tensor.nbytes()), 0)
        << name;
  }
}

// A plain HF directory (BF16 weights, config.json only), in one file and sharded with an index.
TEST_F(CheckpointTest, HuggingFaceBf16CheckpointLoadsWeightsOnly) {
  RandomTokens data(32);
  const ModelConfig cfg = small_model(Ffn::kMoe);
  ReferenceTrainer source(cfg, small_train(10), data);
  source.step();
  NamedTensors bf16;
  for (const auto& [name, tensor] : model_tensors(source.params())) {
    bf16.emplace_back(name, io::to_bf16(tensor));
  }
  fs::create_directories(path("hf"));
  io::save_safetensors(path("hf/model.safetensors"), bf16);
  io::save_hf_config(path("hf/config.json"), cfg);
  fs::create_directories(path("sharded"));
  const size_t half = bf16.size() / 2;
  io::save_safetensors(path("sharded/a.safetensors"),
                       NamedTensors(bf16.begin(), bf16.begin() + half));
  io::save_safetensors(path("sharded/b.safetensors"),
                       NamedTensors(bf16.begin() + half, bf16.end()));
  nlohmann::json index;
  for (size_t i = 0; i < bf16.size(); ++i) {
    index["weight_map"][bf16[i].first] = i < half ? "a.safetensors" : "b.safetensors";
  }
  std::ofstream(path("sharded/model.safetensors.index.json")) << index.dump();
  io::save_hf_config(path("sharded/config.json"), cfg);

  for (const char* dir : {"hf", "sharded"}) {
    SCOPED_TRACE(dir);
    const CheckpointState st = load_checkpoint(path(dir));
    EXPECT_EQ(st.kind, CheckpointKind::kHuggingFace);
    EXPECT_TRUE(st.optimizer.empty());
    ReferenceTrainer target(cfg, small_train(10), data);
    target.step();  // some optimizer state that the load must reset
    restore_trainer(target, st);
    EXPECT_EQ(target.iteration(), 0);
    EXPECT_EQ(target.optimizer().steps(), 0);
    for (const auto& [name, tensor] : bf16) {
      const Tensor want = io::to_float(tensor, DType::kF32);
      for (const model::ParamEntry& e : target.params().entries()) {
        if (e.name != name) continue;
        ASSERT_EQ(
            std::memcmp(target.params().param(e).data<float>(), want.data<float>(), want.nbytes()),
            0)
            << name;
      }
    }
  }
  // A shard holding a tensor the index maps elsewhere is rejected.
  index["weight_map"][bf16[0].first] = "b.safetensors";
  std::ofstream(path("sharded/model.safetensors.index.json")) << index.dump();
  expect_error([&] { load_checkpoint(path("sharded")); }, {"a.safetensors"});
}

// Note [Tied embeddings]: a Hugging Face directory of a tied model (tie_word_embeddings true)
// loads with lm_head.weight absent or equal to the table, and is refused with one that differs;
// an untied export keeps lm_head.weight and says tie_word_embeddings false.
TEST_F(CheckpointTest, HuggingFaceTiedHeadIsAbsentOrTheTable) {
  RandomTokens data(32);
  const ModelConfig cfg = small_model(Ffn::kDense);
  ReferenceTrainer source(cfg, small_train(10), data);
  source.step();
  save_model_checkpoint(path("export"), source.params());
  const std::unique_ptr<model::Parameters> back = load_model_checkpoint(path("export"));
  EXPECT_TRUE(back->config().tied_embeddings());
  EXPECT_EQ(model_tensors(*back).size(), model_tensors(source.params()).size());
  const Tensor& a = back->flat_params();
  const Tensor& b = source.params().flat_params();
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()), 0);

  NamedTensors tensors = model_tensors(source.params());
  Tensor head;
  for (const auto& [name, t] : tensors) {
    if (name == "model.embed_tokens.weight") head = t.to(Device::kCPU);
  }
  tensors.emplace_back("lm_head.weight", head);
  fs::create_directories(path("with_head"));
  io::save_safetensors(path("with_head/model.safetensors"), tensors);
  io::save_hf_config(path("with_head/config.json"), cfg);
  ReferenceTrainer target(cfg, small_train(10), data);
  restore_trainer(target, load_checkpoint(path("with_head")));
  EXPECT_EQ(std::memcmp(target.params().flat_params().data<float>(), b.data<float>(), b.nbytes()),
            0);
  Tensor other = Tensor::empty(head.shape(), DType::kF32, MemCategory::kOther, "other");
  other.copy_from(head);
  other.data<float>()[3] += 1.0f;
  tensors.back().second = other;
  io::save_safetensors(path("with_head/model.safetensors"), tensors);
  expect_error([&] { load_checkpoint(path("with_head")); },
               {"lm_head.weight differs from model.embed_tokens.weight", "tie_word_embeddings"});

  ModelConfig untied = cfg;
  untied.untie_embeddings_and_output_weights = true;
  ReferenceTrainer separate(untied, small_train(10), data);
  save_model_checkpoint(path("untied"), separate.params());
  EXPECT_FALSE(nlohmann::json::parse(io::read_file(path("untied/config.json")))
                   .at("tie_word_embeddings")
                   .get<bool>());
  EXPECT_EQ(load_checkpoint(path("untied")).model.size(), separate.params().entries().size());
  EXPECT_FALSE(load_model_checkpoint(path("untied"))->config().tied_embeddings());
}

// Note [Non-finite steps], both policies, with a NaN injected into one gradient element.
TEST_F(CheckpointTest, NonFiniteGradientStopsOrIsSkipped) {
  RandomTokens data(32);
  const auto poison_at = [](int64_t at) {
    return [at](model::Parameters& p, int64_t iteration) {
      if (iteration == at) p.flat_grads().data<float>()[7] = std::nanf("");
    };
  };
  ReferenceTrainer stop(small_model(Ffn::kMoe), small_train(10), data);
  stop.set_after_backward_hook(poison_at(2));
  stop.step();
  const std::vector<float> before = weights_of(stop);
  expect_error([&] { stop.step(); }, {"iteration 2", "the gradients are not finite"});
  EXPECT_EQ(weights_of(stop), before);
  EXPECT_EQ(stop.iteration(), 1);
  EXPECT_EQ(stop.optimizer().steps(), 1);

  TrainConfig skip_config = small_train(10);
  skip_config.non_finite_policy = NonFinitePolicy::kSkip;
  ReferenceTrainer skip(small_model(Ffn::kMoe), skip_config, data);
  skip.set_after_backward_hook(poison_at(2));
  EXPECT_EQ(skip.step().status, StepStatus::kApplied);
  const std::vector<float> kept = weights_of(skip);
  const StepResult skipped = skip.step();
  EXPECT_EQ(skipped.status, StepStatus::kSkipped);
  EXPECT_EQ(skipped.iteration, 2);
  EXPECT_EQ(weights_of(skip), kept);
  EXPECT_EQ(skip.optimizer().steps(), 1);
  const StepResult next = skip.step();
  EXPECT_EQ(next.status, StepStatus::kApplied);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_EQ(skip.optimizer().steps(), 2);
  // The skipped step is part of the position a checkpoint records.
  save_trainer(path("run"), skip);
  const TrainingPosition pos =
      read_training_position(load_checkpoint(path("run")).trainer_state, "test: ");
  EXPECT_EQ(pos.iteration, 3);
  EXPECT_EQ(pos.optimizer_steps, 2);
}

TEST_F(CheckpointTest, NonFiniteLossIsNamed) {
  RandomTokens data(32);
  ReferenceTrainer t(small_model(Ffn::kDense), small_train(10), data);
  // A NaN weight makes the next step's loss (and gradients) NaN.
  t.set_after_backward_hook([](model::Parameters& p, int64_t iteration) {
    if (iteration != 1) return;
    for (const model::ParamEntry& e : p.entries()) {
      if (e.name == "model.norm.weight") p.param(e).data<float>()[0] = std::nanf("");
    }
  });
  t.step();
  expect_error([&] { t.step(); }, {"iteration 2", "the loss"});
}

}  // namespace
}  // namespace tandem::runtime
