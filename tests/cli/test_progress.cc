// Progress reporter. Oracle: the JSON lines parsed back with nlohmann::json must equal the
// records written; formats are compared with hand-written strings; event files are read back by
// tests/common/tfevents_reader.h.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/progress.h"
#include "common/tfevents_reader.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_progress_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

IterationRecord record(int64_t iter, std::vector<int64_t> peaks) {
  IterationRecord r;
  r.iter = iter;
  r.lm_loss = 2.5 - 0.1 * static_cast<double>(iter);
  r.aux_loss = 0.01;
  r.loss = r.lm_loss + r.aux_loss;
  r.lr = 3e-3;
  r.grad_norm = 0.75;
  r.step_seconds = 0.5;
  r.tokens_per_s = 4096;
  r.mem_in_use_bytes = std::vector<int64_t>(peaks.size(), int64_t{1} << 20);
  r.mem_peak_bytes = peaks;
  r.activation_peak_bytes = std::vector<int64_t>(peaks.size(), 4096);
  return r;
}

TEST(Progress, JsonLinesParseBack) {
  TempDir dir;
  const std::string path = dir.path("log.jsonl");
  std::ostringstream log, bar;
  ProgressReporter reporter({.total_iters = 3,
                             .log_interval = 1,
                             .log_json_path = path,
                             .verbosity = Verbosity::kQuiet,
                             .bar = BarMode::kNever},
                            log, bar);
  EXPECT_FALSE(fs::exists(path)) << "the file must not exist before open()";
  reporter.open();
  reporter.report(record(1, {1000}));
  IterationRecord nan_record = record(2, {1000, 2000, 3000});
  nan_record.loss = std::nan("");
  reporter.report(nan_record);
  // Flushed per line: readable while the reporter is still open.
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  for (const char* key : {"iter", "loss", "lm_loss", "aux_loss", "lr", "tokens_per_s",
                          "mem_peak_bytes", "activation_peak_bytes", "mem_in_use_bytes"}) {
    EXPECT_TRUE(lines[0].contains(key)) << key;
  }
  EXPECT_EQ(lines[0]["iter"], 1);
  EXPECT_DOUBLE_EQ(lines[0]["lm_loss"].get<double>(), 2.4);
  EXPECT_DOUBLE_EQ(lines[0]["lr"].get<double>(), 3e-3);
  EXPECT_EQ(lines[0]["mem_peak_bytes"], 1000);  // one rank: a number
  EXPECT_EQ(lines[0]["activation_peak_bytes"], 4096);
  EXPECT_EQ(lines[1]["mem_peak_bytes"], nlohmann::json({1000, 2000, 3000}));  // ranks: a list
  EXPECT_TRUE(lines[1]["loss"].is_null());                                    // NaN: null
  EXPECT_EQ(log.str(), "") << "quiet prints no log lines";
}

TEST(Progress, NoJsonFileWithoutOpenOrPath) {
  TempDir dir;
  std::ostringstream log, bar;
  ProgressReporter reporter({.total_iters = 2, .bar = BarMode::kNever}, log, bar);
  reporter.open();  // no path: a no-op
  reporter.report(record(1, {1}));
  EXPECT_TRUE(fs::is_empty(dir.path("")));
}

TEST(Progress, OpenNamesPathAndReason) {
  TempDir dir;
  const std::string path = dir.path("missing/log.jsonl");
  ProgressReporter reporter({.log_json_path = path, .bar = BarMode::kNever});
  try {
    reporter.open();
    FAIL() << "open() succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
}

TEST(Progress, LogLinesOnIntervalAndLastStep) {
  std::ostringstream log, bar;
  ProgressReporter reporter({.total_iters = 5, .log_interval = 2, .bar = BarMode::kNever}, log,
                            bar);
  for (int64_t i = 1; i <= 5; ++i) reporter.report(record(i, {2 << 20}));
  std::istringstream lines(log.str());
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) got.push_back(line);
  ASSERT_EQ(got.size(), 3u) << log.str();
  EXPECT_EQ(got[0].rfind("iter 2/5 | loss 2.3100 | lm loss 2.3000 | aux loss 0.0100", 0), 0u)
      << got[0];
  EXPECT_NE(got[0].find("lr 3.00e-03"), std::string::npos) << got[0];
  EXPECT_NE(got[0].find("4.1k tok/s"), std::string::npos) << got[0];
  EXPECT_NE(got[0].find("mem 1.0 MiB, peak 2.0 MiB"), std::string::npos) << got[0];
  EXPECT_EQ(got[2].rfind("iter 5/5", 0), 0u);
  EXPECT_EQ(bar.str(), "") << "no bar when it is off";
}

