// Bad input to every command (generate, eval, plan, convert, train), by class: numbers that pass
// the type check and are still wrong (nan, inf, negative), outputs that are inputs or each
// other (also through a symbolic or hard link), and input that used to be found only after
// something was written (a bad token id late in a data file, a bad measured trace after plan's
// first output, a bad JSON record at the end of convert's input).
// Oracle (tests/cli/bad_input.h): exit code 2, the words naming the value and what is valid, and
// the working directory exactly as before.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bad_input.h"
#include "tandem_process.h"

namespace tandem::test {
namespace {

const std::string kSpModel =
    std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/spm.model";

BadInput on(std::string command, BadInput c) {
  c.command = std::move(command);
  return c;
}

std::function<void(const fs::path&)> file(const std::string& name, const std::string& bytes) {
  return [name, bytes](const fs::path& w) { write_text(w / name, bytes); };
}

// Floating-point options of every command: nan, inf, and negatives where a value must be > 0 or
// >= 0. CLI11's PositiveNumber and NonNegativeNumber let nan and inf through.
std::vector<BadInput> number_cases() {
  return {
      on("generate",
         {"temperature nan", {"--load", "ck", "--temperature", "nan"}, {"nan", ">= 0"}}),
      on("generate",
         {"temperature inf", {"--load", "ck", "--temperature", "inf"}, {"inf", "finite"}}),
      on("generate", {"temperature < 0", {"--load", "ck", "--temperature", "-1"}, {"-1", ">= 0"}}),
      on("generate", {"negative seed", {"--load", "ck", "--seed", "-1"}, {"-1", "negative"}}),
      on("generate",
         {"octal-looking count", {"--load", "ck", "--show", "010"}, {"010", "decimal"}}),
      on("plan", {"matrix rate nan", {"--matrix-flops", "nan"}, {"nan", "finite number > 0"}}),
      on("plan", {"bandwidth inf", {"--memory-bandwidth", "inf"}, {"inf", "finite"}}),
      on("plan", {"link bandwidth < 0", {"--link-bandwidth", "-5"}, {"-5", "> 0"}}),
      on("plan", {"latency nan", {"--link-latency", "nan"}, {"nan", ">= 0"}}),
      on("plan", {"memory limit past 2^63", {"--memory-limit", "1e300"}, {"1e300", "below 9e18"}}),
      on("plan",
         {"data-parallel size as hex", {"--data-parallel-size", "0x2"}, {"0x2", "decimal"}}),
      on("plan", {"data-parallel size 0",
                  {"--data-parallel-size", "0"},
                  {"0", "an integer >= 1 and <= 1073741824"}}),
      on("eval",
         {"timeout nan", {"--load", "ck", "--comm-timeout", "nan"}, {"--comm-timeout nan"}}),
      {"timeout inf", {"--comm-timeout", "inf"}, {"--comm-timeout inf", "finite"}},
      {"learning rate nan", {"--lr", "nan"}, {"--lr nan", "finite"}},
      on("convert",
         {"negative eod id",
          {"t.txt", "out", "--tokenizer-model", kSpModel, "--append-eod", "--eod-id", "-1"},
          {"-1", "negative"},
          file("t.txt", "hello\n")}),
  };
}

// Note [Outputs that are inputs], for every command.
std::vector<BadInput> output_cases() {
  const auto text = file("a.txt", "some text\n");
  return {
      on("convert", {"output is the input", {"a.txt", "a.txt"}, {"output a.txt", "input"}, text}),
      on("convert", {"output is a symbolic link to the input",
                     {"a.txt", "link.txt"},
                     {"output link.txt", "is the file input reads"},
                     [](const fs::path& w) {
                       write_text(w / "a.txt", "some text\n");
                       fs::create_symlink("a.txt", w / "link.txt");
                     }}),
      on("convert", {"output is a hard link to the input",
                     {"a.txt", "hard.txt"},
                     {"output hard.txt", "is the file input reads"},
                     [](const fs::path& w) {
                       write_text(w / "a.txt", "some text\n");
                       fs::create_hard_link(w / "a.txt", w / "hard.txt");
                     }}),
      on("convert", {"Megatron output onto the input",
                     {"d.bin", "d", "--tokenizer-model", kSpModel},
                     {"output d.bin", "is the file input reads"},
                     file("d.bin", "text\n")}),
      on("convert", {"Megatron output onto the tokenizer",
                     {"a.txt", "tok", "--tokenizer-model", "tok.idx"},
                     {"output tok.idx", "--tokenizer-model reads"},
                     [](const fs::path& w) {
                       write_text(w / "a.txt", "x\n");
                       fs::copy_file(kSpModel, w / "tok.idx");
                     }}),
      on("convert", {"output in a missing directory",
                     {"a.txt", "nodir/out.bin"},
                     {"output nodir/out.bin", "does not exist"},
                     text}),
      on("convert", {"output is a directory",
                     {"a.txt", "d"},
                     {"output d", "is a directory"},
                     [](const fs::path& w) {
                       write_text(w / "a.txt", "x\n");
                       fs::create_directories(w / "d");
                     }}),
      on("plan", {"svg onto the schedule file",
                  {"--schedule-file", "s.txt", "--svg", "s.txt"},
                  {"--svg s.txt", "--schedule-file reads"},
                  file("s.txt", "rank 0: 0F0 0B0\n")}),
      on("plan", {"trace onto the measured trace",
                  {"--measured-trace", "m.json", "--trace", "./m.json"},
                  {"--trace ./m.json", "--measured-trace reads"},
                  file("m.json", "{\"traceEvents\": []}")}),
      on("plan", {"two outputs onto one file",
                  {"--write-schedule", "out.txt", "--svg", "out.txt"},
                  {"--write-schedule out.txt and --svg out.txt name the same file"}}),
      on("plan", {"the second output's directory missing",
                  {"--write-schedule", "s.txt", "--svg", "nodir/plan.svg"},
                  {"--svg nodir/plan.svg", "does not exist"}}),
      {"log onto the validation data",
       small({"--valid-data-path", "v.txt", "--eval-iters", "1", "--log-json", "v.txt"}),
       {"--log-json v.txt", "--valid-data-path reads"},
       file("v.txt", std::string(4096, 'a'))},
  };
}

// A model of 100 tokens in ck100/ (for --prompt, which feeds bytes as tokens).
void small_vocab_model(const fs::path& w) {
  TempDir capture;
  std::vector<std::string> args = small(
      {"--vocab-size", "100", "--mock-data", "--train-iters", "1", "--save", "ck100", "--quiet"});
  args.insert(args.begin(), "train");
  ASSERT_EQ(run_tandem(args, w, capture.path()).exit_code, 0);
}

// Input checked before anything is written, wherever the bad part lies.
std::vector<BadInput> late_cases() {
  std::vector<int> tokens(6000, 7);
  tokens.back() = 300;  // past the default vocabulary of 256, in the last token
  return {
      {"a bad token id at the end of the data",
       small({"--data-path", "t.bin", "--train-iters", "2", "--save", "ck", "--log-json",
              "log.jsonl", "--save-interval", "1"}),
       {"t.bin", "token 5999", "has id 300", "--vocab-size"},
       file("t.bin", llmc(20240520, 1, 6000, tokens))},
      on("generate", {"a prompt byte past the model's vocabulary",
                      {"--load", "ck100", "--prompt", "zz"},
                      {"--prompt", "byte 122", "vocab size 100"},
                      small_vocab_model}),
      on("plan", {"a bad measured trace after plan's first output",
                  {"--write-schedule", "s.txt", "--measured-trace", "m.json"},
                  {"m.json"},
                  file("m.json", "{\"no\": 1}")}),
      on("convert",
         {"a bad JSON record at the end",
          {"docs.jsonl", "out", "--tokenizer-model", kSpModel},
          {"docs.jsonl line 3", "text"},
          file("docs.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"txt\": 3}\n")}),
      on("convert", {"a bad id late in an ids file",
                     {"ids.txt", "out"},
                     {"ids.txt line 3", "'900'", "[0, 500)"},
                     file("ids.txt", "tandem-ids vocab_size=500 eod_id=1\n4 5 6\n7 900\n")}),
  };
}

// `tandem convert`'s own combinations and tokenizer files.
std::vector<BadInput> convert_cases() {
  const auto text = file("a.txt", "some text\n");
  return {
      on("convert", {"end of document without a tokenizer",
                     {"a.txt", "out", "--append-eod"},
                     {"--append-eod", "--tokenizer-model"},
                     text}),
      on("convert", {"json keys of a text file",
                     {"a.txt", "out", "--tokenizer-model", kSpModel, "--json-keys", "body"},
                     {"--json-keys body", "not a .json or .jsonl file"},
                     text}),
      on("convert", {"eod id without --append-eod",
                     {"a.txt", "out", "--tokenizer-model", kSpModel, "--eod-id", "3"},
                     {"--eod-id 3", "--append-eod"},
                     text}),
      on("convert",
         {"eod id past the vocabulary",
          {"a.txt", "out", "--tokenizer-model", kSpModel, "--append-eod", "--eod-id", "5000"},
          {"--eod-id 5000", "[0, 1000)"},
          text}),
      on("convert", {"not a sentencepiece model",
                     {"a.txt", "out", "--tokenizer-model", "bad.model"},
                     {"--tokenizer-model bad.model", "not a sentencepiece model"},
                     [](const fs::path& w) {
                       write_text(w / "a.txt", "x\n");
                       write_text(w / "bad.model", "not a model");
                     }}),
      // Without Python's tokenizers (this machine) the script fails on the import; with it, on
      // the file: either way the message says what to run.
      on("convert", {"not a tokenizer.json",
                     {"a.txt", "out", "--tokenizer-model", "tokenizer.json"},
                     {"hf_tokenize.py", "tandem convert IDS out"},
                     [](const fs::path& w) {
                       write_text(w / "a.txt", "x\n");
                       write_text(w / "tokenizer.json", "{}");
                     }}),
  };
}

TEST(BadInputsOfEveryCommand, RefusedWithNothingWritten) {
  EXPECT_GE(run_cases({number_cases(), output_cases(), late_cases(), convert_cases()}), 35);
}

}  // namespace
}  // namespace tandem::test
