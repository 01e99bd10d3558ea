// File datasets (llm.c tokens, raw text, Megatron .bin/.idx) and `tandem convert`. Oracle: the
// formats as specified (llm.c's write_datafile header, Megatron's _IndexWriter layout) written
// byte by byte here, independently of the reader, and the token values the test put in.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/file_dataset.h"
#include "data/megatron_writer.h"
#include "data_files.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;

// An llm.c file written from the format: 256 int32 header (magic, version, count), then tokens.
std::vector<unsigned char> llmc_bytes(int32_t magic, int32_t version, int32_t count,
                                      const std::vector<uint32_t>& tokens, int width) {
  std::vector<unsigned char> out;
  put_le(out, static_cast<uint32_t>(magic), 4);
  put_le(out, static_cast<uint32_t>(version), 4);
  put_le(out, static_cast<uint32_t>(count), 4);
  out.resize(1024, 0);
  for (uint32_t t : tokens) put_le(out, t, width);
  return out;
}

std::vector<int32_t> read(const FileTokenDataset& ds, int64_t start, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n), -1);
  ds.read_tokens(start, out.data(), n);
  return out;
}

TEST_F(FileDatasetTest, TokenFileWindowsReadBackWhatWasWritten) {
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 50257);
  write_token_file(path("t.bin"), tokens.data(), static_cast<int64_t>(tokens.size()));
  const TokenFileDataset ds(path("t.bin"), 50257, 1);
  EXPECT_EQ(ds.num_tokens(), 1000);
  EXPECT_EQ(ds.data_offset(), 1024);
  EXPECT_EQ(read(ds, 0, 3), (std::vector<int32_t>{0, 7919, 15838}));
  const int64_t length = 65;
  for (int64_t index : {0, 1, 17, 123456789}) {
    const int64_t start = ds.window_start(index, length);
    ASSERT_GE(start, 0);
    ASSERT_LE(start + length, 1000);
    std::vector<int32_t> got(length);
    ds.sample(index, got.data(), length);
    for (int64_t i = 0; i < length; ++i) EXPECT_EQ(got[i], tokens[start + i]) << index << " " << i;
  }
  // Another instance with the same seed picks the same windows; another seed other ones.
  const TokenFileDataset same(path("t.bin"), 50257, 1), other(path("t.bin"), 50257, 2);
  int differ = 0;
  for (int64_t index = 0; index < 20; ++index) {
    EXPECT_EQ(ds.window_start(index, length), same.window_start(index, length));
    differ += ds.window_start(index, length) != other.window_start(index, length);
  }
  EXPECT_GT(differ, 10);
}

TEST_F(FileDatasetTest, AnEpochVisitsEveryWindowOnceAndEpochsDiffer) {
  const int64_t n = 1000, length = 11, stride = 10, windows = (n - length) / stride + 1;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> starts;
    std::set<int64_t> shifts;
    for (int64_t i = epoch * windows; i < (epoch + 1) * windows; ++i) {
      const int64_t s = window_start(77, i, n, length);
      ASSERT_GE(s, 0);
      ASSERT_LE(s + length, n);
      starts.insert(s);
      shifts.insert(s % stride);
    }
    EXPECT_EQ(static_cast<int64_t>(starts.size()), windows) << "epoch " << epoch;
    EXPECT_EQ(shifts.size(), 1u) << "one shift per epoch";
  }
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < windows; ++i) {
    first.push_back(window_start(77, i, n, length) / stride);
    second.push_back(window_start(77, windows + i, n, length) / stride);
  }
  EXPECT_NE(first, second);
  // Degenerate sizes: one window, and windows of one token.
  EXPECT_EQ(window_start(1, 5, 10, 10), 0);
  for (int64_t i = 0; i < 30; ++i) EXPECT_LT(window_start(1, i, 10, 1), 10);
}

TEST_F(FileDatasetTest, BadTokenFilesNameTheFileAndTheProblem) {
  write_bytes(path("magic.bin"), llmc_bytes(12345, 1, 2, {1, 2}, 2));
  expect_error([&] { TokenFileDataset(path("magic.bin"), 256, 0); },
               {path("magic.bin"), "magic number 12345", "20240520"});
  write_bytes(path("version.bin"), llmc_bytes(kLlmcMagic, 7, 2, {1, 2}, 2));
  expect_error([&] { TokenFileDataset(path("version.bin"), 256, 0); },
               {path("version.bin"), "version 7"});
  write_bytes(path("trunc.bin"), llmc_bytes(kLlmcMagic, 1, 10, {1, 2, 3}, 2));
  expect_error([&] { TokenFileDataset(path("trunc.bin"), 256, 0); },
               {path("trunc.bin"), "10 uint16 tokens", "truncated"});
  write_bytes(path("long.bin"), llmc_bytes(kLlmcMagic, 1, 1, {1, 2, 3}, 2));
  expect_error([&] { TokenFileDataset(path("long.bin"), 256, 0); }, {"too long"});
  write_bytes(path("short.bin"), {1, 2, 3});
  expect_error([&] { TokenFileDataset(path("short.bin"), 256, 0); },
               {path("short.bin"), "shorter than the 1024-byte"});
  write_bytes(path("neg.bin"), llmc_bytes(kLlmcMagic, 1, -4, {}, 2));
  expect_error([&] { TokenFileDataset(path("neg.bin"), 256, 0); }, {"negative token count"});
  expect_error([&] { TokenFileDataset(path("missing.bin"), 256, 0); },
               {path("missing.bin"), "cannot open"});
}

