// Validation and TensorBoard in the tandem program, one process. Oracles: the same run without
// validation (a run that validates trains bit for bit as one that does not); `tandem eval
// --load` of the saved step, which must print the loss the run logged for that step, to the
// bit; exp of the loss for the perplexity; and the event files read back by
// tests/common/tfevents_reader.h (its own CRC and protobuf decoding) against the JSON log.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/tfevents_reader.h"
#include "dist/mpi_process.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

const std::string kModel =
    " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2"
    " --ffn-hidden-size 48 --num-experts 4 --seq-length 32 --micro-batch-size 2"
    " --global-batch-size 4 --addition-max-digits 2";

Result tandem(const std::string& args) { return run(std::string(TANDEM_BIN) + " " + args); }

std::vector<double> values(const std::string& log, const char* key) {
  std::vector<double> out;
  for (const auto& j : json_lines(log)) out.push_back(j.at(key).get<double>());
  return out;
}

// The iterations and values of `key` in the lines that have it.
std::map<int64_t, double> present(const std::string& log, const char* key) {
  std::map<int64_t, double> out;
  for (const auto& j : json_lines(log)) {
    if (j.contains(key)) out[j.at("iter").get<int64_t>()] = j.at(key).get<double>();
  }
  return out;
}

// What `tandem eval` printed as "valid loss: X".
double printed_loss(const std::string& output) {
  const size_t at = output.find("valid loss: ");
  EXPECT_NE(at, std::string::npos) << output;
  return at == std::string::npos ? NAN : std::stod(output.substr(at + 12));
}

TEST(ValidationCli, TheTaskValidatesOnHeldOutProblemsAndTrainsAsWithout) {
  const std::string dir = temp_dir("validation_task");
  const Result plain =
      tandem("train" + kModel + " --train-iters 5 --quiet --log-json " + dir + "/plain.jsonl");
  ASSERT_EQ(plain.code, 0) << plain.output;
  const Result r = tandem("train" + kModel + " --train-iters 5 --eval-interval 2 --eval-iters 2" +
                          " --log-json " + dir + "/valid.jsonl --tensorboard-dir " + dir +
                          "/tb --save " + dir + "/ck");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(values(dir + "/valid.jsonl", "loss"), values(dir + "/plain.jsonl", "loss"));
  EXPECT_EQ(values(dir + "/valid.jsonl", "grad_norm"), values(dir + "/plain.jsonl", "grad_norm"));
  // Every 2 steps and after the last.
  const std::map<int64_t, double> valid = present(dir + "/valid.jsonl", "valid_loss");
  ASSERT_EQ(valid.size(), 3u);
  EXPECT_EQ(valid.count(2) + valid.count(4) + valid.count(5), 3u);
  for (const auto& [iter, ppl] : present(dir + "/valid.jsonl", "valid_ppl")) {
    EXPECT_DOUBLE_EQ(ppl, std::exp(valid.at(iter))) << "iter " << iter;
  }
  for (const auto& [iter, loss] : valid) EXPECT_TRUE(loss > 0 && loss < 10) << loss;
  // Said before the first step; a log line at each validation (--log-interval is 10).
  EXPECT_NE(r.output.find("validation on the held-out problems of the addition task"),
            std::string::npos)
      << r.output;
  for (const char* line : {"iter 2/5 |", "iter 4/5 |", "iter 5/5 |"}) {
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << r.output;
    EXPECT_NE(r.output.substr(at, r.output.find('\n', at) - at).find("| valid loss "),
              std::string::npos)
        << r.output;
  }
  EXPECT_EQ(r.output.find("iter 3/5 |"), std::string::npos) << r.output;

  // The saved step, evaluated alone: the loss the run logged, to the bit.
  const Result e = tandem("eval --load " + dir + "/ck --eval-iters 2");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(printed_loss(e.output), valid.at(5)) << e.output;
  EXPECT_NE(e.output.find("valid ppl: "), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("at iteration 5"), std::string::npos) << e.output;

  // TensorBoard: one event file with every step's scalars and each validation's.
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir + "/tb")) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::vector<testing::TfEvent> events = testing::read_tf_events(files[0].string());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  std::map<std::string, std::map<int64_t, float>> by_tag;
  for (size_t i = 1; i < events.size(); ++i) {
    for (const testing::TfScalar& s : events[i].scalars) {
      ASSERT_TRUE(s.value.has_value()) << s.tag;
      by_tag[s.tag][events[i].step] = *s.value;
    }
  }
  for (const char* tag :
       {"train/loss", "train/lm_loss", "train/aux_loss", "train/lr", "train/grad_norm",
        "train/tokens_per_s", "memory/in_use_bytes", "memory/peak_bytes"}) {
    EXPECT_EQ(by_tag[tag].size(), 5u) << tag;
  }
  const std::vector<double> losses = values(dir + "/valid.jsonl", "loss");
  for (int64_t it = 1; it <= 5; ++it) {
    EXPECT_EQ(by_tag["train/loss"][it], static_cast<float>(losses[it - 1])) << it;
  }
  ASSERT_EQ(by_tag["valid/loss"].size(), 3u);
  for (const auto& [iter, loss] : valid) {
    EXPECT_EQ(by_tag["valid/loss"][iter], static_cast<float>(loss)) << iter;
    EXPECT_EQ(by_tag["valid/ppl"][iter], static_cast<float>(std::exp(loss))) << iter;
  }
}

