// Megatron-LM's options parsed in-process. Oracle: Megatron-LM's arguments.py for the defaults
// and meanings (docs/megatron.md), and for each refusal a substring the message must contain.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/config_file.h"
#include "cli/megatron_options.h"
#include "cli/options.h"
#include "core/error.h"
#include "parse_run_options.h"

namespace tandem::cli {
namespace {

using parsing::error_of;
using parsing::parse;

// A small MoE the options below are tried on.
std::vector<std::string> moe(std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--num-experts", "4", "--num-layers", "4"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// A multi-latent attention model as DeepSeek-V3's recipes describe it.
std::vector<std::string> mla(std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--multi-latent-attention",
                                "--num-experts",
                                "4",
                                "--moe-router-score-function",
                                "sigmoid",
                                "--kv-lora-rank",
                                "8",
                                "--qk-head-dim",
                                "8",
                                "--qk-pos-emb-head-dim",
                                "4",
                                "--v-head-dim",
                                "8",
                                "--moe-aux-loss-coeff",
                                "0",
                                "--hidden-size",
                                "64"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(MegatronOptions, DefaultsAreMegatrons) {
  const RunOptions o = parse({});
  EXPECT_EQ(o.model.num_experts, 0);  // a dense model
  EXPECT_EQ(o.model.moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(o.model.init_method_std, 0.02);
  EXPECT_EQ(o.train.adam_beta1, 0.9);
  EXPECT_EQ(o.train.adam_beta2, 0.999);
  EXPECT_EQ(o.train.adam_eps, 1e-8);
  EXPECT_EQ(o.train.weight_decay, 0.01);
  EXPECT_EQ(o.train.min_lr, 0.0);
  EXPECT_EQ(o.train.lr_warmup_iters, 0);
  EXPECT_EQ(o.train.clip_grad, 1.0);
  EXPECT_EQ(o.train.seed, 1234u);
}

TEST(MegatronOptions, EveryNeutralOptionIsAccepted) {
  for (const MegatronOption& m : megatron_options()) {
    if (m.kind != MegatronKind::kNeutral) continue;
    std::vector<std::string> args = {std::string("--") + m.name};
    if (m.takes_value) args.push_back("7");
    EXPECT_EQ(error_of(args), "") << m.name;
  }
}

TEST(MegatronOptions, EveryRefusedOptionIsRefusedByName) {
  for (const MegatronOption& m : megatron_options()) {
    if (m.kind != MegatronKind::kRefused) continue;
    std::vector<std::string> args = {std::string("--") + m.name};
    if (m.takes_value) args.push_back("2");
    const std::string e = error_of(args);
    EXPECT_NE(e.find(std::string("--") + m.name + " is not taken"), std::string::npos)
        << m.name << ": " << e;
    EXPECT_NE(e.find(m.note), std::string::npos) << m.name << ": " << e;
  }
}

TEST(MegatronOptions, OnlyRowsTakeTheirValuesAndRefuseOthersNamingThem) {
  for (const MegatronOption& m : megatron_options()) {
    if (m.kind != MegatronKind::kOnly) continue;
    for (const std::string& v : m.only) {
      EXPECT_EQ(error_of({std::string("--") + m.name, v}), "") << m.name << " " << v;
    }
    const std::string e = error_of({std::string("--") + m.name, "bogus"});
    EXPECT_NE(e.find(std::string("--") + m.name + " bogus is not taken"), std::string::npos) << e;
    EXPECT_NE(e.find(m.only.front()), std::string::npos) << e;
  }
  // Numbers compare as numbers: Megatron-LM's scripts write 0.0 and 1.0.
  EXPECT_EQ(error_of({"--attention-dropout", "0.0", "--rotary-percent", "1.0"}), "");
  EXPECT_NE(error_of({"--hidden-dropout", "0.1"}).find("tandem has no dropout"), std::string::npos);
  EXPECT_NE(error_of({"--context-parallel-size", "2"}).find("plan --search"), std::string::npos);
}

// --tensor-model-parallel-size and --sequence-parallel are settings: TP 1 with or without SP is
// taken (Megatron-LM turns SP off at TP 1); at TP > 1 the sizes it splits are checked first,
// naming them, and then what is not built yet is refused by name (tests/cli/test_bad_inputs.cc
// has every refusal).
TEST(MegatronOptions, TensorParallelSizesAreCheckedThenRefusedByName) {
  const RunOptions o = parse({"--tensor-model-parallel-size", "1", "--sequence-parallel"});
  EXPECT_EQ(o.parallel.tensor_model_parallel_size, 1);
  EXPECT_TRUE(o.parallel.sequence_parallel);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "16"})
                .find("--tensor-model-parallel-size 16 does not divide --num-attention-heads 8"),
            std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "2", "--num-query-groups", "1"})
                .find("does not divide --num-query-groups 1"),
            std::string::npos);
  EXPECT_NE(
      error_of({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "127"})
          .find("does not divide --seq-length (with --sequence-parallel) 127"),
      std::string::npos);
  // Without --sequence-parallel the sequence is not split.
  EXPECT_EQ(
      error_of({"--tensor-model-parallel-size", "2", "--seq-length", "127"}).find("--seq-length"),
      std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "2", "--sequence-parallel"})
                .find("--tensor-model-parallel-size 2 with --sequence-parallel is not built yet"),
            std::string::npos);
  // A dense model at TP 2 on one pipeline stage is taken (Note [Tensor parallelism]).
  EXPECT_EQ(error_of({"--tensor-model-parallel-size", "2"}), "");
  // q/k norms and q/k/v biases, which no dense family has (the CLI refuses them first), are
  // refused by the rule itself, as the trainer applies it.
  ModelConfig dense;
  dense.num_experts = 0;
  TrainConfig t;
  ParallelConfig p;
  p.tensor_model_parallel_size = 2;
  EXPECT_NO_THROW(check_tensor_parallel(dense, t, p));
  for (const char* option : {"--qk-layernorm", "--add-qkv-bias"}) {
    ModelConfig m = dense;
    (option[2] == 'q' ? m.qk_layernorm : m.add_qkv_bias) = true;
    try {
      check_tensor_parallel(m, t, p);
      ADD_FAILURE() << option << " taken at TP 2";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--tensor-model-parallel-size 2 with ") +
                                           option + " is not built yet"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_NE(error_of(moe({"--tensor-model-parallel-size", "2"}))
                .find("--tensor-model-parallel-size 2 with --num-experts 4 is not built yet"),
            std::string::npos);
  EXPECT_NE(error_of(mla({"--qk-layernorm", "--tensor-model-parallel-size", "2"}))
                .find("--tensor-model-parallel-size 2 with --multi-latent-attention is not built"),
            std::string::npos);
}

// Megatron-LM pads the vocabulary to a multiple of --make-vocab-size-divisible-by times the
// tensor-parallel size (arguments.py's _vocab_size_with_padding), so that each rank holds as many
// rows.
TEST(MegatronOptions, VocabularyPaddingCountsTheTensorParallelSize) {
  RunOptions o;
  o.megatron = {{"tokenizer-type", "NullTokenizer"}, {"make-vocab-size-divisible-by", "1"}};
  o.model.vocab_size = 300;
  o.parallel.tensor_model_parallel_size = 4;
  apply_megatron_options(o, {});
  EXPECT_EQ(o.model.vocab_size, 304);  // 300 + the end-of-document id, padded to 4
  RunOptions q;
  q.megatron = {{"make-vocab-size-divisible-by", "128"}};
  q.model.vocab_size = 384;
  q.parallel.tensor_model_parallel_size = 2;
  try {
    apply_megatron_options(q, {});
    ADD_FAILURE() << "384 rows are not a multiple of 128 x 2";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--make-vocab-size-divisible-by 128 x --tensor-model-parallel-size 2"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("would train 512 rows"), std::string::npos) << m;
  }
}

TEST(MegatronOptions, OverlapMoeExpertParallelCommIsCombined1f1b) {
  const RunOptions o =
      parse(moe({"--expert-model-parallel-size", "2", "--overlap-moe-expert-parallel-comm",
                 "--delay-wgrad-compute", "--global-batch-size", "32"}));
  EXPECT_EQ(o.parallel.schedule, "combined-1f1b");
  EXPECT_NE(error_of(moe({"--overlap-moe-expert-parallel-comm", "--schedule", "1f1b"}))
                .find("give one of them"),
            std::string::npos);
}

TEST(MegatronOptions, LayersPerVirtualStageSetTheChunksAndTheInterleavedSchedule) {
  const RunOptions o =
      parse({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
             "--num-layers-per-virtual-pipeline-stage", "2", "--global-batch-size", "16"});
  EXPECT_EQ(o.parallel.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(o.parallel.schedule, "interleaved-1f1b");
  EXPECT_NE(error_of({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                      "--num-layers-per-virtual-pipeline-stage", "3"})
                .find("not a multiple"),
            std::string::npos);
  EXPECT_NE(error_of({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                      "--num-layers-per-virtual-pipeline-stage", "2",
                      "--virtual-pipeline-model-parallel-size", "2"})
                .find("give one"),
            std::string::npos);
  // Megatron-LM's chunks alone mean its interleaved schedule too.
  EXPECT_EQ(parse({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                   "--virtual-pipeline-model-parallel-size", "2", "--global-batch-size", "16"})
                .parallel.schedule,
            "interleaved-1f1b");
}

TEST(MegatronOptions, VocabularyIsNeverPaddedSilently) {
  EXPECT_EQ(error_of({"--vocab-size", "384", "--make-vocab-size-divisible-by", "128"}), "");
  const std::string e = error_of({"--vocab-size", "300", "--make-vocab-size-divisible-by", "128"});
  EXPECT_NE(e.find("--vocab-size 300"), std::string::npos) << e;
  EXPECT_NE(e.find("384"), std::string::npos) << e;
}

// Megatron-LM's NullTokenizer adds an end-of-document id V to --vocab-size V and pads V + 1.
TEST(MegatronOptions, NullTokenizerPadsAsMegatron) {
  EXPECT_EQ(parse({"--tokenizer-type", "NullTokenizer", "--vocab-size", "256"}).model.vocab_size,
            384);
  EXPECT_EQ(parse({"--tokenizer-type", "NullTokenizer", "--vocab-size", "128256"}).model.vocab_size,
            128384);
  EXPECT_EQ(parse({"--tokenizer-type", "NullTokenizer", "--vocab-size", "300",
                   "--make-vocab-size-divisible-by", "1"})
                .model.vocab_size,
            301);
  EXPECT_NE(error_of({"--tokenizer-type", "HuggingFaceTokenizer"}).find("needs --tokenizer-model"),
            std::string::npos);
  EXPECT_NE(error_of({"--tokenizer-model", "t.model"}).find("needs --tokenizer-type"),
            std::string::npos);
  EXPECT_NE(error_of({"--tokenizer-type", "TikTokenizer", "--tokenizer-model", "t.json"})
                .find("--tokenizer-type TikTokenizer is not taken"),
            std::string::npos);
  EXPECT_NE(error_of({"--tokenizer-type", "NullTokenizer", "--tokenizer-model", "t.json"})
                .find("not read with --tokenizer-type NullTokenizer"),
            std::string::npos);
}

// A Hugging Face tokenizer as transformers' AutoTokenizer reads it: len(tokenizer) counts the
// model's vocabulary and the added tokens once each (an added token already in the vocabulary
// is not a new one), eod is the eos_token's id, and the rows are that padded to 128.
TEST(MegatronOptions, HuggingFaceTokenizerGivesTheVocabularyAsMegatron) {
  const std::string dir = ::testing::TempDir() + "/hf_tokenizer";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << R"({"version": "1.0", "added_tokens": [
            {"id": 300, "content": "<|begin|>", "special": true},
            {"id": 301, "content": "<|end|>", "special": true},
            {"id": 5, "content": "t5", "special": false}],
          "model": {"type": "BPE", "vocab": {)";
  {
    std::ofstream f(dir + "/tokenizer.json", std::ios::app);
    for (int i = 0; i < 300; ++i) f << (i ? ", " : "") << "\"t" << i << "\": " << i;
    f << R"(}, "merges": []}})";
  }
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"eos_token": {"content": "<|end|>", "special": true}, "bos_token": "<|begin|>"})";
  const RunOptions o =
      parse({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir});
  EXPECT_EQ(o.model.vocab_size, 384);  // 300 + 2 added = 302 tokens, padded to 128
  EXPECT_EQ(o.train.eod_token_id, 301);
  // The tokenizer.json itself is taken too; the eos from special_tokens_map.json when the
  // config names none.
  std::ofstream(dir + "/tokenizer_config.json") << R"({"model_max_length": 4096})";
  std::ofstream(dir + "/special_tokens_map.json") << R"({"eos_token": "<|begin|>"})";
  const RunOptions file = parse({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                 dir + "/tokenizer.json", "--make-vocab-size-divisible-by", "1"});
  EXPECT_EQ(file.model.vocab_size, 302);
  EXPECT_EQ(file.train.eod_token_id, 300);
  // --vocab-size that disagrees is refused naming both; a Hub name is refused naming the way in.
  const std::string e = error_of({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                  dir, "--vocab-size", "1000"});
  EXPECT_NE(e.find("--vocab-size 1000"), std::string::npos) << e;
  EXPECT_NE(e.find("302 tokens, 384 rows padded, end-of-document id 300"), std::string::npos) << e;
  EXPECT_NE(error_of({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      "meta-llama/Meta-Llama-3-8B"})
                .find("not from the Hub"),
            std::string::npos);
  std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "BPE"}})";
  EXPECT_NE(error_of({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir})
                .find("no \"model\" with a \"vocab\""),
            std::string::npos);
}

