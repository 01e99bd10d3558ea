// The tier of bad input that is about limits rather than form: sizes past any machine (layers,
// experts, micro-batches, ranks), inputs that never end (/dev/zero) or are directories, a run
// whose planned memory does not fit (Note [Pre-flight memory check] in cli/preflight.cc), and
// outputs a command would leave unwritten, write silently wrong, or write with another mode
// than the umask gives.
// Oracles: bad_input.h's (exit 2, the words naming the value and what is valid, the directory as
// before), within a second and, for sizes, under a 3 GB address-space limit (ulimit -v 3000000);
// `tandem plan --json`'s planned peak for the pre-flight check's edge and for the layouts it
// proposes; the umask for the modes of what train and convert write; the files eval writes, read
// back against what it prints.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bad_input.h"
#include "common/tfevents_reader.h"
#include "tandem_process.h"

namespace tandem::test {
namespace {

// A bad size or input is refused within a second; under AddressSanitizer every allocation and
// access is checked, which slows a start-up 2-3 times, so the sanitizer build allows three.
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kAddressSpace = 0;  // AddressSanitizer's shadow needs terabytes of it
constexpr double kPromptly = 3.0;     // seconds
#else
constexpr int64_t kAddressSpace = int64_t{3000000} * 1024;  // ulimit -v 3000000
constexpr double kPromptly = 1.0;                           // seconds
#endif

const std::string kSpModel =
    std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/spm.model";

BadInput on(std::string command, BadInput c) {
  c.command = std::move(command);
  return c;
}

// kSmall with one of its options replaced (CLI11 takes each option once).
std::vector<std::string> small_with(const std::string& option, const std::string& value) {
  std::vector<std::string> args = kSmall;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == option) {
      args[i + 1] = value;
      return args;
    }
  }
  args.insert(args.end(), {option, value});
  return args;
}

std::function<void(const fs::path&)> directory(const std::string& name) {
  return [name](const fs::path& w) { fs::create_directories(w / name); };
}

// Sizes past any machine: refused by a bound or by the pre-flight check, never by running out.
std::vector<BadInput> size_cases() {
  return {
      {"1e8 layers", small_with("--num-layers", "100000000"), {"--num-layers 100000000", "16384"}},
      {"1e8 experts",
       small_with("--num-experts", "100000000"),
       {"--num-experts 100000000", "65536"}},
      {"layers x experts",
       {"--num-layers", "8192", "--num-experts", "8192", "--moe-router-topk", "2"},
       {"--num-layers 8192 x --num-experts 8192", "1048576"}},
      on("eval", {"1e8 layers", {"--num-layers", "100000000"}, {"--num-layers 100000000"}}),
      on("plan",
         {"1e9 micro-batches", {"--num-microbatches", "1000000000"}, {"1000000000", "262144"}}),
      {"a global batch of 1e9 micro-batches",
       small_with("--global-batch-size", "2000000000"),
       {"1000000000 micro-batches", "at most 262144"}},
      on("plan", {"micro-batches x nodes past a plan",
                  {"--num-microbatches", "262144", "--num-layers", "8"},
                  {"262144 micro-batches", "node runs", "4194304"}}),
      on("plan", {"a search over 2^63 ranks",
                  {"--search", "--world-size", "9223372036854775807", "--memory-limit", "80GiB"},
                  {"9223372036854775807", "at most 1048576"}}),
      {"hidden size of 2^20", small_with("--hidden-size", "1048576"), {"does not fit"}},
      {"a vocabulary of 1e9", small_with("--vocab-size", "1000000000"), {"does not fit"}},
      {"sequences of 1e8 tokens",
       {"--num-layers", "1", "--seq-length", "100000000", "--micro-batch-size", "1",
        "--global-batch-size", "2"},
       {"does not fit", "activations"}},
  };
}