TEST(Progress, BarRedrawsInPlace) {
  std::ostringstream log, bar;
  ProgressReporter reporter({.total_iters = 4, .log_interval = 100, .bar = BarMode::kAlways}, log,
                            bar);
  ASSERT_TRUE(reporter.bar_enabled());
  reporter.report(record(1, {1}));
  reporter.report(record(4, {1}));
  reporter.finish();
  const std::string out = bar.str();
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line, ended by finish()";
  EXPECT_NE(out.find("\r"), std::string::npos);
  EXPECT_NE(out.find("1/4  25%"), std::string::npos) << out;
  EXPECT_NE(out.find("4/4 100%"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
}

TEST(Progress, QuietHasNoBar) {
  ProgressReporter reporter({.verbosity = Verbosity::kQuiet, .bar = BarMode::kAlways});
  EXPECT_FALSE(reporter.bar_enabled());
}

TEST(Progress, Formats) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(int64_t{12897485}), "12.3 MiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(7380), "2h03m");
  EXPECT_EQ(format_duration(-1), "--");
  IterationRecord r = record(3, {1, 2});
  EXPECT_NE(format_log_line(r, 10).find("(max of 2 ranks)"), std::string::npos);
}

// Runs with an all-to-all: each rank's exposed fraction, its ms and the waiting part; the worst
// rank beyond 4 ranks; nothing without an all-to-all.
TEST(Progress, LogLineShowsTheExposedAllToAll) {
  IterationRecord r = record(1, {1, 1});
  r.comm_seconds_by_rank = {0.0538, 0.0569};
  r.exposed_comm_seconds_by_rank = {0.0050, 0.0061};
  r.exposed_waiting_seconds_by_rank = {0.0015, 0.0023};
  EXPECT_NE(format_log_line(r, 2).find(
                " | a2a exposed 9.3% (5.0/53.8 ms, 1.5 waiting), 10.7% (6.1/56.9 ms, 2.3 waiting)"),
            std::string::npos)
      << format_log_line(r, 2);
  r.exposed_waiting_seconds_by_rank.clear();  // not measured (CPU ranks)
  EXPECT_NE(format_log_line(r, 2).find("a2a exposed 9.3% (5.0/53.8 ms), 10.7% (6.1/56.9 ms)"),
            std::string::npos)
      << format_log_line(r, 2);
  r.comm_seconds_by_rank = {0.01, 0.01, 0.01, 0.01, 0.02, 0.01};
  r.exposed_comm_seconds_by_rank = {0.001, 0.001, 0.003, 0.001, 0.004, 0.0};
  EXPECT_NE(format_log_line(r, 2).find("a2a exposed max 30.0% (3.0/10.0 ms) on rank 2"),
            std::string::npos)
      << format_log_line(r, 2);
  r.comm_seconds_by_rank = {0.0, 0.0};  // pipeline only: no all-to-all
  EXPECT_EQ(format_log_line(r, 2).find("a2a"), std::string::npos) << format_log_line(r, 2);
}

// The run's last line: the first step (warm-up) is left out of the median and the all-to-all
// shares, the peak is over every step and rank; quiet prints nothing.
TEST(Progress, SummaryLeavesTheFirstStepOut) {
  std::vector<IterationRecord> steps;
  for (int64_t i = 1; i <= 4; ++i) {
    IterationRecord r = record(i, {int64_t{1} << 20, int64_t{3} << 20});
    r.tokens_per_s = i == 1 ? 100.0 : 1000.0 * static_cast<double>(i);  // 2k, 3k, 4k after
    r.step_seconds = 10;
    r.comm_seconds_by_rank = {0.1, 0.2};
    r.exposed_comm_seconds_by_rank = {i == 1 ? 0.1 : 0.01, 0.02};
    steps.push_back(r);
  }
  EXPECT_EQ(
      format_summary(steps),
      "done: 4 steps in 40.0s | 3.0k tok/s (median of steps 2-4) | peak 3.0 MiB | a2a exposed "
      "10.0%, 10.0% (steps 2-4)");
  // A planned run: the plan beside the peak, and the later steps' own peak where the first
  // step's was higher.
  std::vector<IterationRecord> planned = steps;
  for (IterationRecord& r : planned) r.planned_peak_bytes = {int64_t{2} << 20, int64_t{5} << 19};
  EXPECT_NE(format_summary(planned).find("| peak 3.0 MiB (planned 2.5 MiB) |"), std::string::npos)
      << format_summary(planned);
  // Each rank's last peak its planned one: said so.
  std::vector<IterationRecord> exact = planned;
  exact.back().planned_peak_bytes = exact.back().mem_peak_bytes;
  EXPECT_NE(format_summary(exact).find("| peak 3.0 MiB (planned 3.0 MiB, the same to the byte) |"),
            std::string::npos)
      << format_summary(exact);
  exact.back().planned_peak_bytes[0] -= 1;
  EXPECT_NE(format_summary(exact).find("| peak 3.0 MiB (planned 3.0 MiB) |"), std::string::npos)
      << format_summary(exact);
  planned[0].mem_peak_bytes = {int64_t{4} << 20};
  EXPECT_NE(format_summary(planned).find("| peak 4.0 MiB (steps 2-4: 3.0 MiB, planned 2.5 MiB) |"),
            std::string::npos)
      << format_summary(planned);
  steps.resize(1);
  steps[0].comm_seconds_by_rank.clear();
  EXPECT_EQ(format_summary(steps),
            "done: 1 step in 10.0s | 100 tok/s (median of step 1) | peak 3.0 MiB");
  EXPECT_EQ(format_summary({}), "");
  std::ostringstream log, bar;
  ProgressReporter quiet({.total_iters = 1, .verbosity = Verbosity::kQuiet, .bar = BarMode::kNever},
                         log, bar);
  quiet.report(steps[0]);
  quiet.print_summary();
  EXPECT_EQ(log.str(), "");
  ProgressReporter loud({.total_iters = 1, .bar = BarMode::kNever}, log, bar);
  loud.report(steps[0]);
  loud.print_summary();
  EXPECT_NE(log.str().find("tandem train: done: 1 step"), std::string::npos) << log.str();
}

// --nan-policy skip: a skipped step says so in the log line and in the JSON; others do not.
TEST(Progress, SkippedStepIsFlagged) {
  IterationRecord applied = record(1, {1});
  IterationRecord skipped = record(2, {1});
  skipped.status = UpdateStatus::kSkipped;
  EXPECT_EQ(nlohmann::json::parse(to_json_line(applied))["skipped"], false);
  EXPECT_EQ(nlohmann::json::parse(to_json_line(skipped))["skipped"], true);
  EXPECT_EQ(format_log_line(applied, 2).find("skipped"), std::string::npos);
  EXPECT_NE(format_log_line(skipped, 2).find("skipped"), std::string::npos);
}

}  // namespace
}  // namespace tandem::cli