TEST(MegatronOptions, MultiLatentAttentionAsMegatronsRecipesDescribeIt) {
  // Its latent norms are what --qk-layernorm asks for; without it Megatron-LM's MLA has none.
  EXPECT_NE(error_of(mla()).find("--multi-latent-attention without --qk-layernorm"),
            std::string::npos);
  const RunOptions plain = parse(mla({"--qk-layernorm"}));
  EXPECT_FALSE(plain.model.qk_layernorm);        // the per-head norms are Qwen3's, not MLA's
  EXPECT_FALSE(plain.model.rotary_interleaved);  // Megatron-LM's MLA default
  EXPECT_EQ(plain.model.rope_type, "rope");      // YaRN at factor 1 is the plain RoPE
  const RopeSpec r = parse(mla({"--qk-layernorm", "--rotary-scaling-factor", "40"})).model.rope();
  EXPECT_EQ(r.scaling, RopeScaling::kYarn);  // Megatron-LM's MLA takes YaRN by default
  EXPECT_EQ(r.factor, 40.0);
  EXPECT_EQ(r.original_max_position, 4096);
  EXPECT_EQ(parse(mla({"--qk-layernorm", "--rotary-scaling-factor", "40", "--rope-type", "rope"}))
                .model.rope_type,
            "rope");
}