// Inputs that never end, and directories where a file is expected.
std::vector<BadInput> path_cases() {
  const auto text = [](const fs::path& w) { write_text(w / "t.txt", "hello\n"); };
  return {
      {"config file /dev/zero", {"--config", "/dev/zero"}, {"--config /dev/zero", "1048576"}},
      {"config file a directory", {"--config", "d"}, {"--config d", "directory"}, directory("d")},
      {"data a directory",
       small_with("--data-path", "d"),
       {"--data-path d", "directory"},
       directory("d")},
      {"validation data a directory",
       small({"--valid-data-path", "d", "--eval-iters", "1"}),
       {"--valid-data-path d", "directory"},
       directory("d")},
      {"log a directory",
       small({"--log-json", "d"}),
       {"--log-json d", "directory"},
       directory("d")},
      {"checkpoint a file", small({"--load", "t.txt"}), {"--load t.txt", "not a directory"}, text},
      on("plan", {"schedule file /dev/zero", {"--schedule-file", "/dev/zero"}, {"/dev/zero"}}),
      on("plan", {"node times /dev/zero", {"--node-times", "/dev/zero"}, {"/dev/zero"}}),
      on("plan", {"routing /dev/zero", {"--routing", "/dev/zero"}, {"/dev/zero"}}),
      on("plan", {"measured trace /dev/zero", {"--measured-trace", "/dev/zero"}, {"/dev/zero"}}),
      on("plan",
         {"schedule file a directory", {"--schedule-file", "d"}, {"directory"}, directory("d")}),
      on("convert", {"input /dev/zero", {"/dev/zero", "out.bin"}, {"/dev/zero", "regular file"}}),
      on("convert", {"input a directory", {"d", "out.bin"}, {"directory"}, directory("d")}),
      on("convert", {"tokenizer /dev/zero",
                     {"t.txt", "out", "--tokenizer-model", "/dev/zero"},
                     {"--tokenizer-model /dev/zero", "regular file"},
                     text}),
      on("convert", {"tokenizer a directory",
                     {"t.txt", "out", "--tokenizer-model", "d"},
                     {"--tokenizer-model", "directory"},
                     [text](const fs::path& w) {
                       text(w);
                       fs::create_directories(w / "d");
                     }}),
      on("generate", {"checkpoint a file", {"--load", "t.txt"}, {"not a directory"}, text}),
      on("generate",
         {"token file a directory", {"--load", "ck", "--eval-tokens", "d"}, {"d"}, directory("d")}),
  };
}

// Input that used to be taken silently: an empty prompt, text that is not UTF-8, a memory limit
// a command does not check, outputs eval does not write.
std::vector<BadInput> silent_cases() {
  return {
      on("generate",
         {"empty prompt", {"--load", "ck", "--prompt", ""}, {"--prompt is empty", "leave"}}),
      on("convert", {"text that is not UTF-8 to sentencepiece",
                     {"t.txt", "out", "--tokenizer-model", kSpModel},
                     {"t.txt line 2", "byte offset 8", "0xff", "not UTF-8"},
                     [](const fs::path& w) {
                       write_text(w / "t.txt",
                                  "hello\nab\xff"
                                  "cd\n");
                     }}),
      on("convert", {"a truncated UTF-8 sequence to sentencepiece",
                     {"t.txt", "out", "--tokenizer-model", kSpModel},
                     {"t.txt line 1", "byte offset 3", "0xe2"},
                     [](const fs::path& w) { write_text(w / "t.txt", "abc\xe2\x82\n"); }}),
      {"memory available not a size",
       small({"--memory-available", "lots"}),
       {"--memory-available lots", "not a size"}},
      on("plan", {"memory available in plan",
                  {"--memory-available", "80GiB"},
                  {"--memory-available 80GiB", "--memory-limit"}}),
      on("eval", {"memory available in eval",
                  {"--load", "ck", "--memory-available", "80GiB"},
                  {"--memory-available 80GiB", "tandem eval checks none"}}),
      on("eval", {"eval with --save", {"--load", "ck", "--save", "out"}, {"--save out", "eval"}}),
      on("eval", {"eval with --trace", {"--load", "ck", "--trace", "t.json"}, {"--trace t.json"}}),
      on("eval", {"eval with --routing-out",
                  {"--load", "ck", "--routing-out", "r.json"},
                  {"--routing-out r.json"}}),
  };
}

