// `tandem convert` with a tokenizer. Oracle: the ids Debian's spm_encode (sentencepiece's own
// command-line tool, not our code) gives each line of tests/fixtures/tokenizers/sample.txt
// (sample.spm_ids, tests/fixtures/tokenizers/README.md), read back from the Megatron pair by the
// reader that training uses; the ids-file path (tools/hf_tokenize.py's output) against the
// sentencepiece path, byte for byte; and bytes as tokens when no tokenizer is given.
#include <gtest/gtest.h>

#include <algorithm>
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

// Training reads Megatron-LM's vocabulary from a sentencepiece --tokenizer-model through
// tandem-tokenize (Note [Megatron-LM's tokenizer vocabulary] in src/data/tokenizer.h): the
// 1000 pieces padded to 1024 rows, </s> (2) as the end-of-document id of the document masks.
TEST(ConvertCli, TrainingReadsTheVocabularyOfASentencePieceModel) {
  TempDir dir;
  const std::string model = kFixtures + "spm.model";
  RunResult r =
      convert(dir, {kFixtures + "sample.txt", "docs", "--tokenizer-model", model, "--append-eod"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> train = {"train",
                                          "--data-path",
                                          "docs",
                                          "--tokenizer-model",
                                          model,
                                          "--num-layers",
                                          "1",
                                          "--hidden-size",
                                          "16",
                                          "--num-attention-heads",
                                          "2",
                                          "--num-query-groups",
                                          "2",
                                          "--ffn-hidden-size",
                                          "16",
                                          "--num-experts",
                                          "0",
                                          "--seq-length",
                                          "8",
                                          "--micro-batch-size",
                                          "1",
                                          "--global-batch-size",
                                          "1",
                                          "--train-iters",
                                          "2",
                                          "--split",
                                          "100,0,0",
                                          "--reset-attention-mask",
                                          "--eod-mask-loss",
                                          "--quiet",
                                          "--log-json",
                                          "log.jsonl"};
  for (const char* type : {"Llama2Tokenizer", "SentencePieceTokenizer"}) {
    std::vector<std::string> args = train;
    args.insert(args.end(), {"--tokenizer-type", type, "--vocab-size", "1000"});
    TempDir capture;
    r = run_tandem(args, dir.path(), capture.path());
    EXPECT_EQ(r.exit_code, 2) << type << ": " << r.err;
    const std::string want = std::string(type) == "Llama2Tokenizer"
                                 ? "1000 tokens, 1024 rows padded, end-of-document id 2"
                                 : "1005 tokens, 1024 rows padded, end-of-document id 1002";
    EXPECT_NE(r.err.find(want), std::string::npos) << type << ": " << r.err;
  }
  std::vector<std::string> args = train;
  args.insert(args.end(), {"--tokenizer-type", "Llama2Tokenizer"});
  TempDir capture;
  r = run_tandem(args, dir.path(), capture.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(slurp(dir / "log.jsonl").find("\"iter\":2"), std::string::npos);
  // Megatron-LM's --reset-position-ids reaches no RoPE (docs/megatron.md "Document masking"):
  // the same losses to the bit; tandem's --document-positions restarts them, which changes the
  // losses where attention crosses documents (within one document RoPE's scores depend only on
  // the distance between positions, so beside --reset-attention-mask it changes nothing).
  const auto losses = [&](const std::vector<std::string>& options) {
    std::vector<std::string> with = args;
    with.erase(std::find(with.begin(), with.end(), "--reset-attention-mask"));
    // Samples long enough to hold the end of one document and the start of the next.
    for (const auto& [option, value] : {std::pair{"--seq-length", "32"},
                                        {"--micro-batch-size", "2"},
                                        {"--global-batch-size", "2"}}) {
      *(std::find(with.begin(), with.end(), option) + 1) = value;
    }
    with.insert(with.end(), options.begin(), options.end());
    const RunResult run = run_tandem(with, dir.path(), capture.path());
    EXPECT_EQ(run.exit_code, 0) << run.err;
    std::vector<double> out;
    std::istringstream lines(slurp(dir / "log.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
    return out;
  };
  const std::vector<double> crossing = losses({});
  ASSERT_EQ(crossing.size(), 2u);
  EXPECT_EQ(losses({"--reset-position-ids"}), crossing);
  EXPECT_NE(losses({"--document-positions"}), crossing);
  args.insert(args.end(), {"--tokenizer-model", kFixtures + "sample.txt"});
  r = run_tandem(args, dir.path(), capture.path());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("not a sentencepiece model"), std::string::npos) << r.err;
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

// tools/hf_tokenize.py run by tandem convert, with a stand-in for Python's tokenizers package
// (this machine has none; SUITE=tok of bench/gpu_suite.sh runs the real one): its tokenizer looks
// each white-space separated word up in the vocabulary of tokenizer.json. Oracle: the same rule
// here, over the documents Note [Documents of a file] states.
TEST(ConvertCli, HuggingFaceTokenizerThroughTheScript) {
  TempDir dir;
  fs::create_directories(dir.path() / "stub/tokenizers");
  write_text(dir / "stub/tokenizers/__init__.py", R"(import json
class _Encoding:
    def __init__(self, ids): self.ids = ids
class _Added:
    def __init__(self, content): self.content, self.special = content, True
class Tokenizer:
    @staticmethod
    def from_file(path):
        t = Tokenizer()
        t.vocab = json.load(open(path))["vocab"]
        return t
    def token_to_id(self, token): return self.vocab.get(token)
    def get_vocab_size(self): return len(self.vocab)
    def get_added_tokens_decoder(self): return {self.vocab["</s>"]: _Added("</s>")}
    def encode_batch(self, texts): return [_Encoding([self.vocab[w] for w in t.split()]) for t in texts]
)");
  write_text(dir / "tokenizer.json",
             R"({"vocab": {"<unk>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4}})");
  write_text(dir / "docs.txt", "a b c\n\n  \nc a\n");
  write_text(dir / "docs.jsonl", "{\"body\": \"b\\nb a\"}\n{\"body\": \"c\"}\n");
  const std::vector<std::string> env = {"PYTHONPATH=" + (dir.path() / "stub").string()};
  TempDir capture;
  RunResult r = run_tandem(
      {"convert", "docs.txt", "text", "--tokenizer-model", "tokenizer.json", "--append-eod"},
      dir.path(), capture.path(), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(documents_of(dir / "text", 5),
            (std::vector<std::vector<int32_t>>{{2, 3, 4, 1}, {4, 2, 1}}));
  r = run_tandem({"convert", "docs.jsonl", "json", "--tokenizer-model", "tokenizer.json",
                  "--json-keys", "body"},
                 dir.path(), capture.path(), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(documents_of(dir / "json", 5), (std::vector<std::vector<int32_t>>{{3, 3, 2}, {4}}));
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