// docs/megatron.md lists every row, so a user finds each option a script may pass.
TEST(MegatronOptions, DocsListEveryRow) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/docs/megatron.md");
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_FALSE(text.str().empty());
  for (const MegatronOption& m : megatron_options()) {
    EXPECT_NE(text.str().find(std::string("`--") + m.name), std::string::npos) << m.name;
  }
}

// Recomputation changes what a step keeps, never its values: moe_act is --recompute-experts, mlp
// and shared_experts --recompute, the rest is kept and named in a note; an unknown module exits
// 2 naming the valid ones.
TEST(MegatronOptions, RecomputationIsTakenAndWhatTandemKeepsIsNamed) {
  const RunOptions o = parse(moe({"--recompute-granularity", "selective", "--recompute-modules",
                                  "moe_act", "layernorm", "shared_experts", "mla_up_proj", "mlp"}));
  EXPECT_TRUE(o.train.recompute_experts);
  EXPECT_EQ(o.train.recompute, "shared_experts,mlp");
  EXPECT_EQ(o.megatron.at("recompute-modules"), "moe_act layernorm shared_experts mla_up_proj mlp");
  const std::string note = megatron_recompute_note(o.megatron);
  EXPECT_NE(note.find("recompute layernorm, mla_up_proj in the backward"), std::string::npos)
      << note;
  // Modules without a selective granularity are not recomputed (Megatron-LM reads them only
  // then); core_attn, the default module, is what tandem's attention keeps anyway.
  EXPECT_FALSE(parse(moe({"--recompute-modules", "moe_act"})).train.recompute_experts);
  EXPECT_EQ(parse(moe({"--recompute-modules", "mlp"})).train.recompute, "");
  // tandem's own --recompute: the same modules given both ways agree, or exit 2.
  EXPECT_EQ(parse(moe({"--recompute", "mlp", "--recompute-granularity", "selective",
                       "--recompute-modules", "mlp"}))
                .train.recompute,
            "mlp");
  const std::string both = error_of(moe({"--recompute", "mlp", "--recompute-granularity",
                                         "selective", "--recompute-modules", "shared_experts"}));
  EXPECT_NE(both.find("--recompute-modules shared_experts is --recompute shared_experts, which "
                      "--recompute mlp leaves out"),
            std::string::npos)
      << both;
  const std::string bad = error_of(moe({"--recompute", "mlp,layernorm"}));
  EXPECT_NE(bad.find("--recompute mlp,layernorm: 'layernorm' is not a module tandem recomputes"),
            std::string::npos)
      << bad;
  EXPECT_EQ(megatron_recompute_note({{"recompute-activations", ""}}), "");
  EXPECT_NE(megatron_recompute_note({{"recompute-granularity", "full"}}).find("whole layers"),
            std::string::npos);
  const std::string e =
      error_of(moe({"--recompute-granularity", "selective", "--recompute-modules", "attn"}));
  EXPECT_NE(e.find("--recompute-modules attn is not a module"), std::string::npos) << e;
  EXPECT_NE(e.find("shared_experts"), std::string::npos) << e;
  EXPECT_NE(error_of(moe({"--recompute-granularity", "selective", "--recompute-modules", "moe_act",
                          "--recompute-experts=false"}))
                .find("give one of them"),
            std::string::npos);
  EXPECT_NE(error_of({"--recompute-granularity", "block"}).find("selective, full"),
            std::string::npos);
}

TEST(MegatronOptions, ModelNoteNamesWhatMegatronWouldBuildOtherwise) {
  EXPECT_EQ(megatron_model_note({}), "");  // no Megatron-LM option: nothing to say
  const std::string note = megatron_model_note({{"use-mcore-models", ""}, {"swiglu", ""}});
  EXPECT_NE(note.find("without --disable-bias-linear, biases on every linear layer"),
            std::string::npos)
      << note;
  EXPECT_EQ(note.find("without --swiglu"), std::string::npos) << note;
  std::map<std::string, std::string> all = {{"use-mcore-models", ""}};
  for (const ModelMarker& m : megatron_model_markers()) all[m.name] = "";
  EXPECT_EQ(megatron_model_note(all), "");
}

}  // namespace
}  // namespace tandem::cli
