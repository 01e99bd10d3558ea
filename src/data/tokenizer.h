// Text into token ids for `tandem convert`: the documents of a text or JSONL file, a
// sentencepiece model through libsentencepiece, and the token ids a Hugging Face tokenizer gives
// through tools/hf_tokenize.py (no C++ library of Hugging Face's tokenizers is packaged).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

// Note [Documents of a file]: a text file holds one document per line (the line without its
// '\n'); a JSONL file (name ending .json or .jsonl) one JSON object per line, the document being
// the string under `json_key` (Megatron's --json-keys). Blank lines are no document. Calls
// `fn(text, line)` for each document in order; a JSONL line that is not an object with a string
// under the key throws tandem::Error naming the file, the line and the key.
// A document's text is UTF-8, as the tokenizers read it (libsentencepiece would turn any other
// byte into U+FFFD silently, Python's tokenizers refuses it): a line that is not, anywhere in the
// file, throws naming the file, the line, the byte's offset in the file and its value.
bool is_jsonl_path(const std::string& path);
void for_each_document(const std::string& path, const std::string& json_key,
                       const std::function<void(const std::string& text, int64_t line)>& fn);

// The offset of the first byte of `text` that does not belong to well-formed UTF-8 (an invalid
// byte, a truncated, overlong or surrogate sequence, past U+10FFFF); -1 when all of it does.
int64_t invalid_utf8_at(std::string_view text);

// A sentencepiece model (`tokenizer.model`); encode() is libsentencepiece's Encode, as Python's
// `SentencePieceProcessor.encode(text)` gives it (no BOS or EOS added).
class SentencePieceTokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer();
  std::vector<int32_t> encode(const std::string& text) const;
  int64_t vocab_size() const;
  int64_t eos_id() const;  // -1 when the model defines none

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The first line of tools/hf_tokenize.py's output: "tandem-ids vocab_size=N eod_id=E", then one
// line of space-separated ids per document of its input (an empty line for a document without
// tokens).
inline constexpr const char* kIdsHeader = "tandem-ids";
struct IdsHeader {
  int64_t vocab_size = 0;
  int64_t eod_id = -1;  // -1: the tokenizer names no end-of-document token
};
// Parses a header line; throws tandem::Error naming `source` when it is not one.
IdsHeader parse_ids_header(const std::string& line, const std::string& source);
// Parses one line of ids, each checked against [0, vocab_size); throws naming `source` and line.
std::vector<int32_t> parse_ids_line(const std::string& line, int64_t vocab_size,
                                    const std::string& source, int64_t line_number);

}  // namespace tandem::data
