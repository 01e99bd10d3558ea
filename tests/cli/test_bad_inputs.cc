// A table of bad inputs to `tandem train` (and `tandem eval`): options, config files, data
// files, validation and TensorBoard options, and checkpoints.
// Oracle, for every case: exit code 2 (main's code for bad input), stderr holding the expected
// words (the bad value, the file, what is wrong), and the working directory, which holds the
// case's input files, exactly as before: no file created, changed or removed (names, sizes,
// modification times and contents compared), checkpoints included.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "bad_input.h"
#include "io/safetensors.h"
#include "tandem_process.h"

namespace tandem::test {
namespace {

// A small DeepSeek-V3 model: multi-head latent attention and the sigmoid router.
std::vector<std::string> small_v3(std::vector<std::string> more) {
  std::vector<std::string> args = {"--num-layers",
                                   "1",
                                   "--hidden-size",
                                   "32",
                                   "--num-attention-heads",
                                   "4",
                                   "--num-query-groups",
                                   "4",
                                   "--ffn-hidden-size",
                                   "32",
                                   "--num-experts",
                                   "4",
                                   "--seq-length",
                                   "16",
                                   "--micro-batch-size",
                                   "2",
                                   "--global-batch-size",
                                   "4",
                                   "--multi-latent-attention",
                                   "--qk-layernorm",
                                   "--kv-lora-rank",
                                   "8",
                                   "--qk-head-dim",
                                   "4",
                                   "--qk-pos-emb-head-dim",
                                   "4",
                                   "--v-head-dim",
                                   "4",
                                   "--rotary-interleaved",
                                   "--moe-router-score-function",
                                   "sigmoid"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// An llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens.
std::string llmc(int32_t magic, int32_t version, int32_t count, const std::vector<int>& tokens) {
  std::string out;
  put_le(out, static_cast<uint32_t>(magic), 4);
  put_le(out, static_cast<uint32_t>(version), 4);
  put_le(out, static_cast<uint32_t>(count), 4);
  out.resize(1024, '\0');
  for (int t : tokens) put_le(out, static_cast<uint32_t>(t), 2);
  return out;
}

// A Megatron index header: magic, version, dtype code, sequence and document counts.
std::string megatron_idx(const std::string& magic, uint64_t seqs, uint64_t docs) {
  std::string out = magic;
  put_le(out, 1, 8);
  out.push_back(8);  // uint16 tokens
  put_le(out, seqs, 8);
  put_le(out, docs, 8);
  return out;
}

void flip_byte(const fs::path& file, int64_t offset) {
  std::string bytes = slurp(file);
  bytes[static_cast<size_t>(offset)] = static_cast<char>(bytes[static_cast<size_t>(offset)] ^ 0x40);
  write_text(file, bytes);
}

std::string replace_in(const fs::path& file, const std::string& from, const std::string& to) {
  std::string text = slurp(file);
  const size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
  write_text(file, text);
  return text;
}

class BadInputs : public ::testing::Test {
 protected:
  // One valid tandem checkpoint (ck/, a --save directory) and one plain HF directory (hf/),
  // made once by the real program; cases copy and damage them.
  static void SetUpTestSuite() {
    fixtures_ = new TempDir("tandem_bad_fixtures");
    TempDir capture;
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), kSmall.begin(), kSmall.end());
    for (const char* a : {"--train-iters", "1", "--save", "ck", "--quiet"}) args.push_back(a);
    const RunResult r = run_tandem(args, fixtures_->path(), capture.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    fs::create_directories(*fixtures_ / "hf");
    fs::copy_file(*fixtures_ / "ck/iter_0000001/model.safetensors",
                  *fixtures_ / "hf/model.safetensors");
    fs::copy_file(*fixtures_ / "ck/iter_0000001/config.json", *fixtures_ / "hf/config.json");
  }
  static void TearDownTestSuite() { delete fixtures_; }

  static void copy_fixture(const fs::path& work, const std::string& name) {
    fs::copy(*fixtures_ / name, work / name, fs::copy_options::recursive);
  }
  static inline TempDir* fixtures_ = nullptr;
};

std::vector<BadInput> option_cases() {
  return {
      {"non-number", {"--num-layers", "abc"}, {"abc"}},
      {"unknown option", {"--no-such-option", "1"}, {"--no-such-option"}},
      {"nan policy", {"--nan-policy", "sometimes"}, {"sometimes"}},
      {"keep fewer than none",
       small({"--keep-checkpoints", "-1", "--save", "out"}),
       {"--keep-checkpoints", "-1", ">= 0"}},
      {"negative interval", {"--save-interval", "-2"}, {"-2"}},
      {"WSD without its annealing length",
       small({"--lr-decay-style", "WSD"}),
       {"--lr-decay-style WSD", "--lr-wsd-decay-iters"}},
      {"a decay style Megatron lacks", small({"--lr-decay-style", "step"}), {"step", "WSD"}},
      {"a warm-up as long as the decay",
       small({"--train-iters", "5", "--lr-warmup-iters", "5"}),
       {"warm-up (5 iterations)", "shorter than the decay (5 iterations)"}},
      {"samples and iterations mixed",
       small({"--lr-warmup-samples", "8"}),
       {"--lr-warmup-samples", "--train-samples"}},
      {"two run lengths",
       small({"--train-samples", "64", "--train-iters", "3"}),
       {"--train-samples 64 and --train-iters 3"}},
      {"two warm-ups",
       small({"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"}),
       {"--lr-warmup-fraction 0.1 and --lr-warmup-iters 2"}},
      {"throughput in FLOP/s", small({"--log-throughput"}), {"--log-throughput", "tok/s"}},
      {"a profile with nowhere to go", small({"--profile"}), {"--profile", "--trace FILE"}},
      {"profile ranks not a list",
       small({"--profile", "--trace", "t.json", "--profile-ranks", "0 1"}),
       {"--profile-ranks 0 1", "comma-separated"}},
      {"no NaN check and a NaN policy",
       small({"--no-check-for-nan-in-loss-and-grad", "--nan-policy", "stop"}),
       {"--no-check-for-nan-in-loss-and-grad", "--nan-policy stop"}},
      {"two timeouts",
       small({"--distributed-timeout-minutes", "1", "--comm-timeout", "30"}),
       {"--distributed-timeout-minutes 1", "--comm-timeout 30"}},
      {"a size past 32-bit indices",
       {"--seq-length", "4611686018427387904"},
       {"--seq-length 4611686018427387904", "too large"}},
      {"more parameters than can be",
       {"--hidden-size", "2000000000"},
       {"parameters", "--hidden-size 2000000000", "2^47"}},
      {"a learning rate beyond f32", {"--lr", "1e39"}, {"--lr 1e+39", "32-bit float"}},
      {"stage layer counts that do not split",
       small({"--decoder-first-pipeline-num-layers", "2"}),
       {"--decoder-first-pipeline-num-layers 2", "one stage"}},
      {"offload of no node kind",
       small({"--offload-activations", "attention,ffn"}),
       {"--offload-activations attention,ffn", "'ffn'", "attention, experts, shared-expert"}},
      {"offload of a node the model lacks",
       small({"--offload-activations", "mlp"}),
       {"--offload-activations mlp", "no mlp node"}},
      {"a merge of no micro-batch",
       small({"--moe-wgrad-merge", "0"}),
       {"--moe-wgrad-merge 0", ">= 1"}},
      {"a merge without experts",
       {"--num-layers",       "1", "--hidden-size",       "32", "--num-attention-heads", "4",
        "--num-query-groups", "2", "--ffn-hidden-size",   "32", "--seq-length",          "16",
        "--micro-batch-size", "2", "--global-batch-size", "4",  "--num-experts",         "0",
        "--moe-wgrad-merge",  "2"},
       {"--moe-wgrad-merge 2", "no experts", "leave it at 1"}},
      // Tensor parallelism: the sizes it splits are checked first, naming them; then what is
      // not built yet is refused by name.
      {"tensor parallelism over more ranks than query groups",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "4"}),
       {"--tensor-model-parallel-size 4 does not divide --num-query-groups 2"}},
      {"tensor parallelism not dividing the heads",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "3"}),
       {"--tensor-model-parallel-size 3 does not divide --num-attention-heads 4"}},
      {"tensor parallelism not dividing the FFN",
       small(
           {"--num-experts", "0", "--tensor-model-parallel-size", "2", "--ffn-hidden-size", "33"}),
       {"--tensor-model-parallel-size 2 does not divide --ffn-hidden-size 33"}},
      {"tensor parallelism not dividing the vocabulary",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--vocab-size", "257"}),
       {"--tensor-model-parallel-size 2 does not divide the vocabulary", "257"}},
      {"sequence parallelism not dividing the sequence",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--sequence-parallel",
              "--seq-length", "15"}),
       {"--tensor-model-parallel-size 2 does not divide --seq-length (with "
        "--sequence-parallel) 15"}},
      {"sequence parallelism",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--sequence-parallel"}),
       {"--tensor-model-parallel-size 2 with --sequence-parallel is not built yet",
        "--tensor-model-parallel-size 1"}},
      {"tensor parallelism with a pipeline",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2",
              "--pipeline-model-parallel-size", "2"}),
       {"--tensor-model-parallel-size 2 with --pipeline-model-parallel-size 2 is not built yet"}},
      {"tensor parallelism on the GPU",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--device", "cuda"}),
       {"--tensor-model-parallel-size 2 with --device cuda is not built yet"}},
      {"tensor parallelism with the distributed optimizer",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2",
              "--use-distributed-optimizer"}),
       {"--tensor-model-parallel-size 2 with --use-distributed-optimizer is not built yet"}},
      {"tensor parallelism with MTP modules",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--mtp-num-layers", "1"}),
       {"--tensor-model-parallel-size 2 with --mtp-num-layers 1 is not built yet"}},
      {"tensor parallelism with offloaded activations",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--offload-activations",
              "attention"}),
       {"--tensor-model-parallel-size 2 with --offload-activations is not built yet"}},
      {"tensor parallelism saving a checkpoint",
       small({"--num-experts", "0", "--tensor-model-parallel-size", "2", "--save", "out"}),
       {"--tensor-model-parallel-size 2 with --save out is not built yet"}},
      // --load with a checkpoint: tests/cli/test_checkpoint_options.cc; --qk-layernorm and
      // --add-qkv-bias, which no dense family has: tests/cli/test_megatron_options.cc.

      {"tensor parallelism of a MoE model",
       small({"--tensor-model-parallel-size", "2"}),
       {"--tensor-model-parallel-size 2 with --num-experts 2 is not built yet"}},
      {"tensor parallelism of multi-latent attention",
       small_v3({"--tensor-model-parallel-size", "2"}),
       {"--tensor-model-parallel-size 2 with --multi-latent-attention is not built yet"}},
      {"a merge across split streams",
       small({"--moe-wgrad-merge", "2", "--comm-overlap", "split", "--device", "cuda",
              "--expert-model-parallel-size", "2", "--schedule", "combined-1f1b"}),
       {"--moe-wgrad-merge 2 with --comm-overlap split", "--comm-overlap on or off"}},
      {"a learning rate f32 rounds to zero", {"--lr", "1e-50"}, {"--lr 1e-50", "32-bit float"}},
      {"a seed past 2^64 - 1",
       {"--seed", "18446744073709551616"},
       {"18446744073709551616", "at most 18446744073709551615"}},
      {"tokens a micro-batch past 2^31",
       {"--seq-length", "1048576", "--micro-batch-size", "4096", "--global-batch-size", "4096"},
       {"--micro-batch-size 4096", "--seq-length 1048576"}},
      {"shard size not a size",
       small({"--save", "out", "--max-shard-size", "big"}),
       {"--max-shard-size big", "512MB"}},
      {"shard size zero",
       small({"--save", "out", "--max-shard-size", "0"}),
       {"--max-shard-size 0"}},
      {"model no class has",
       small({"--moe-router-pre-softmax"}),
       {"--moe-router-pre-softmax", "no transformers model class"}},
      {"expert option in a dense model",
       {"--num-experts", "0", "--moe-shared-expert-intermediate-size", "64"},
       {"--moe-shared-expert-intermediate-size", "dense model"}},
      {"moe layer pattern of the wrong length",
       small({"--qk-layernorm", "--moe-layer-freq", "[0,1,1]"}),
       {"--moe-layer-freq [0,1,1]", "3 entries for 1 layers"}},
      {"heads",
       {"--hidden-size", "30", "--num-attention-heads", "4"},
       {"--num-attention-heads 4", "--hidden-size 30"}},
      {"batch",
       {"--global-batch-size", "20", "--log-json", "log.jsonl"},
       {"--global-batch-size 20", "multiple"}},
      {"vocab for the task", {"--vocab-size", "100"}, {"--vocab-size 100", ">= 256"}},
      {"top-k",
       {"--num-experts", "8", "--moe-router-topk", "9", "--save", "out"},
       {"--moe-router-topk 9"}},
      {"log dir", small({"--log-json", "nodir/log.jsonl"}), {"nodir", "does not exist"}},
      {"save is a file",
       small({"--save", "afile"}),
       {"afile", "not a directory"},
       [](const fs::path& w) { write_text(w / "afile", "x"); }},
      {"no iterations", {"--train-iters", "0"}, {"--train-iters 0"}},
      {"overlap", {"--comm-overlap", "sometimes"}, {"sometimes"}},
      {"param gather without the distributed optimizer",
       small({"--overlap-param-gather"}),
       {"--overlap-param-gather", "needs --use-distributed-optimizer"}},
      {"distributed optimizer with the deferred update",
       small({"--use-distributed-optimizer", "--defer-optimizer"}),
       {"--use-distributed-optimizer", "--defer-optimizer", "--overlap-param-gather"}},
      {"distributed optimizer with moving experts",
       small({"--use-distributed-optimizer", "--rebalance-experts", "5"}),
       {"--use-distributed-optimizer", "--rebalance-experts 5"}},
      {"node times on one CPU rank",
       small({"--node-times-out", "nodes.json"}),
       {"--node-times-out nodes.json", "mpirun", "--device cuda"}},
      {"fp64 router", {"--moe-router-dtype", "fp64"}, {"--moe-router-dtype fp64", "valid: fp32"}},
      {"score function", {"--moe-router-score-function", "tanh"}, {"tanh", "softmax, sigmoid"}},
      {"load-balancing type",
       {"--moe-router-load-balancing-type", "sinkhorn"},
       {"sinkhorn", "aux_loss, seq_aux_loss, global_aux_loss, none"}},
      {"token drop policy",
       {"--moe-expert-capacity-factor", "1", "--moe-token-drop-policy", "random"},
       {"--moe-token-drop-policy random", "probs, position"}},
      {"padded capacity above the tokens",
       {"--num-experts", "8", "--moe-expert-capacity-factor", "5",
        "--moe-pad-expert-input-to-capacity"},
       {"--moe-pad-expert-input-to-capacity", "factor of at most 4"}},
      {"capacity in a dense model",
       {"--moe-expert-capacity-factor", "1"},
       {"--moe-expert-capacity-factor 1", "a dense model"}},
      {"negative z-loss", {"--moe-z-loss-coeff", "-1"}, {"--moe-z-loss-coeff", "-1"}},
      {"groups",
       small_v3({"--moe-aux-loss-coeff", "0", "--moe-router-num-groups", "3",
                 "--moe-router-group-topk", "1"}),
       {"--moe-router-num-groups 3"}},
      {"a group score of other than two experts",
       small_v3({"--moe-aux-loss-coeff", "0", "--moe-router-num-groups", "2",
                 "--moe-router-group-topk", "1", "--moe-router-topk", "1"}),
       {"--moe-router-topk 1 with --moe-router-group-topk 1", "best topk // group-topk"}},
      {"MTP modules past any model's", {"--mtp-num-layers", "65"}, {"--mtp-num-layers 65", "64"}},
      {"MTP weight negative",
       {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "-0.1"},
       {"--mtp-loss-scaling-factor -0.1", ">= 0"}},
      {"MTP as far ahead as the sequence",
       {"--mtp-num-layers", "4", "--seq-length", "4"},
       {"--mtp-num-layers 4", "--seq-length 4"}},
      {"MLA without the norms of its latents",
       {"--multi-latent-attention", "--num-query-groups", "8", "--moe-router-score-function",
        "sigmoid", "--moe-aux-loss-coeff", "0"},
       {"--multi-latent-attention without --qk-layernorm"}},
  };
}