TEST_F(FileDatasetTest, Version2Uint32TokensAreRead) {
  write_bytes(path("v2.bin"), llmc_bytes(kLlmcMagic, 2, 3, {70000, 5, 128255}, 4));
  const TokenFileDataset ds(path("v2.bin"), 128256, 0);
  EXPECT_EQ(read(ds, 0, 3), (std::vector<int32_t>{70000, 5, 128255}));
}

TEST_F(FileDatasetTest, OutOfRangeIdNamesFileIndexAndByteOffset) {
  std::vector<uint16_t> tokens = {1, 2, 3, 4, 5, 300, 7, 8};
  write_token_file(path("t.bin"), tokens.data(), 8);
  const TokenFileDataset ds(path("t.bin"), 256, 0);
  EXPECT_EQ(read(ds, 0, 5), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  expect_error([&] { read(ds, 3, 4); },
               {path("t.bin"), "token 5 ", "byte offset 1034", "id 300", "[0, 256)"});
  // A sample longer than the file is an error, not a read past its end.
  expect_error([&] { read(ds, 5, 4); }, {"outside"});
  std::vector<int32_t> out(9);
  expect_error([&] { ds.sample(0, out.data(), 9); }, {"holds 8 tokens"});
}

// Files past 4 GiB, without writing 4 GiB: sparse files with a few tokens near the end.
TEST_F(FileDatasetTest, TokenFileAbove4GiBReadsAt64BitOffsets) {
  const int64_t count = (int64_t{1} << 31) - 1;  // the most an llm.c header can count
  const int64_t size = kLlmcHeaderBytes + count * 2;
  ASSERT_GT(size, int64_t{1} << 32);
  const std::string p = path("big.bin");
  write_bytes(p, llmc_bytes(kLlmcMagic, 1, static_cast<int32_t>(count), {}, 2));
  const int fd = ::open(p.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, size), 0);
  const int64_t first = count - 4;  // tokens [first, count) get 11, 22, 33, 44
  const unsigned char tail[8] = {11, 0, 22, 0, 33, 0, 44, 0};
  const int64_t tail_offset = kLlmcHeaderBytes + first * 2;
  ASSERT_GT(tail_offset, int64_t{1} << 32);
  ASSERT_EQ(::pwrite(fd, tail, 8, static_cast<off_t>(tail_offset)), 8);
  ::close(fd);

  const TokenFileDataset ds(p, 65536, 3);
  EXPECT_EQ(ds.num_tokens(), count);
  EXPECT_EQ(read(ds, first - 1, 5), (std::vector<int32_t>{0, 11, 22, 33, 44}));
  const int64_t start = ds.window_start(int64_t{1} << 40, 129);
  EXPECT_LE(start + 129, count);
  const TokenFileDataset narrow(p, 30, 3);
  expect_error([&] { read(narrow, first, 4); },
               {"token " + std::to_string(count - 2) + " ",
                "byte offset " + std::to_string(tail_offset + 4), "id 33"});
}

TEST_F(FileDatasetTest, TextFileAbove4GiBReadsAt64BitOffsets) {
  const int64_t offset = (int64_t{1} << 32) + 50;
  const std::string p = path("big.txt");
  const int fd = ::open(p.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, offset + 100), 0);
  ASSERT_EQ(::pwrite(fd, "hello", 5, static_cast<off_t>(offset)), 5);
  ::close(fd);
  const TextBytesDataset ds(p, 256, 0);
  EXPECT_EQ(ds.num_tokens(), offset + 100);
  EXPECT_EQ(read(ds, offset - 1, 6), (std::vector<int32_t>{0, 'h', 'e', 'l', 'l', 'o'}));
  const TextBytesDataset small_vocab(p, 100, 0);
  expect_error(
      [&] { read(small_vocab, offset, 5); },
      {p, "token " + std::to_string(offset), "byte offset " + std::to_string(offset), "id 104"});
}

