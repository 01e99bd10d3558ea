// Run options parsed in-process. Oracle: docs/model.md's and docs/megatron.md's defaults, and for
// each bad input a substring the message must contain (the bad value and what is valid).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "core/error.h"
#include "parse_run_options.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_cli_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = (path_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

using parsing::error_of;
using parsing::parse;

TEST(Options, DefaultsAreDocumented) {
  const RunOptions o = parse({});
  EXPECT_EQ(o.model.vocab_size, 256);
  EXPECT_EQ(o.model.hidden_size, 256);
  EXPECT_EQ(o.model.num_layers, 4);
  EXPECT_EQ(o.model.num_attention_heads, 8);
  EXPECT_EQ(o.model.num_query_groups, 8);
  EXPECT_EQ(o.model.ffn_hidden_size, 512);
  EXPECT_EQ(o.model.num_experts, 0);  // Megatron-LM's: a dense model
  EXPECT_EQ(o.model.moe_router_topk, 2);
  EXPECT_DOUBLE_EQ(o.model.moe_aux_loss_coeff, 0.0);
  EXPECT_DOUBLE_EQ(o.model.rotary_base, 10000.0);
  EXPECT_DOUBLE_EQ(o.model.norm_epsilon, 1e-5);
  EXPECT_EQ(o.model.seq_length, 128);
  EXPECT_DOUBLE_EQ(o.train.adam_beta1, 0.9);
  EXPECT_DOUBLE_EQ(o.train.adam_beta2, 0.999);
  EXPECT_DOUBLE_EQ(o.train.adam_eps, 1e-8);
  EXPECT_DOUBLE_EQ(o.train.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(o.train.clip_grad, 1.0);
  EXPECT_EQ(o.parallel.schedule, "1f1b");
  EXPECT_EQ(o.data_format, "auto");
  EXPECT_EQ(o.train.device, Device::kCPU);
  EXPECT_FALSE(o.quiet);
  EXPECT_TRUE(o.data_path.empty());
}

TEST(Options, CommandLineSetsEveryKind) {
  const RunOptions o =
      parse({"--num-layers", "2", "--lr", "1e-3", "--seed", "7", "--schedule", "combined-1f1b",
             "--quiet", "--num-experts", "0", "--norm-epsilon", "1e-6"});
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_DOUBLE_EQ(o.train.lr, 1e-3);
  EXPECT_EQ(o.train.seed, 7u);
  EXPECT_EQ(o.parallel.schedule, "combined-1f1b");
  EXPECT_TRUE(o.quiet);
  EXPECT_FALSE(o.model.is_moe());
  EXPECT_DOUBLE_EQ(o.model.norm_epsilon, 1e-6);
}

TEST(Options, ConfigFileValuesApply) {
  TempDir dir;
  const std::string cfg = dir.file("run.toml",
                                   "num-layers = 2\n"
                                   "lr = 1e-3\n"
                                   "min_lr = 1e-4  # underscores work too\n"
                                   "rotary-base = 500000  # an integer for a float option\n"
                                   "schedule = \"combined-1f1b\"\n"
                                   "quiet = true\n"
                                   "seed = 99\n");
  const RunOptions o = parse({"--config", cfg});
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_DOUBLE_EQ(o.train.lr, 1e-3);
  EXPECT_DOUBLE_EQ(o.train.min_lr, 1e-4);
  EXPECT_DOUBLE_EQ(o.model.rotary_base, 500000.0);
  EXPECT_EQ(o.parallel.schedule, "combined-1f1b");
  EXPECT_TRUE(o.quiet);
  EXPECT_EQ(o.train.seed, 99u);
  EXPECT_EQ(o.model.hidden_size, 256);  // not in the file: the default stays
}

// Note [Deferred update by default] (options.cc): on where the update has an all-to-all to
// cover (GPUs, expert parallelism, combined-1f1b with its own communication stream), off
// elsewhere, and a value given on the command line or in --config wins either way.
TEST(Options, DeferredUpdateIsOnByDefaultOnlyWhereItCoversAnAllToAll) {
  // --device, --expert-model-parallel-size and --schedule, then any other options.
  auto defer = [](const std::string& device, const std::string& ep, const std::string& schedule,
                  std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--device",      device, "--expert-model-parallel-size", ep, "--schedule", schedule,
        "--num-experts", "8"};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse(args).train.defer_optimizer;
  };
  EXPECT_TRUE(defer("cuda", "2", "combined-1f1b"));
  EXPECT_TRUE(defer("cuda", "2", "combined-1f1b", {"--comm-overlap", "split"}));
  EXPECT_TRUE(defer("cuda", "2", "combined-1f1b", {"--pipeline-model-parallel-size", "2"}));
  EXPECT_FALSE(defer("cuda", "2", "combined-1f1b", {"--comm-overlap", "off"}));
  EXPECT_FALSE(defer("cuda", "2", "combined-1f1b", {"--defer-optimizer=false"}));
  EXPECT_FALSE(defer("cpu", "2", "combined-1f1b"));
  EXPECT_FALSE(defer("cuda", "2", "1f1b"));
  EXPECT_FALSE(defer("cuda", "1", "combined-1f1b"));
  EXPECT_FALSE(parse({}).train.defer_optimizer);
  EXPECT_TRUE(parse({"--defer-optimizer"}).train.defer_optimizer);  // asked for, on the CPU
  TempDir dir;
  EXPECT_FALSE(defer("cuda", "2", "combined-1f1b",
                     {"--config", dir.file("off.toml", "defer-optimizer = false\n")}));
  EXPECT_TRUE(
      parse({"--config", dir.file("on.toml", "defer-optimizer = true\n")}).train.defer_optimizer);
}