// A data file: --split holds its validation part out; `tandem eval` takes the same --split, or
// the whole file, or a file of its own.
TEST(ValidationCli, ADataFileValidatesOnItsSplitPart) {
  const std::string dir = temp_dir("validation_split");
  std::string text;
  for (int i = 0; text.size() < 20000; ++i) text += std::to_string(i * 7919 % 1000) + " + 1;\n";
  std::ofstream(dir + "/t.txt") << text;
  std::ofstream(dir + "/v.txt") << text.substr(0, 3000);
  const std::string data = " --data-path " + dir + "/t.txt";
  const Result r =
      tandem("train" + kModel + data + " --split 90,10,0 --train-iters 3 " +
             "--eval-iters 2 --quiet --log-json " + dir + "/log.jsonl --save " + dir + "/ck");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::map<int64_t, double> valid = present(dir + "/log.jsonl", "valid_loss");
  ASSERT_EQ(valid.size(), 1u);  // --eval-interval is 1000: only after the last step
  const Result same =
      tandem("eval --load " + dir + "/ck" + data + " --split 90,10,0 " + "--eval-iters 2");
  ASSERT_EQ(same.code, 0) << same.output;
  EXPECT_EQ(printed_loss(same.output), valid.at(3)) << same.output;
  EXPECT_NE(same.output.find("validation part of --split 90,10,0"), std::string::npos)
      << same.output;
  const Result whole = tandem("eval --load " + dir + "/ck" + data + " --eval-iters 2 --quiet");
  ASSERT_EQ(whole.code, 0) << whole.output;
  EXPECT_TRUE(std::isfinite(printed_loss(whole.output)));
  EXPECT_EQ(whole.output.find("tandem eval:"), std::string::npos) << "--quiet: the loss only";
  const Result own =
      tandem("train" + kModel + " --train-data-path " + dir + "/t.txt --valid-data-path " + dir +
             "/v.txt --train-iters 2 --eval-iters 1 --quiet --log-json " + dir + "/own.jsonl");
  ASSERT_EQ(own.code, 0) << own.output;
  EXPECT_EQ(present(dir + "/own.jsonl", "valid_loss").size(), 1u);
  // Mock data validates on random tokens of another stream: about log(vocab) untrained.
  const Result mock = tandem("train" + kModel + " --mock-data --train-iters 1 --eval-iters 1 " +
                             "--quiet --log-json " + dir + "/mock.jsonl");
  ASSERT_EQ(mock.code, 0) << mock.output;
  const std::map<int64_t, double> mock_valid = present(dir + "/mock.jsonl", "valid_loss");
  ASSERT_EQ(mock_valid.size(), 1u);
  EXPECT_NEAR(mock_valid.at(1), std::log(256.0), 0.5);
}

// The test data is evaluated once after the last step (Megatron's order), as a validation is:
// the --test-data-path's loss equals what `tandem eval` prints for that file as validation data,
// to the bit. A blend under --split tests on each file's test part.
TEST(ValidationCli, TheTestPartIsEvaluatedAfterTraining) {
  const std::string dir = temp_dir("validation_test");
  std::string text;
  for (int i = 0; text.size() < 20000; ++i) text += std::to_string(i * 7919 % 1000) + " + 1;\n";
  std::ofstream(dir + "/t.txt") << text;
  std::ofstream(dir + "/u.txt") << text.substr(5000);
  std::ofstream(dir + "/v.txt") << text.substr(0, 3000);
  std::ofstream(dir + "/s.txt") << text.substr(3000, 4000);
  const Result r = tandem("train" + kModel + " --train-data-path " + dir + "/t.txt" +
                          " --valid-data-path " + dir + "/v.txt --test-data-path " + dir +
                          "/s.txt --train-iters 3 --eval-iters 2 --log-json " + dir +
                          "/log.jsonl --save " + dir + "/ck");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("iter 3 | test loss "), std::string::npos) << r.output;
  const std::map<int64_t, double> test = present(dir + "/log.jsonl", "test_loss");
  ASSERT_EQ(test.size(), 1u);
  const Result same = tandem("eval --load " + dir + "/ck --valid-data-path " + dir +
                             "/s.txt --eval-iters 2 --quiet");
  ASSERT_EQ(same.code, 0) << same.output;
  EXPECT_EQ(printed_loss(same.output), test.at(3));
  EXPECT_EQ(present(dir + "/log.jsonl", "test_ppl").at(3), std::exp(test.at(3)));
  // A blend of two files under a --split with a test weight, the quotes of a launch script kept.
  const Result blend = tandem("train" + kModel + " --data-path 0.3 " + dir + "/t.txt 0.7 " + dir +
                              "/u.txt --split \"'90,5,5'\" --train-iters 2 --eval-iters 1 " +
                              "--log-json " + dir + "/blend.jsonl");
  ASSERT_EQ(blend.code, 0) << blend.output;
  EXPECT_NE(blend.output.find("test on a blend of 0.3 x test part"), std::string::npos)
      << blend.output;
  EXPECT_EQ(present(dir + "/blend.jsonl", "test_loss").size(), 1u);
  EXPECT_EQ(present(dir + "/blend.jsonl", "valid_loss").size(), 1u);
  // Without a test weight there is no test.
  const Result none = tandem("train" + kModel + " --data-path " + dir +
                             "/t.txt --split 90,10,0 --train-iters 1 --eval-iters 1 --log-json " +
                             dir + "/none.jsonl");
  ASSERT_EQ(none.code, 0) << none.output;
  EXPECT_TRUE(present(dir + "/none.jsonl", "test_loss").empty());
}

}  // namespace
}  // namespace tandem::test