class Limits : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixtures_ = new TempDir("tandem_limits_fixtures");
    TempDir capture;
    std::vector<std::string> args = {"train", "--train-iters", "1", "--save", "ck"};
    args.insert(args.end(), kSmall.begin(), kSmall.end());
    const RunResult r = run_tandem(args, fixtures_->path(), capture.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete fixtures_; }

  // Runs every case with the checkpoint `ck` beside it; each must end promptly.
  static void run_all(const std::vector<BadInput>& cases, const ChildSetup& setup = {}) {
    TempDir capture;
    for (const BadInput& c : cases) {
      const double s = run_case(
          c, capture.path(),
          [](const fs::path& w) {
            fs::copy(*fixtures_ / "ck", w / "ck", fs::copy_options::recursive);
          },
          setup);
      EXPECT_LT(s, kPromptly) << c.name;
    }
  }

  static inline TempDir* fixtures_ = nullptr;
};

TEST_F(Limits, SizesPastAnyMachineStopAtOnceUnderAnAddressSpaceLimit) {
  run_all(size_cases(), {.address_space_bytes = kAddressSpace});
}

TEST_F(Limits, InputsThatNeverEndAndDirectoriesWhereAFileIsExpected) {
  run_all(path_cases(), {.address_space_bytes = kAddressSpace});
}

TEST_F(Limits, InputOnceTakenSilently) { run_all(silent_cases()); }

// The planned peak of rank `rank` of `args` (train's options) by `tandem plan --json`.
int64_t planned_peak(const std::vector<std::string>& args, size_t rank = 0) {
  TempDir work, capture;
  std::vector<std::string> plan = {"plan", "--json"};
  plan.insert(plan.end(), args.begin(), args.end());
  const RunResult r = run_tandem(plan, work.path(), capture.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out)["ranks"].at(rank)["peak_bytes"].get<int64_t>();
}