TEST_F(FileDatasetTest, TextBytesAreTokens) {
  const std::string text = "The quick brown fox jumps over the lazy dog.\n";
  write_bytes(path("a.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  const TextBytesDataset ds(path("a.txt"), 256, 9);
  EXPECT_EQ(ds.num_tokens(), static_cast<int64_t>(text.size()));
  std::vector<int32_t> got(9);
  for (int64_t index = 0; index < 10; ++index) {
    ds.sample(index, got.data(), 9);
    const int64_t start = ds.window_start(index, 9);
    for (int i = 0; i < 9; ++i) EXPECT_EQ(got[i], static_cast<unsigned char>(text[start + i]));
  }
}

// A Megatron pair written from _IndexWriter's layout; `pointer_fix` perturbs one pointer.
void write_megatron(const std::string& prefix, const std::vector<std::vector<uint16_t>>& seqs,
                    int64_t pointer_fix = 0, const char* magic = "MMIDIDX\0\0") {
  std::vector<unsigned char> idx(magic, magic + 9), bin;
  put_le(idx, 1, 8);  // version
  put_le(idx, 8, 1);  // dtype code: uint16
  put_le(idx, seqs.size(), 8);
  put_le(idx, seqs.size() + 1, 8);  // document indices 0..S
  for (const auto& s : seqs) put_le(idx, s.size(), 4);
  int64_t pointer = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    put_le(idx, static_cast<uint64_t>(pointer + (i == 1 ? pointer_fix : 0)), 8);
    pointer += static_cast<int64_t>(seqs[i].size()) * 2;
  }
  for (size_t d = 0; d <= seqs.size(); ++d) put_le(idx, d, 8);
  for (const auto& s : seqs) {
    for (uint16_t t : s) put_le(bin, t, 2);
  }
  write_bytes(prefix + ".idx", idx);
  write_bytes(prefix + ".bin", bin);
}

TEST_F(FileDatasetTest, MegatronIndexedDatasetIsOneTokenStream) {
  write_megatron(path("corpus"), {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}});
  EXPECT_TRUE(is_megatron_dataset(path("corpus")));
  EXPECT_TRUE(is_megatron_dataset(path("corpus.bin")));
  for (const std::string& name : {path("corpus"), path("corpus.idx"), path("corpus.bin")}) {
    const MegatronDataset ds(name, 10, 0);
    EXPECT_EQ(ds.num_tokens(), 9);
    EXPECT_EQ(read(ds, 0, 9), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  }
  write_megatron(path("gap"), {{1, 2, 3}, {4, 5}}, 2);
  expect_error([&] { MegatronDataset(path("gap"), 10, 0); },
               {path("gap.idx"), "sequence 1 starts at byte 8", "expected 6"});
  write_megatron(path("magic"), {{1}}, 0, "NOTMAGIC\0");
  EXPECT_FALSE(is_megatron_dataset(path("magic")));
  expect_error([&] { MegatronDataset(path("magic"), 10, 0); }, {"MMIDIDX"});
  write_megatron(path("short"), {{1, 2}, {3}});
  write_bytes(path("short.bin"), {1, 0, 2, 0});
  expect_error([&] { MegatronDataset(path("short"), 10, 0); }, {"ends past the .bin"});
  write_megatron(path("vocab"), {{1, 2}, {30}});
  expect_error([&] { read(MegatronDataset(path("vocab"), 10, 0), 0, 3); },
               {path("vocab.bin"), "token 2 ", "byte offset 4", "id 30"});
}

TEST_F(FileDatasetTest, OpenDatasetDetectsFormatsAndChecksLength) {
  std::vector<uint16_t> tokens(100, 3);
  write_token_file(path("t.bin"), tokens.data(), 100);
  write_bytes(path("a.txt"), std::vector<unsigned char>(50, 'x'));
  write_megatron(path("m"), {std::vector<uint16_t>(40, 2)});
  EXPECT_NE(open_dataset(path("t.bin"), "auto", 256, 0, 17)->describe().find("token file"),
            std::string::npos);
  EXPECT_NE(open_dataset(path("a.txt"), "auto", 256, 0, 17)->describe().find("text file"),
            std::string::npos);
  EXPECT_NE(open_dataset(path("m"), "auto", 256, 0, 17)->describe().find("Megatron"),
            std::string::npos);
  EXPECT_NE(open_dataset(path("t.bin"), "text", 256, 0, 17)->describe().find("text file"),
            std::string::npos);
  expect_error([&] { open_dataset(path("a.txt"), "auto", 256, 0, 51); },
               {path("a.txt"), "seq-length + 1 = 51"});
  expect_error([&] { open_dataset(path("a.txt"), "csv", 256, 0, 8); },
               {"'csv'", "auto, tokens, text and megatron"});
  expect_error([&] { open_dataset(path("nothing"), "auto", 256, 0, 8); }, {path("nothing")});
  std::vector<int32_t> out(17);
  open_dataset(path("t.bin"), DatasetFormat::kTokens, 256, 0, 17)->sample(4, out.data(), 17);
  EXPECT_EQ(out, std::vector<int32_t>(17, 3));
}

TEST_F(FileDatasetTest, ConvertTextWritesTokenFileAtomically) {
  const std::string text = "tandem\x01\xff bytes\n";
  write_bytes(path("in.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  write_bytes(path("out.bin"), {9, 9, 9});  // an older output is replaced
  convert_text_to_tokens(path("in.txt"), path("out.bin"));
  const TokenFileDataset ds(path("out.bin"), 256, 0);
  ASSERT_EQ(ds.num_tokens(), static_cast<int64_t>(text.size()));
  const std::vector<int32_t> got = read(ds, 0, ds.num_tokens());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(got[i], static_cast<unsigned char>(text[i]));
  // A failed conversion leaves neither output nor temporary file.
  EXPECT_THROW(convert_text_to_tokens(path("missing.txt"), path("none.bin")), Error);
  EXPECT_FALSE(fs::exists(path("none.bin")));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, 2);
}

// Megatron's _IndexWriter layout (write_megatron above) is what MegatronWriter writes, byte for
// byte; an empty document is not recorded, and nothing appears before finish().
TEST_F(FileDatasetTest, MegatronWriterWritesIndexWriterLayout) {
  const std::vector<std::vector<uint16_t>> seqs = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}};
  write_megatron(path("expected"), seqs);
  {
    MegatronWriter writer(path("written"), 1000);
    for (const auto& s : seqs) {
      writer.add_document(std::vector<int32_t>(s.begin(), s.end()));
      writer.add_document({});
    }
    EXPECT_FALSE(fs::exists(path("written.bin")));
    writer.finish();
    EXPECT_EQ(writer.num_documents(), 3);
    EXPECT_EQ(writer.num_tokens(), 9);
  }
  for (const char* suffix : {".bin", ".idx"}) {
    EXPECT_EQ(read_all(path(std::string("written") + suffix)),
              read_all(path(std::string("expected") + suffix)))
        << suffix;
  }
  // Vocabularies of 65500 and more are stored as int32, as Megatron's optimal_dtype does.
  EXPECT_EQ(megatron_token_bytes(65499), 2);
  EXPECT_EQ(megatron_token_bytes(65500), 4);
  {
    MegatronWriter big(path("big"), 100000);
    big.add_document({99999, 0});
    big.finish();
  }
  const MegatronDataset ds(path("big"), 100000, 0);
  EXPECT_EQ(ds.token_type(), TokenType::kI32);
  EXPECT_EQ(read(ds, 0, 2), (std::vector<int32_t>{99999, 0}));
  // A writer that never finishes leaves no file.
  { MegatronWriter abandoned(path("abandoned"), 1000); }
  EXPECT_FALSE(fs::exists(path("abandoned.bin")));
  EXPECT_FALSE(fs::exists(path("abandoned.idx")));
}

