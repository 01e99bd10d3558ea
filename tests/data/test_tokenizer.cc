// Tokenizing for `tandem convert`. Oracle: the ids Debian's spm_encode (sentencepiece's own
// command-line tool) gives each line of tests/fixtures/tokenizers/sample.txt (sample.spm_ids);
// the documents of a file as Note [Documents of a file] states them, and the ids format of
// tools/hf_tokenize.py as its docstring states it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "data_files.h"

namespace tandem::data {
namespace {

const std::string kFixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Tokenizer, SentencePieceEncodesAsSpmEncode) {
  const SentencePieceTokenizer sp(kFixtures + "spm.model");
  EXPECT_EQ(sp.vocab_size(), 1000);
  EXPECT_EQ(sp.eos_id(), 2);
  const std::vector<std::string> text = lines_of(kFixtures + "sample.txt");
  const std::vector<std::string> ids = lines_of(kFixtures + "sample.spm_ids");
  ASSERT_EQ(text.size(), ids.size());
  int64_t compared = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    std::istringstream words(ids[i]);
    std::vector<int32_t> expected;
    for (int32_t id = 0; words >> id;) expected.push_back(id);
    EXPECT_EQ(sp.encode(text[i]), expected) << "line " << i + 1 << ": " << text[i];
    compared += static_cast<int64_t>(expected.size());
  }
  EXPECT_GT(compared, 50);
  expect_error([&] { SentencePieceTokenizer bad(kFixtures + "sample.txt"); },
               {"sample.txt", "not a sentencepiece model"});
}

