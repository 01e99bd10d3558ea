// `tandem convert` with a tokenizer. Oracle: the ids Debian's spm_encode (sentencepiece's own
// command-line tool, not our code) gives each line of tests/fixtures/tokenizers/sample.txt
// (sample.spm_ids, tests/fixtures/tokenizers/README.md), read back from the Megatron pair by the
// reader that training uses; the ids-file path (tools/hf_tokenize.py's output) against the
// sentencepiece path, byte for byte; and bytes as tokens when no tokenizer is given.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/file_dataset.h"
#include "tandem_process.h"

namespace tandem::test {
namespace {

const std::string kFixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";

// The non-blank lines of sample.txt and spm_encode's ids of each.
struct Sample {
  std::vector<std::string> lines;
  std::vector<std::vector<int32_t>> ids;
};

Sample sample() {
  Sample s;
  std::istringstream text(slurp(kFixtures + "sample.txt"));
  std::istringstream ids(slurp(kFixtures + "sample.spm_ids"));
  for (std::string line, id_line; std::getline(text, line) && std::getline(ids, id_line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream words(id_line);
    std::vector<int32_t> row;
    for (int32_t id = 0; words >> id;) row.push_back(id);
    s.lines.push_back(line);
    s.ids.push_back(row);
  }
  return s;
}

// Every token of the pair at `prefix`, by document.
std::vector<std::vector<int32_t>> documents_of(const std::string& prefix, int64_t vocab) {
  const data::MegatronDataset ds(prefix, vocab, 0);
  std::vector<std::vector<int32_t>> docs;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    const int64_t begin = ds.document_start(d), end = ds.document_start(d + 1);
    std::vector<int32_t> doc(static_cast<size_t>(end - begin));
    ds.read_tokens(begin, doc.data(), end - begin);
    docs.push_back(doc);
  }
  return docs;
}

RunResult convert(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "convert");
  TempDir capture;
  return run_tandem(args, dir.path(), capture.path());
}

TEST(ConvertCli, SentencePieceIdsAreSpmEncodes) {
  const Sample s = sample();
  ASSERT_EQ(s.lines.size(), 3u);
  TempDir dir;
  const std::string model = kFixtures + "spm.model";
  RunResult r =
      convert(dir, {kFixtures + "sample.txt", "eod", "--tokenizer-model", model, "--append-eod"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("3 documents"), std::string::npos) << r.out;
  const auto with_eod = documents_of(dir / "eod", 1000);
  ASSERT_EQ(with_eod.size(), s.ids.size());
  for (size_t d = 0; d < s.ids.size(); ++d) {
    std::vector<int32_t> expected = s.ids[d];
    expected.push_back(2);  // the model's </s>
    EXPECT_EQ(with_eod[d], expected) << "document " << d << ": " << s.lines[d];
  }
  r = convert(dir, {kFixtures + "sample.txt", "plain.bin", "--tokenizer-model", model});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(documents_of(dir / "plain", 1000), s.ids);
  r = convert(dir, {kFixtures + "sample.txt", "eod9", "--tokenizer-model", model, "--append-eod",
                    "--eod-id", "9"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(documents_of(dir / "eod9", 1000)[1].back(), 9);
}

TEST(ConvertCli, JsonRecordsAndIdsFilesGiveTheSameFiles) {
  const Sample s = sample();
  TempDir dir;
  std::string jsonl, ids = "tandem-ids vocab_size=1000 eod_id=2\n";
  for (size_t d = 0; d < s.lines.size(); ++d) {
    jsonl += nlohmann::json{{"id", d}, {"body", s.lines[d]}}.dump() + "\n\n";
    for (const int32_t id : s.ids[d]) ids += std::to_string(id) + " ";
    ids += "\n";
  }
  write_text(dir / "docs.jsonl", jsonl);
  write_text(dir / "ids.txt", ids);
  const std::string model = kFixtures + "spm.model";
  RunResult r =
      convert(dir, {kFixtures + "sample.txt", "text", "--tokenizer-model", model, "--append-eod"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = convert(dir, {"docs.jsonl", "json", "--tokenizer-model", model, "--json-keys", "body",
                    "--append-eod"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = convert(dir, {"ids.txt", "ids", "--append-eod"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* suffix : {".bin", ".idx"}) {
    EXPECT_EQ(slurp(dir / (std::string("json") + suffix)),
              slurp(dir / (std::string("text") + suffix)))
        << suffix;
    EXPECT_EQ(slurp(dir / (std::string("ids") + suffix)),
              slurp(dir / (std::string("text") + suffix)))
        << suffix;
  }
}

TEST(ConvertCli, WithoutATokenizerEveryByteIsAToken) {
  TempDir dir;
  write_text(dir / "t.txt", "abc\n");
  const RunResult r = convert(dir, {"t.txt", "t.tok"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string bytes = slurp(dir / "t.tok");
  ASSERT_EQ(bytes.size(), 1024u + 8u);
  EXPECT_EQ(bytes.substr(1024), std::string("a\0b\0c\0\n\0", 8));
}

}  // namespace
}  // namespace tandem::test