// Note [Gradients reduced beside the backward]: on unless turned off, on the command line or in
// --config; "=false" is the only way to the reduction at the step's end.
TEST(Options, GradientsAreReducedBesideTheBackwardUnlessTurnedOff) {
  EXPECT_TRUE(parse({}).train.overlap_grad_reduce);
  EXPECT_TRUE(parse({"--device", "cuda"}).train.overlap_grad_reduce);
  EXPECT_TRUE(parse({"--overlap-grad-reduce"}).train.overlap_grad_reduce);
  EXPECT_FALSE(parse({"--overlap-grad-reduce=false"}).train.overlap_grad_reduce);
  TempDir dir;
  EXPECT_FALSE(parse({"--config", dir.file("off.toml", "overlap-grad-reduce = false\n")})
                   .train.overlap_grad_reduce);
  EXPECT_NE(error_of({"--overlap-grad-reduce=maybe"}), "");
}

// Note [Tied embeddings] (model/parameters.h): tied unless the Megatron-LM flag unties it, on the
// command line or in --config; a flag takes no value but true or false.
TEST(Options, OutputLayerIsTiedUnlessUntied) {
  const char* const kFlag = "--untie-embeddings-and-output-weights";
  EXPECT_TRUE(parse({}).model.tied_embeddings());
  EXPECT_FALSE(parse({kFlag}).model.tied_embeddings());
  EXPECT_TRUE(parse({std::string(kFlag) + "=false"}).model.tied_embeddings());
  TempDir dir;
  EXPECT_FALSE(
      parse({"--config", dir.file("untied.toml", "untie-embeddings-and-output-weights = true\n")})
          .model.tied_embeddings());
  EXPECT_NE(error_of({std::string(kFlag) + "=maybe"}), "");
  EXPECT_NE(error_of({kFlag, "yes"}), "");
  EXPECT_NE(
      error_of({"--config", dir.file("bad.toml", "untie-embeddings-and-output-weights = 2\n")}),
      "");
}

TEST(Options, CommandLineOverridesConfigFile) {
  TempDir dir;
  const std::string cfg = dir.file("run.toml", "num-layers = 2\nlr = 1e-3\nschedule = \"gpipe\"\n");
  // Before and after --config: the command line wins either way.
  const RunOptions a = parse({"--num-layers", "6", "--config", cfg});
  const RunOptions b = parse({"--config", cfg, "--num-layers", "6", "--schedule", "zb-h1"});
  for (const RunOptions& o : {a, b}) {
    EXPECT_EQ(o.model.num_layers, 6);
    EXPECT_DOUBLE_EQ(o.train.lr, 1e-3);
  }
  EXPECT_EQ(a.parallel.schedule, "gpipe");
  EXPECT_EQ(b.parallel.schedule, "zb-h1");
}

TEST(Options, MegatronDataPrefixIsAccepted) {
  TempDir dir;
  dir.file("corpus.bin", "x");
  dir.file("corpus.idx", "x");
  EXPECT_EQ(error_of({"--data-path", dir.path("corpus"), "--data-format", "megatron"}), "");
  const std::string text = dir.file("book.txt", "hello");
  EXPECT_EQ(parse({"--data-path", text, "--data-format", "text"}).data_path, StringList{text});
}