std::vector<BadInput> config_cases() {
  const auto config = [](const std::string& text) {
    return [text](const fs::path& w) { write_text(w / "run.toml", text); };
  };
  return {
      {"malformed TOML",
       {"--config", "run.toml"},
       {"run.toml", "line 1", "TOML syntax error"},
       config("num-layers = = 4\n")},
      {"unknown key",
       {"--config", "run.toml"},
       {"run.toml", "num-layer", "did you mean"},
       config("num-layer = 4\n")},
      {"wrong type",
       {"--config", "run.toml"},
       {"num-layers", "expected an integer"},
       config("num-layers = \"four\"\n")},
      {"key twice",
       {"--config", "run.toml"},
       {"line 2", "already set on line 1"},
       config("num-layers = 2\nnum_layers = 3\n")},
      {"table",
       {"--config", "run.toml"},
       {"tables are not supported"},
       config("[model]\nnum-layers = 2\n")},
      {"bad value", {"--config", "run.toml"}, {"lr", "value -1", "invalid"}, config("lr = -1.0\n")},
      {"bad choice",
       {"--config", "run.toml"},
       {"nan-policy", "maybe"},
       config("nan-policy = \"maybe\"\n")},
      {"missing config", {"--config", "none.toml"}, {"none.toml", "cannot open"}},
  };
}