// Megatron-LM's vocabulary under each sentencepiece --tokenizer-type
// (Note [Megatron-LM's tokenizer vocabulary] in data/tokenizer.h): spm.model has 1000 pieces,
// <unk> 0, <s> 1, </s> 2 and no pad piece.
TEST(Tokenizer, SentencePieceVocabularyAsMegatron) {
  const SentencePieceTokenizer sp(kFixtures + "spm.model");
  for (const char* type : {"GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    const TokenizerVocab v = sp.megatron_vocab(type);
    EXPECT_EQ(v.size, 1000) << type;
    EXPECT_EQ(v.eod, 2) << type;
  }
  // <CLS> 1000, <SEP> 1001, <EOD> 1002, <MASK> 1003, <PAD> 1004 (no pad piece); <s> and </s>
  // are pieces already.
  const TokenizerVocab full = sp.megatron_vocab("SentencePieceTokenizer");
  EXPECT_EQ(full.size, 1005);
  EXPECT_EQ(full.eod, 1002);
  // Special tokens that are pieces already keep their ids; a pad piece is not added again.
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<pad>", "<SEP>", "a", "b"};
  const TokenizerVocab own = sentencepiece_megatron_vocab(
      "SentencePieceTokenizer", 7, [&](int64_t i) { return pieces.at(i); }, 3, 1, 2);
  EXPECT_EQ(own.size, 10);  // <CLS> 7, <EOD> 8, <MASK> 9
  EXPECT_EQ(own.eod, 8);
  expect_error([&] { (void)sp.megatron_vocab("HuggingFaceTokenizer"); },
               {"HuggingFaceTokenizer", "not a sentencepiece tokenizer"});
}

class Documents : public FileDatasetTest {};

TEST_F(Documents, LinesAndJsonRecords) {
  const auto collect = [&](const std::string& name, const std::string& key) {
    std::vector<std::pair<std::string, int64_t>> docs;
    for_each_document(path(name), key, [&](const std::string& text, int64_t line) {
      docs.emplace_back(text, line);
    });
    return docs;
  };
  const std::string text = "one\n\n  \r\ntwo words\r\nlast without newline";
  write_bytes(path("t.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  using Docs = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ(collect("t.txt", "text"),
            (Docs{{"one", 1}, {"two words\r", 4}, {"last without newline", 5}}));
  const std::string jsonl =
      "{\"text\": \"a\\nb\", \"n\": 1}\n\n{\"body\": \"x\", \"text\": \"c\"}\n";
  write_bytes(path("d.jsonl"), std::vector<unsigned char>(jsonl.begin(), jsonl.end()));
  EXPECT_EQ(collect("d.jsonl", "text"), (Docs{{"a\nb", 1}, {"c", 3}}));
  expect_error([&] { collect("d.jsonl", "body"); }, {"d.jsonl line 1", "'body'"});
  const std::string broken = "{\"text\": \"a\"}\n[1, 2]\n";
  write_bytes(path("b.json"), std::vector<unsigned char>(broken.begin(), broken.end()));
  expect_error([&] { collect("b.json", "text"); }, {"b.json line 2", "not a JSON object"});
}

// Well-formed UTF-8 as Unicode's table 3-7 defines it: the first byte that breaks it, or -1.
TEST(Tokenizer, InvalidUtf8At) {
  EXPECT_EQ(invalid_utf8_at(""), -1);
  EXPECT_EQ(invalid_utf8_at("plain ascii"), -1);
  EXPECT_EQ(invalid_utf8_at("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"), -1);
  EXPECT_EQ(invalid_utf8_at("ab\xff"), 2);            // never a UTF-8 byte
  EXPECT_EQ(invalid_utf8_at("a\x80"), 1);             // a continuation byte first
  EXPECT_EQ(invalid_utf8_at("x\xc0\xaf"), 1);         // overlong '/'
  EXPECT_EQ(invalid_utf8_at("\xe0\x80\xaf"), 0);      // overlong, three bytes
  EXPECT_EQ(invalid_utf8_at("\xed\xa0\x80"), 0);      // a surrogate, U+D800
  EXPECT_EQ(invalid_utf8_at("\xf4\x90\x80\x80"), 0);  // past U+10FFFF
  EXPECT_EQ(invalid_utf8_at("abc\xe2\x82"), 3);       // truncated at the end
  EXPECT_EQ(invalid_utf8_at("\xe2\x82x"), 0);         // truncated before another byte
}

TEST_F(Documents, TextThatIsNotUtf8IsRefusedNamingLineAndByte) {
  const std::string text =
      "fine\nab\xfe"
      "cd\n";
  write_bytes(path("t.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  expect_error(
      [&] { for_each_document(path("t.txt"), "text", [](const std::string&, int64_t) {}); },
      {"t.txt line 2", "byte offset 7", "0xfe", "not UTF-8"});
}

TEST(Tokenizer, IdsFormat) {
  const IdsHeader h = parse_ids_header("tandem-ids vocab_size=500 eod_id=7", "ids");
  EXPECT_EQ(h.vocab_size, 500);
  EXPECT_EQ(h.eod_id, 7);
  EXPECT_EQ(parse_ids_header("tandem-ids vocab_size=5", "ids").eod_id, -1);
  expect_error([] { parse_ids_header("1 2 3", "ids"); }, {"ids", "tandem-ids"});
  expect_error([] { parse_ids_header("tandem-ids eod_id=1", "ids"); }, {"vocab_size"});
  expect_error([] { parse_ids_header("tandem-ids vocab_size=5 eod_id=5", "ids"); },
               {"eod_id 5", "[0, 5)"});
  EXPECT_EQ(parse_ids_line(" 1 2\t499 \r", 500, "ids", 2), (std::vector<int32_t>{1, 2, 499}));
  EXPECT_TRUE(parse_ids_line("", 500, "ids", 2).empty());
  expect_error([] { parse_ids_line("1 500", 500, "ids", 3); }, {"ids line 3", "'500'"});
  expect_error([] { parse_ids_line("1 -2", 500, "ids", 3); }, {"'-2'"});
  expect_error([] { parse_ids_line("1 2x", 500, "ids", 3); }, {"'x'"});
}

}  // namespace
}  // namespace tandem::data