namespace tandem::cli {
namespace {

// A validation's loss: in the log line (printed at that step even off the interval), in the JSON
// line with its perplexity, exp of it; steps without one have neither.
TEST(Progress, ValidationLossInTheLogLineAndTheJson) {
  IterationRecord r = record(3, {1});
  EXPECT_EQ(format_log_line(r, 10).find("valid"), std::string::npos);
  EXPECT_FALSE(nlohmann::json::parse(to_json_line(r)).contains("valid_loss"));
  r.valid_loss = 1.5;
  EXPECT_NE(format_log_line(r, 10).find(" | valid loss 1.5000 | valid ppl 4.482"),
            std::string::npos)
      << format_log_line(r, 10);
  const nlohmann::json j = nlohmann::json::parse(to_json_line(r));
  EXPECT_EQ(j["valid_loss"].get<double>(), 1.5);
  EXPECT_EQ(j["valid_ppl"].get<double>(), std::exp(1.5));
  std::ostringstream log, bar;
  ProgressReporter reporter({.total_iters = 10, .log_interval = 5, .bar = BarMode::kNever}, log,
                            bar);
  reporter.report(record(2, {1}));
  reporter.report(r);
  const std::string lines = log.str();
  EXPECT_EQ(lines.rfind("iter  3/10 |", 0), 0u) << lines;
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 1) << lines;
}

// With an expert bias (Note [Expert bias]): the step's most loaded expert over the mean in the
// log line, the JSON line and TensorBoard's scalars; nothing of it without one.
TEST(Progress, ExpertLoadBalanceWithAnExpertBias) {
  IterationRecord r = record(3, {1});
  EXPECT_EQ(format_log_line(r, 10).find("expert load"), std::string::npos);
  EXPECT_FALSE(nlohmann::json::parse(to_json_line(r)).contains("expert_load_max_over_mean"));
  const size_t plain = tensorboard_scalars(r).size();
  r.expert_load_max_over_mean = 1.375;
  EXPECT_NE(format_log_line(r, 10).find(" | expert load max/mean 1.38"), std::string::npos)
      << format_log_line(r, 10);
  EXPECT_EQ(nlohmann::json::parse(to_json_line(r))["expert_load_max_over_mean"].get<double>(),
            1.375);
  const auto scalars = tensorboard_scalars(r);
  ASSERT_EQ(scalars.size(), plain + 1);
  EXPECT_NE(std::find(scalars.begin(), scalars.end(),
                      std::pair<std::string, double>{"moe/expert_load_max_over_mean", 1.375}),
            scalars.end());
}

// The reporter's event file: made by open() only, every step's scalars at its step, flushed
// with each log line so that TensorBoard reads a run as it goes. Oracle: the independent reader
// of tests/common/tfevents_reader.h.
TEST(Progress, TensorBoardScalarsEveryStep) {
  TempDir dir;
  const std::string tb = dir.path("tb");
  std::ostringstream log, bar;
  ProgressReporter reporter({.total_iters = 4,
                             .log_interval = 2,
                             .tensorboard_dir = tb,
                             .verbosity = Verbosity::kQuiet,
                             .bar = BarMode::kNever},
                            log, bar);
  EXPECT_FALSE(fs::exists(tb)) << "no directory before open()";
  reporter.open();
  ASSERT_TRUE(fs::is_directory(tb));
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(tb)) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  IterationRecord first = record(1, {1 << 20, 3 << 20});
  first.comm_seconds_by_rank = {0.2, 0.1};
  first.exposed_comm_seconds_by_rank = {0.01, 0.03};
  reporter.report(first);
  IterationRecord second = record(2, {1 << 20});
  second.valid_loss = 2.0;
  reporter.report(second);  // a log step: flushed
  std::map<std::string, std::map<int64_t, float>> got;
  for (const testing::TfEvent& e : testing::read_tf_events(files[0].string())) {
    for (const testing::TfScalar& s : e.scalars) got[s.tag][e.step] = s.value.value();
  }
  EXPECT_EQ(got["train/loss"], (std::map<int64_t, float>{{1, static_cast<float>(first.loss)},
                                                         {2, static_cast<float>(second.loss)}}));
  EXPECT_EQ(got["train/lr"][2], 3e-3f);
  EXPECT_EQ(got["memory/peak_bytes"][1], static_cast<float>(3 << 20));  // the largest rank's
  EXPECT_EQ(got["alltoall/busy_s"], (std::map<int64_t, float>{{1, 0.2f}}));
  EXPECT_EQ(got["alltoall/exposed_s"], (std::map<int64_t, float>{{1, 0.03f}}));
  EXPECT_EQ(got["valid/loss"], (std::map<int64_t, float>{{2, 2.0f}}));
  EXPECT_EQ(got["valid/ppl"], (std::map<int64_t, float>{{2, static_cast<float>(std::exp(2.0))}}));
  EXPECT_EQ(tensorboard_scalars(first).size(), 10u);
}

}  // namespace
}  // namespace tandem::cli
