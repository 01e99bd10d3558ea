// Crash-safe writes. Oracle: the file system itself: after each step the directory listing and
// file contents must be exactly the old or exactly the new version, never a mix, and no
// temporary sibling may remain.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "io/atomic_dir.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;

class AtomicDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_atomic_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    ckpt_ = root_ + "/ckpt";
  }
  void TearDown() override { fs::remove_all(root_); }

  // name -> contents of every file in `dir`.
  static std::map<std::string, std::string> listing(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) {
      out[e.path().filename().string()] = read_file(e.path().string());
    }
    return out;
  }
  // Entries of the root other than `ckpt` itself.
  std::vector<std::string> siblings() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root_)) {
      if (e.path().filename() != "ckpt") out.push_back(e.path().filename().string());
    }
    return out;
  }
  void write_version(const std::map<std::string, std::string>& files,
                     DirSwap swap = DirSwap::kExchangeIfSupported) {
    AtomicDirWriter w(ckpt_, swap);
    for (const auto& [name, text] : files) write_file_atomic(w.file_path(name), text);
    w.commit();
  }

  std::string root_, ckpt_;
};

using Files = std::map<std::string, std::string>;

TEST_F(AtomicDirTest, CommitCreatesThenReplacesWholeDirectory) {
  for (DirSwap swap : {DirSwap::kExchangeIfSupported, DirSwap::kRenameAside}) {
    fs::remove_all(ckpt_);
    write_version({{"a", "one"}, {"b", "two"}}, swap);
    EXPECT_EQ(listing(ckpt_), (Files{{"a", "one"}, {"b", "two"}}));
    EXPECT_TRUE(siblings().empty());
    write_version({{"a", "uno"}, {"c", "tres"}}, swap);
    EXPECT_EQ(listing(ckpt_), (Files{{"a", "uno"}, {"c", "tres"}}));
    EXPECT_TRUE(siblings().empty());
  }
}

TEST_F(AtomicDirTest, UncommittedWriteLeavesPreviousVersionIntact) {
  write_version({{"a", "one"}, {"b", "two"}});
  {
    AtomicDirWriter w(ckpt_);
    write_file_atomic(w.file_path("a"), "half-written new version");
    EXPECT_TRUE(fs::is_directory(w.tmp_dir()));
    EXPECT_EQ(fs::path(w.tmp_dir()).parent_path(), fs::path(root_));
    EXPECT_EQ(listing(ckpt_), (Files{{"a", "one"}, {"b", "two"}})) << "untouched while writing";
    // Never committed: as if the process died before the rename.
  }
  EXPECT_EQ(listing(ckpt_), (Files{{"a", "one"}, {"b", "two"}}));
  EXPECT_TRUE(siblings().empty()) << "the temporary directory is removed";
  try {
    AtomicDirWriter w(ckpt_);
    write_file_atomic(w.file_path("a"), "x");
    throw std::runtime_error("save failed half way");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(listing(ckpt_), (Files{{"a", "one"}, {"b", "two"}}));
  EXPECT_TRUE(siblings().empty());
}

TEST_F(AtomicDirTest, RecoveryRestoresOldVersionAndRemovesLeftovers) {
  // A crash of the fallback path between its two renames: no ckpt, a complete .old and .tmp.
  fs::create_directory(ckpt_ + ".old-abc123");
  write_file_atomic(ckpt_ + ".old-abc123/a", "old");
  fs::create_directory(ckpt_ + ".tmp-def456");
  write_file_atomic(ckpt_ + ".tmp-def456/a", "new");
  recover_atomic_dir(ckpt_);
  EXPECT_EQ(listing(ckpt_), (Files{{"a", "old"}}));
  EXPECT_TRUE(siblings().empty());
  // A crash after the swap: ckpt is complete, a leftover is removed and ckpt kept.
  fs::create_directory(ckpt_ + ".tmp-zzz999");
  recover_atomic_dir(ckpt_);
  EXPECT_EQ(listing(ckpt_), (Files{{"a", "old"}}));
  EXPECT_TRUE(siblings().empty());
}

TEST_F(AtomicDirTest, SmallFileWriteIsAtomic) {
  const std::string latest = root_ + "/latest";
  write_file_atomic(latest, "iter_0000100\n");
  EXPECT_EQ(read_file(latest), "iter_0000100\n");
  write_file_atomic(latest, "iter_0000200\n");
  EXPECT_EQ(read_file(latest), "iter_0000200\n");
  {
    AtomicFileWriter w(latest);
    w.write("iter_0000300", 12);
    EXPECT_TRUE(fs::exists(w.tmp_path()));
  }
  EXPECT_EQ(read_file(latest), "iter_0000200\n") << "an uncommitted write changes nothing";
  EXPECT_EQ(fs::directory_iterator(root_)->path(), fs::path(latest)) << "no temporary left";
  EXPECT_THROW(read_file(latest, 4), Error);
  EXPECT_THROW(read_file(root_ + "/missing"), Error);
  EXPECT_THROW(AtomicDirWriter(root_ + "/no/such/parent/ckpt"), Error);
}

}  // namespace
}  // namespace tandem::io
