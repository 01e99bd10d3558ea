// TensorBoard event files. Oracle: tests/common/tfevents_reader.h, a reader written from the
// record format and the protobuf wire format alone (its own CRC-32C and decoder), checking
// every length and checksum; and the protobuf library's own parser of the generated message as a
// second reading of the same bytes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/tfevents_reader.h"
#include "core/error.h"
#include "io/tensorboard.h"
#include "tensorboard_event.pb.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;
using testing::read_tf_events;
using testing::TfEvent;

class TensorBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_tb_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<fs::path> event_files(const fs::path& dir) const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(TensorBoardTest, ReaderAgreesWithTheKnownCrc32c) {
  EXPECT_EQ(testing::tf_crc32c("123456789"), 0xe3069283U);  // the CRC-32C check value
  EXPECT_EQ(masked_crc32c("123456789"), testing::tf_masked_crc("123456789"));
}

TEST_F(TensorBoardTest, ScalarsReadBackWithTheirTagsStepsAndValues) {
  const fs::path dir = dir_ / "runs" / "a";  // made with its parent
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.add_scalar("train/loss", 2.5, 1);
    w.add_scalar("train/aux_loss", 0.0, 1);  // a zero is written, not left out
    w.add_scalar("valid/loss", 1.25, 10);
    w.add_scalar("memory/peak_bytes", 3.0e9, 10);
    w.flush();
    // Flushed: readable while the writer is open.
    EXPECT_EQ(read_tf_events(path).size(), 5u);
    w.add_scalar("train/lr", -1.5e-3, 11);
  }
  ASSERT_EQ(event_files(dir), std::vector<fs::path>{path});
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_TRUE(
      std::regex_match(fs::path(path).filename().string(),
                       std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\." +
                                  std::regex_replace(std::string(host), std::regex("[.]"), "\\."))))
      << path;
  const std::vector<TfEvent> events = read_tf_events(path);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  const std::vector<std::tuple<std::string, float, int64_t>> want = {
      {"train/loss", 2.5f, 1},
      {"train/aux_loss", 0.0f, 1},
      {"valid/loss", 1.25f, 10},
      {"memory/peak_bytes", 3.0e9f, 10},
      {"train/lr", -1.5e-3f, 11}};
  const double now = static_cast<double>(std::time(nullptr));
  for (size_t i = 0; i < want.size(); ++i) {
    const TfEvent& e = events[i + 1];
    EXPECT_FALSE(e.file_version.has_value());
    ASSERT_EQ(e.scalars.size(), 1u);
    EXPECT_EQ(e.scalars[0].tag, std::get<0>(want[i]));
    ASSERT_TRUE(e.scalars[0].value.has_value()) << std::get<0>(want[i]);
    EXPECT_EQ(*e.scalars[0].value, std::get<1>(want[i]));
    EXPECT_EQ(e.step, std::get<2>(want[i]));
    EXPECT_NEAR(e.wall_time, now, 60.0);
    EXPECT_GE(e.wall_time, events[i].wall_time);
  }
}

TEST_F(TensorBoardTest, TheLibraryParsesEachRecordAsAnEvent) {
  std::string path;
  {
    TensorBoardWriter w(dir_.string());
    path = w.path();
    w.add_scalar("valid/ppl", 7.0, 3);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  std::vector<tensorboard::Event> events;
  while (at < bytes.size()) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    tensorboard::Event e;
    ASSERT_TRUE(e.ParseFromString(bytes.substr(at + 12, length)));
    events.push_back(e);
    at += 12 + length + 4;
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "valid/ppl");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 7.0f);
  EXPECT_EQ(events[1].step(), 3);
}

TEST_F(TensorBoardTest, TwoWritersInOneDirectoryWriteTwoFiles) {
  TensorBoardWriter a(dir_.string()), b(dir_.string());
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(event_files(dir_).size(), 2u);
}

TEST_F(TensorBoardTest, ACorruptedRecordIsCaughtByTheReader) {
  std::string path;
  {
    TensorBoardWriter w(dir_.string());
    path = w.path();
    w.add_scalar("train/loss", 1.0, 1);
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-6, std::ios::end);  // inside the last record's data
  f.put('\x7f');
  f.close();
  EXPECT_THROW(read_tf_events(path), std::runtime_error);
}

TEST_F(TensorBoardTest, ADirectoryThatCannotBeMadeNamesThePath) {
  std::ofstream(dir_ / "afile") << "x";
  const std::string bad = (dir_ / "afile" / "tb").string();
  try {
    TensorBoardWriter w(bad);
    FAIL() << "made " << bad;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::io