std::vector<BadInput> data_cases() {
  const auto file = [](const std::string& name, const std::string& bytes) {
    return [name, bytes](const fs::path& w) { write_text(w / name, bytes); };
  };
  return {
      {"missing data", small({"--data-path", "missing.bin"}), {"missing.bin", "cannot read"}},
      // Note [Outputs that are inputs]
      {"log onto the data file",
       small({"--data-path", "t.txt", "--log-json", "./t.txt"}),
       {"--log-json ./t.txt", "--data-path reads"},
       file("t.txt", std::string(4000, 'a'))},
      {"trace onto a Megatron pair's index",
       small({"--data-path", "corpus", "--trace", "corpus.idx"}),
       {"--trace corpus.idx", "--data-path reads"},
       [](const fs::path& w) {
         write_text(w / "corpus.bin", "x");
         write_text(w / "corpus.idx", "x");
       }},
      {"two outputs onto one file",
       small({"--log-json", "out.json", "--trace", "out.json"}),
       {"--trace out.json and --log-json out.json name the same file"}},
      {"log where --save keeps its pointer",
       small({"--save", "ck", "--log-json", "ck/latest"}),
       {"--log-json ck/latest", "--save ck writes its own files"},
       [](const fs::path& w) { fs::create_directories(w / "ck"); }},
      {"data is a directory",
       small({"--data-path", "d"}),
       {"--data-path d", "is a directory"},
       [](const fs::path& w) { fs::create_directories(w / "d"); }},
      {"token id over vocab",
       small({"--data-path", "t.bin", "--log-json", "log.jsonl"}),
       {"t.bin", "has id 300", "byte offset", "--vocab-size"},
       file("t.bin", llmc(20240520, 1, 200, std::vector<int>(200, 300)))},
      {"truncated llm.c header",
       small({"--data-path", "t.bin", "--data-format", "tokens"}),
       {"t.bin", "shorter than the 1024-byte llm.c header"},
       file("t.bin", llmc(20240520, 1, 10, {}).substr(0, 100))},
      {"llm.c count beyond file",
       small({"--data-path", "t.bin"}),
       {"t.bin", "1000", "truncated"},
       file("t.bin", llmc(20240520, 1, 1000, std::vector<int>(500, 1)))},
      {"llm.c version",
       small({"--data-path", "t.bin", "--data-format", "tokens"}),
       {"t.bin", "version 3"},
       file("t.bin", llmc(20240520, 3, 10, std::vector<int>(10, 1)))},
      {"Megatron magic",
       small({"--data-path", "m", "--data-format", "megatron"}),
       {"m.idx", "MMIDIDX"},
       [](const fs::path& w) {
         write_text(w / "m.bin", std::string(64, '\1'));
         write_text(w / "m.idx", megatron_idx("NOTANIDX!", 1, 1));
       }},
      {"Megatron counts",
       small({"--data-path", "m", "--data-format", "megatron"}),
       {"m.idx", "more than its"},
       [](const fs::path& w) {
         write_text(w / "m.bin", std::string(64, '\1'));
         write_text(w / "m.idx", megatron_idx(std::string("MMIDIDX\0\0", 9), uint64_t{1} << 60, 1));
       }},
      {"mock data and a data path",
       small({"--mock-data", "--data-path", "t.txt"}),
       {"--mock-data and --data-path t.txt", "give one of them"},
       file("t.txt", std::string(4096, 'a'))},
      {"data too short",
       small({"--data-path", "short.txt"}),
       {"short.txt", "fewer tokens than one sample"},
       file("short.txt", "0123456789")},
  };
}

