// Megatron-LM's options parsed in-process. Oracle: Megatron-LM's arguments.py for the defaults
// and meanings (docs/megatron.md), and for each refusal a substring the message must contain.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "2"}).find("plan --search"),
            std::string::npos);
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
  EXPECT_NE(error_of({"--tokenizer-type", "HuggingFaceTokenizer"}).find("tandem convert"),
            std::string::npos);
  EXPECT_NE(error_of({"--tokenizer-model", "t.model"}).find("--tokenizer-model is not taken"),
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

// Recomputation changes what a step keeps, never its values: moe_act is --recompute-experts, the
// rest is kept and named in a note; an unknown module exits 2 naming the valid ones.
TEST(MegatronOptions, RecomputationIsTakenAndWhatTandemKeepsIsNamed) {
  const RunOptions o = parse(moe({"--recompute-granularity", "selective", "--recompute-modules",
                                  "moe_act", "layernorm", "mla_up_proj"}));
  EXPECT_TRUE(o.train.recompute_experts);
  EXPECT_EQ(o.megatron.at("recompute-modules"), "moe_act layernorm mla_up_proj");
  const std::string note = megatron_recompute_note(o.megatron);
  EXPECT_NE(note.find("recompute layernorm, mla_up_proj in the backward"), std::string::npos)
      << note;
  // Modules without a selective granularity are not recomputed (Megatron-LM reads them only
  // then); core_attn, the default module, is what tandem's attention keeps anyway.
  EXPECT_FALSE(parse(moe({"--recompute-modules", "moe_act"})).train.recompute_experts);
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