// Note [Pre-flight memory check]: a run whose planned peak is one byte over what the rank may
// hold stops before it allocates, writing nothing, naming both figures and the peak's parts; at
// exactly its planned peak it runs.
TEST_F(Limits, PreflightRefusesARunOneByteOverItsPlannedPeak) {
  const std::vector<std::string> run = small({"--train-iters", "1"});
  const int64_t peak = planned_peak(run);
  ASSERT_GT(peak, 0);
  std::vector<std::string> over = run;
  over.insert(over.end(), {"--memory-available", std::to_string(peak - 1), "--save", "out",
                           "--log-json", "log.jsonl"});
  run_all({{"one byte over the planned peak",
            over,
            {"the run does not fit", "planned peak", std::to_string(peak) + " bytes",
             "--memory-available " + std::to_string(peak - 1), "weights", "gradients",
             "optimizer state", "activations"}}});
  TempDir work, capture;
  std::vector<std::string> exact = {"train"};
  exact.insert(exact.end(), run.begin(), run.end());
  exact.insert(exact.end(), {"--memory-available", std::to_string(peak)});
  const RunResult r = run_tandem(exact, work.path(), capture.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// The layouts the refusal proposes fit: each one's planned peaks, by `tandem plan`, are within
// the limit on every rank.
TEST_F(Limits, PreflightProposesLayoutsThatFit) {
  const std::vector<std::string> model = {
      "--num-layers",       "2",  "--hidden-size",      "32", "--num-attention-heads", "4",
      "--num-query-groups", "2",  "--ffn-hidden-size",  "64", "--num-experts",         "4",
      "--seq-length",       "64", "--micro-batch-size", "4",  "--global-batch-size",   "8"};
  const int64_t limit = planned_peak(model) / 3;
  std::vector<std::string> args = {"train", "--train-iters", "1", "--memory-available",
                                   std::to_string(limit)};
  args.insert(args.end(), model.begin(), model.end());
  TempDir work, capture;
  const RunResult r = run_tandem(args, work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 2) << r.err;
  const std::string head = "that fit, best planned tokens/s first: ";
  const size_t at = r.err.find(head);
  ASSERT_NE(at, std::string::npos) << r.err;
  const size_t ranks_at = r.err.rfind(" of ", at);
  const int64_t ranks = std::stoll(r.err.substr(ranks_at + 4));
  const std::string first =
      r.err.substr(at + head.size(), r.err.find(" (peak", at) - at - head.size());
  // The model's options with the layout's over them: "--option value" pairs and flags.
  std::map<std::string, std::string> options;
  for (size_t i = 0; i + 1 < model.size(); i += 2) options[model[i]] = model[i + 1];
  std::vector<std::string> words;
  std::istringstream in(first);
  for (std::string w; in >> w;) words.push_back(w);
  for (size_t i = 0; i < words.size(); ++i) {
    const bool valued = i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0;
    options[words[i]] = valued ? words[i + 1] : "";
    if (valued) ++i;
  }
  const int64_t pp = std::stoll(options.count("--pipeline-model-parallel-size")
                                    ? options["--pipeline-model-parallel-size"]
                                    : "1");
  options["--data-parallel-size"] = std::to_string(ranks / pp);
  std::vector<std::string> plan;
  for (const auto& [option, value] : options) {
    plan.push_back(option);
    if (!value.empty()) plan.push_back(value);
  }
  for (int64_t rank = 0; rank < pp; ++rank) {
    EXPECT_LE(planned_peak(plan, static_cast<size_t>(rank)), limit) << first << "\n" << r.err;
  }
}

// Under `ulimit -v` the limit left is what a rank may hold, and the refusal names it.
TEST_F(Limits, PreflightNamesTheAddressSpaceLimit) {
  if (kAddressSpace == 0) GTEST_SKIP() << "AddressSanitizer needs the address space";
  run_all({{"a model of more than 3 GB under ulimit -v 3000000",
            small_with("--hidden-size", "16384"),
            {"the run does not fit", "address-space limit (ulimit -v)"}}},
          {.address_space_bytes = kAddressSpace});
}

// Checkpoints, logs and converted data are created as open(2) creates a file under the umask.
TEST_F(Limits, OutputsHonourTheUmask) {
  for (const int mask : {022, 077}) {
    SCOPED_TRACE(mask);
    TempDir work, capture;
    std::vector<std::string> args = {"train", "--train-iters", "1",        "--save",
                                     "ck",    "--log-json",    "log.jsonl"};
    args.insert(args.end(), kSmall.begin(), kSmall.end());
    ASSERT_EQ(run_tandem(args, work.path(), capture.path(), {}, {.umask = mask}).exit_code, 0);
    write_text(work.path() / "t.txt", "some text\n");
    ASSERT_EQ(
        run_tandem({"convert", "t.txt", "t.bin"}, work.path(), capture.path(), {}, {.umask = mask})
            .exit_code,
        0);
    const auto mode = [&](const std::string& name) {
      struct stat st {};
      EXPECT_EQ(::stat((work.path() / name).c_str(), &st), 0) << name;
      return st.st_mode & 0777;
    };
    const unsigned file = 0666 & ~static_cast<unsigned>(mask);
    const unsigned dir = 0777 & ~static_cast<unsigned>(mask);
    for (const char* name :
         {"ck/iter_0000001/model.safetensors", "ck/iter_0000001/config.json",
          "ck/iter_0000001/trainer_state.json", "ck/latest", "log.jsonl", "t.bin"}) {
      EXPECT_EQ(mode(name), file) << name;
    }
    EXPECT_EQ(mode("ck/iter_0000001"), dir);
    EXPECT_EQ(mode("ck"), dir);
  }
}

// Note [What eval writes]: --log-json holds the loss it prints, --tensorboard-dir the same at
// the checkpoint's iteration.
TEST_F(Limits, EvalWritesItsResults) {
  TempDir work, capture;
  fs::copy(*fixtures_ / "ck", work.path() / "ck", fs::copy_options::recursive);
  const RunResult r = run_tandem({"eval", "--load", "ck", "--eval-iters", "2", "--log-json",
                                  "eval.jsonl", "--tensorboard-dir", "tb"},
                                 work.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("valid loss: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double printed = std::stod(r.out.substr(at + 12));
  const nlohmann::json j = nlohmann::json::parse(slurp(work.path() / "eval.jsonl"));
  EXPECT_EQ(j["iter"], 1);
  EXPECT_EQ(j["valid_loss"].get<double>(), printed);
  EXPECT_EQ(j["batches"], 2);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(work.path() / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  bool seen = false;
  for (const testing::TfEvent& e : testing::read_tf_events(files[0].string())) {
    for (const testing::TfScalar& v : e.scalars) {
      if (v.tag != "valid/loss") continue;
      seen = true;
      EXPECT_EQ(e.step, 1);
      EXPECT_EQ(*v.value, static_cast<float>(printed));
    }
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace tandem::test