// Validation (cli/validation.h), `tandem eval` and --tensorboard-dir.
std::vector<BadInput> validation_cases() {
  const auto text = [](const fs::path& w) { write_text(w / "t.txt", std::string(4096, 'a')); };
  const auto afile = [](const fs::path& w) { write_text(w / "afile", "x"); };
  const auto none = [](const fs::path&) {};
  return {
      {"eval interval 0",
       small({"--eval-interval", "0", "--eval-iters", "5"}),
       {"--eval-interval 0", ">= 1"}},
      {"split that does not parse",
       small({"--data-path", "t.txt", "--split", "90:10"}),
       {"--split 90:10", "969,30,1"},
       text},
      {"split of nothing", small({"--split", "969,30,1"}), {"--split 969,30,1", "no --data-path"}},
      {"split without a training part",
       small({"--data-path", "t.txt", "--split", "0,1,0"}),
       {"--split 0,1,0", "training part no weight"},
       text},
      {"validating on the training data",
       small({"--data-path", "t.txt", "--eval-iters", "2", "--log-json", "log.jsonl"}),
       {"--eval-iters 2", "--split", "--valid-data-path"},
       text},
      {"validation part too short",
       small({"--data-path", "t.txt", "--split", "999,1,0", "--eval-iters", "1", "--log-json",
              "log.jsonl", "--tensorboard-dir", "tb"}),
       {"--split 999,1,0", "validation part", "fewer than one sample"},
       text},
      {"missing validation data",
       small({"--valid-data-path", "missing.bin", "--eval-iters", "1"}),
       {"--valid-data-path missing.bin", "cannot read"}},
      {"two kinds of validation data",
       small({"--data-path", "t.txt", "--split", "90,10,0", "--valid-data-path", "t.txt"}),
       {"--data-path t.txt and --valid-data-path", "both name the run's data"},
       text},
      {"a blend weight of 0",
       small({"--data-path", "0", "t.txt", "1", "t.txt"}),
       {"--data-path 0 t.txt 1 t.txt", "the weight 0 of t.txt", "finite number > 0"},
       text},
      {"a blend with a weight missing",
       small({"--data-path", "0.5", "t.txt", "t.txt", "t.txt"}),
       {"--data-path 0.5 t.txt t.txt t.txt", "some prefixes have a weight"},
       text},
      {"split beside the per-part paths",
       small({"--train-data-path", "t.txt", "--split", "90,10,0"}),
       {"--split 90,10,0", "--train-data-path", "leave --split out"},
       text},
      {"held-out data without training data",
       small({"--test-data-path", "t.txt", "--eval-iters", "1"}),
       {"--test-data-path t.txt", "no --train-data-path"},
       text},
      {"per-part training data validating on nothing",
       small({"--train-data-path", "t.txt", "--eval-iters", "2", "--log-json", "log.jsonl"}),
       {"--eval-iters 2", "--train-data-path t.txt", "--valid-data-path"},
       text},
      {"mock data beside per-part paths",
       small({"--mock-data", "--train-data-path", "t.txt"}),
       {"--mock-data and --train-data-path", "give one of them"},
       text},
      {"tensorboard dir under a file",
       small({"--tensorboard-dir", "afile/tb", "--log-json", "log.jsonl"}),
       {"--tensorboard-dir afile/tb", "afile is not a directory"},
       afile},
      {"tensorboard dir is a file",
       small({"--tensorboard-dir", "afile"}),
       {"--tensorboard-dir afile", "not a directory"},
       afile},
      {"eval without a model", small({}), {"tandem eval needs --load"}, none, "eval"},
      // Megatron-LM's document options (Note [Document masking] in data/document_masks.h).
      {"document mask without an end-of-document id",
       small({"--reset-attention-mask"}),
       {"--reset-attention-mask needs the end-of-document id", "--eod-token-id N", "NullTokenizer"},
       none},
      {"multi-token prediction on a pipeline, refused before the GPU opens",
       small({"--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2", "--device", "cuda"}),
       {"--mtp-num-layers 1", "--pipeline-model-parallel-size", "one pipeline stage"},
       none},
      {"Megatron-LM's LayerNorm",
       small({"--normalization", "LayerNorm"}),
       {"--normalization LayerNorm is not taken", "RMSNorm"},
       none},
      {"Megatron-LM's 1p norms",
       small({"--normalization", "RMSNorm", "--apply-layernorm-1p"}),
       {"--apply-layernorm-1p is not taken", "leave it out"},
       none},
      {"end-of-document id outside the vocabulary",
       small({"--reset-attention-mask", "--eod-token-id", "300", "--vocab-size", "256"}),
       {"--eod-token-id 300 is outside the vocabulary [0, 256)"},
       none},
  };
}