// Note [Token ids checked up front]: a bad id anywhere in the file, the last token included, is
// refused when the data set is opened, for every token type; a type that cannot hold one is not
// scanned.
TEST_F(FileDatasetTest, OpeningChecksEveryTokenId) {
  std::vector<uint16_t> tokens(3'000'000, 3);  // more than one chunk of the scan
  tokens.back() = 300;
  write_token_file(path("t.bin"), tokens.data(), static_cast<int64_t>(tokens.size()));
  expect_error([&] { open_dataset(path("t.bin"), "tokens", 256, 0, 17); },
               {path("t.bin"), "token 2999999", "has id 300"});
  EXPECT_NO_THROW(open_dataset(path("t.bin"), "tokens", 301, 0, 17));
  {
    MegatronWriter big(path("neg"), 100000);
    big.add_document({5, 6, 7});
    big.finish();
  }
  // A negative int32 id, patched into the last token.
  std::vector<unsigned char> bin = read_all(path("neg.bin"));
  bin[8] = bin[9] = bin[10] = bin[11] = 0xff;
  write_bytes(path("neg.bin"), bin);
  expect_error([&] { open_dataset(path("neg"), "megatron", 100000, 0, 2); },
               {"neg.bin", "token 2", "has id -1"});
  write_bytes(path("bytes.txt"), std::vector<unsigned char>(100, 0xff));
  expect_error([&] { open_dataset(path("bytes.txt"), "text", 200, 0, 2); }, {"has id 255"});
  EXPECT_NO_THROW(open_dataset(path("bytes.txt"), "text", 256, 0, 2));
}

}  // namespace
}  // namespace tandem::data