TEST(Options, EveryOptionHasHelpWithDefault) {
  CLI::App app{"tandem test"};
  RunOptions opts;
  add_run_options(app, opts);
  for (const CLI::Option* o : app.get_options()) {
    // Megatron-LM's options without a setting of their own have no default to show.
    if (o->get_name() == "--help" || o->get_group().rfind("Megatron-LM", 0) == 0) continue;
    EXPECT_NE(o->get_description().find("default"), std::string::npos) << o->get_name();
  }
  const std::string help = app.help();
  EXPECT_NE(help.find("--num-layers"), std::string::npos);
  EXPECT_NE(help.find("(default: 4)"), std::string::npos);
  EXPECT_NE(help.find("gpipe|1f1b|interleaved-1f1b|combined-1f1b|zb-h1|dualpipev"),
            std::string::npos);
}

struct BadInput {
  const char* what;
  std::vector<std::string> args;
  std::string config;  // written to a file and passed with --config when not empty
  std::string expected;
};

TEST(Options, BadInputsAreRejectedWithAUsefulMessage) {
  const std::vector<BadInput> cases = {
      {"unknown option", {"--num-layer", "4"}, "", "--num-layer"},
      {"missing value", {"--num-layers"}, "", "--num-layers"},
      {"not a number", {"--num-layers", "four"}, "", "four"},
      {"float for an integer", {"--num-layers", "1.5"}, "", "1.5 is not a whole decimal number"},
      {"octal-looking integer", {"--num-layers", "010"}, "", "010 is not a whole decimal"},
      {"negative size", {"--hidden-size", "-256"}, "", "-256 is negative: it must be >= 1"},
      {"negative seed", {"--seed", "-1"}, "", "-1 is negative: it must be >= 0"},
      {"negative save interval", {"--save-interval", "-5"}, "", "-5 is negative"},
      {"zero layers",
       {"--num-layers", "0"},
       "",
       "--num-layers 0 is invalid: it must be an integer >= 1"},
      {"nan learning rate",
       {"--lr", "nan"},
       "",
       "--lr nan is invalid: it must be a finite number > 0"},
      {"negative learning rate", {"--lr", "-1"}, "", "--lr -1 is invalid"},
      {"heads do not divide hidden",
       {"--hidden-size", "250"},
       "",
       "--num-attention-heads 8 does not divide --hidden-size 250"},
      {"groups do not divide heads",
       {"--num-query-groups", "3"},
       "",
       "--num-query-groups 3 does not divide --num-attention-heads 8"},
      {"global batch not a multiple",
       {"--global-batch-size", "20"},
       "",
       "--global-batch-size 20 is not a multiple of --micro-batch-size 8"},
      {"top-k above experts",
       {"--num-experts", "8", "--moe-router-topk", "9"},
       "",
       "--moe-router-topk 9 is invalid: it must be between 1 and --num-experts (8)"},
      {"unknown schedule",
       {"--schedule", "zb-h2"},
       "",
       "--schedule zb-h2 is invalid: it must be one of: gpipe, 1f1b, interleaved-1f1b"},
      {"unknown data format", {"--data-format", "csv"}, "", "--data-format csv is invalid"},
      {"unknown device",
       {"--device", "tpu"},
       "",
       "--device tpu is invalid: it must be one of: cpu, cuda"},
      {"vocab too small for bytes",
       {"--vocab-size", "100"},
       "",
       "--vocab-size 100 is too small for the built-in task"},
      {"ep does not divide experts",
       {"--num-experts", "8", "--expert-model-parallel-size", "3"},
       "",
       "--expert-model-parallel-size 3 does not divide --num-experts 8"},
      {"interleaved without chunks",
       {"--schedule", "interleaved-1f1b"},
       "",
       "needs --virtual-pipeline-model-parallel-size >= 2"},
      {"paired forwards without combined-1f1b",
       {"--pair-first-forwards", "--schedule", "1f1b"},
       "",
       "--pair-first-forwards pairs the first two forwards of combined-1f1b with one stage; it "
       "needs --schedule combined-1f1b (it is 1f1b)"},
      {"paired forwards with a pipeline",
       {"--pair-first-forwards", "--schedule", "combined-1f1b", "--pipeline-model-parallel-size",
        "2"},
       "",
       "--pipeline-model-parallel-size 1 (it is 2)"},
      {"split streams on the CPU",
       {"--comm-overlap", "split"},
       "",
       "--comm-overlap split gives each micro-batch of a pair GPU streams of its own; it needs "
       "--device cuda (it is cpu), or use on"},
      {"padding without a capacity",
       {"--moe-pad-expert-input-to-capacity"},
       "",
       "--moe-pad-expert-input-to-capacity needs an expert capacity: set "
       "--moe-expert-capacity-factor"},
      {"rebalancing experts with one expert rank",
       {"--num-experts", "8", "--rebalance-experts", "10"},
       "",
       "--rebalance-experts 10 moves experts between expert-parallel ranks; it needs "
       "--num-experts > 0 (it is 8) and --expert-model-parallel-size > 1 (it is 1), or 0 (never)"},
      {"rebalancing experts every -1 steps",
       {"--rebalance-experts", "-1"},
       "",
       "--rebalance-experts"},
      {"more chunks than layers",
       {"--pipeline-model-parallel-size", "8"},
       "",
       "--num-layers 4 is fewer than the 8 model chunks"},
      {"missing config file",
       {"--config", "@dir/missing.toml"},
       "",
       "missing.toml: cannot open the config file (No such file or directory)"},
      {"config file is a directory", {"--config", "@dir"}, "", "is a directory"},
      {"missing data path",
       {"--data-path", "@dir/nope.bin"},
       "",
       "--data-path @dir/nope.bin: cannot read it (No such file or directory)"},
      {"log-json in a missing directory",
       {"--log-json", "@dir/no/out.json"},
       "",
       "the directory @dir/no does not exist"},
      {"missing checkpoint", {"--load", "@dir/ckpt"}, "", "--load @dir/ckpt: cannot read it"},
      {"unknown config key",
       {},
       "hidden-size = 128\nnum_layer = 4\n",
       "line 2, key 'num_layer': unknown key; did you mean 'num-layers'?"},
      {"malformed TOML", {}, "num-layers = 4\nlr = = 3\n", "line 2, column"},
      {"string for an integer",
       {},
       "num-layers = \"four\"\n",
       "key 'num-layers': expected an integer >= 1, got the string \"four\""},
      {"float for an integer in the file",
       {},
       "\n\nseq-length = 12.5\n",
       "line 3, key 'seq-length': expected an integer >= 1, got the floating-point number 12.5"},
      {"negative in the file",
       {},
       "ffn-hidden-size = -512\n",
       "key 'ffn-hidden-size': value -512 is invalid: it must be an integer >= 1"},
      {"unknown schedule in the file",
       {},
       "schedule = \"fast\"\n",
       "key 'schedule': value fast is invalid: it must be one of: gpipe"},
      {"string for a float", {}, "lr = \"3e-3\"\n", "expected a finite number > 0, got the string"},
      {"table in the file", {}, "[model]\nnum-layers = 4\n", "tables are not supported"},
      {"config inside config", {}, "config = \"other.toml\"\n", "cannot be set inside"},
      {"same key twice", {}, "num-layers = 4\nnum_layers = 4\n", "is already set on line"},
      {"same key twice, also on the command line",
       {"--num-layers", "2"},
       "num-layers = 4\nnum_layers = 4\n",
       "is already set on line"},
      {"file value breaks a cross check",
       {},
       "\nglobal-batch-size = 20\n",
       "global-batch-size is set in @dir/run.toml, line 2"},
      // A wrong type in the file is an error even where the command line overrides the key.
      {"bad file value overridden",
       {"--num-layers", "2"},
       "num-layers = \"x\"\n",
       "got the string"},
  };
  for (const BadInput& c : cases) {
    TempDir dir;
    auto expand = [&](std::string s) {
      const std::string base = dir.path("");
      for (size_t at; (at = s.find("@dir/")) != std::string::npos;) s.replace(at, 5, base);
      if (s == "@dir") s = base;
      return s;
    };
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(expand(a));
    if (!c.config.empty()) {
      args.push_back("--config");
      args.push_back(dir.file("run.toml", c.config));
    }
    const std::string message = error_of(args);
    EXPECT_NE(message, "") << c.what << ": accepted";
    EXPECT_NE(message.find(expand(c.expected)), std::string::npos)
        << c.what << ": message was\n  " << message << "\nexpected to contain\n  "
        << expand(c.expected);
  }
}

}  // namespace
}  // namespace tandem::cli