TEST_F(BadInputs, OptionsConfigFilesAndDataFiles) {
  EXPECT_GE(run_cases({option_cases(), config_cases(), data_cases(), validation_cases()}), 25);
}

// Checkpoint cases: each starts from a copy of the valid checkpoint (ck/) or HF directory (hf/).
std::vector<BadInput> checkpoint_table() {
  const std::vector<std::string> hf_run = {
      "--load", "hf", "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4"};
  const auto hf = [&](std::vector<std::string> more) {
    std::vector<std::string> args = hf_run;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  const std::string st = "ck/iter_0000001/";
  return {
      // A training run starts fresh there (Megatron-LM's rule); eval needs a model.
      {"missing checkpoint",
       {"--load", "nothing"},
       {"--load nothing", "cannot read"},
       [](const fs::path&) {},
       "eval"},
      {"empty checkpoint directory",
       {"--load", "empty"},
       {"empty", "not a checkpoint"},
       [](const fs::path& w) { fs::create_directories(w / "empty"); },
       "eval"},
      {"not a checkpoint",
       {"--load", "other"},
       {"other", "not a checkpoint"},
       [](const fs::path& w) {
         fs::create_directories(w / "other");
         write_text(w / "other/notes.txt", "not a model\n");
       }},
      {"a Megatron-LM checkpoint",
       {"--load", "mcore"},
       {"--load mcore is a Megatron-LM checkpoint", "Hugging Face"},
       [](const fs::path& w) {
         fs::create_directories(w / "mcore/iter_0000010");
         write_text(w / "mcore/latest_checkpointed_iteration.txt", "10\n");
       }},
      {"latest names a missing directory",
       {"--load", "ck", "--save", "ck"},
       {"ck/latest", "iter_0000009", "does not exist"},
       [](const fs::path& w) { write_text(w / "ck/latest", "iter_0000009\n"); }},
      {"latest is garbage",
       {"--load", "ck"},
       {"ck/latest", "expected the name of an iteration"},
       [](const fs::path& w) { write_text(w / "ck/latest", "\x01\x02garbage"); }},
      {"truncated weights",
       {"--load", "ck", "--train-iters", "3"},
       {st + "model.safetensors", "truncated"},
       [=](const fs::path& w) { fs::resize_file(w / (st + "model.safetensors"), 1000); }},
      {"bit flip in the weights header",
       {"--load", "ck", "--train-iters", "3"},
       {st + "model.safetensors", "CRC-32C", "corrupt"},
       [=](const fs::path& w) { flip_byte(w / (st + "model.safetensors"), 20); }},
      {"bit flip in the optimizer state",
       {"--load", "ck", "--train-iters", "3"},
       {st + "optimizer.safetensors", "CRC-32C"},
       [=](const fs::path& w) {
         const fs::path f = w / (st + "optimizer.safetensors");
         flip_byte(f, static_cast<int64_t>(fs::file_size(f)) - 5);
       }},
      {"optimizer state missing",
       {"--load", "ck", "--train-iters", "3"},
       {"optimizer.safetensors", "missing"},
       [=](const fs::path& w) { fs::remove(w / (st + "optimizer.safetensors")); }},
      {"trainer state inconsistent",
       {"--load", "ck", "--train-iters", "3"},
       {"trainer_state.json", "samples_consumed 5"},
       [=](const fs::path& w) {
         replace_in(w / (st + "trainer_state.json"), "\"samples_consumed\": 4",
                    "\"samples_consumed\": 5");
       }},
      {"model option differs",
       {"--load", "ck", "--num-layers", "3", "--train-iters", "3"},
       {"--num-layers 3 (given on the command line) differs from the checkpoint's num-layers 1"}},
      {"seed differs",
       {"--load", "ck", "--seed", "7", "--train-iters", "3"},
       {"--seed 7", "checkpoint's seed 1234"}},
      {"nothing left to train",
       {"--load", "ck", "--train-iters", "1", "--save", "ck"},
       {"iteration 1", "--train-iters is 1", "nothing is left to train"}},
      {"HF header does not start with {",
       hf({}),
       {"hf/model.safetensors", "'{'"},
       [](const fs::path& w) { flip_byte(w / "hf/model.safetensors", 8); }},
      {"HF weights truncated",
       hf({}),
       {"hf/model.safetensors", "past the end of the file"},
       [](const fs::path& w) { fs::resize_file(w / "hf/model.safetensors", 100); }},
      {"HF weights of another shape",
       hf({}),
       {"has shape", "config.json implies"},
       [](const fs::path& w) {
         replace_in(w / "hf/config.json", "\"intermediate_size\": 32", "\"intermediate_size\": 64");
       }},
      {"HF config of another model",
       hf({}),
       {"hf/config.json", "model_type", "gpt2"},
       [](const fs::path& w) {
         replace_in(w / "hf/config.json", "\"model_type\": \"mixtral\"",
                    "\"model_type\": \"gpt2\"");
       }},
      {"HF config this model cannot be",
       hf({}),
       {"hidden_act", "gelu"},
       [](const fs::path& w) {
         replace_in(w / "hf/config.json", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
       }},
      {"HF extra tensor",
       hf({}),
       {"extra.weight", "not part of the model"},
       [](const fs::path& w) {
         auto tensors =
             io::load_safetensors((w / "hf/model.safetensors").string(), MemCategory::kOther);
         std::vector<std::pair<std::string, Tensor>> named(tensors.begin(), tensors.end());
         named.emplace_back("extra.weight", Tensor::zeros({2}, DType::kF32, MemCategory::kOther));
         io::save_safetensors((w / "hf/model.safetensors").string(), named);
       }},
      {"HF weights missing",
       hf({}),
       {"hf", "neither model.safetensors"},
       [](const fs::path& w) { fs::remove(w / "hf/model.safetensors"); }},
      {"eval of no batches",
       {"--load", "ck", "--eval-iters", "0"},
       {"--eval-iters 0", "evaluates nothing"},
       [](const fs::path&) {},
       "eval"},
      {"eval of a damaged checkpoint",
       {"--load", "ck", "--eval-iters", "1"},
       {st + "model.safetensors", "CRC-32C"},
       [=](const fs::path& w) { flip_byte(w / (st + "model.safetensors"), 20); },
       "eval"},
      {"eval with another model option",
       {"--load", "ck", "--num-layers", "3"},
       {"--num-layers 3", "differs from the checkpoint's num-layers 1"},
       [](const fs::path&) {},
       "eval"},
  };
}

TEST_F(BadInputs, Checkpoints) {
  TempDir capture;
  const auto cases = checkpoint_table();
  for (const BadInput& c : cases) {
    run_case(c, capture.path(), [](const fs::path& w) {
      copy_fixture(w, "ck");
      copy_fixture(w, "hf");
    });
  }
  EXPECT_GE(cases.size(), 15u);
}

}  // namespace
}  // namespace tandem::test
