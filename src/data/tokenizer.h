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

// Note [Megatron-LM's tokenizer vocabulary]: at train time Megatron-LM reads its tokenizer for
// two figures only, the vocabulary's size (which it pads to --make-vocab-size-divisible-by to
// make the embedding's rows) and the end-of-document id (its document masks' eod). Per
// --tokenizer-type:
//   HuggingFaceTokenizer       len(tokenizer) of transformers' AutoTokenizer: the distinct
//                              tokens of tokenizer.json's model vocabulary and its added tokens;
//                              eod its eos_token's id (tokenizer_config.json, else
//                              special_tokens_map.json), none when it names none
//   GPTSentencePieceTokenizer, the sentencepiece model's pieces; eod its eos id
//   Llama2Tokenizer
//   SentencePieceTokenizer     the pieces, then each of <CLS>, <SEP>, <EOD>, <MASK> and the
//                              model's pad, bos and eos pieces (<PAD>, <BOS>, <EOS> where the
//                              model has none) that is not a piece already, appended in that
//                              order; eod the id of <EOD>
// The sentencepiece figures come from `tandem-tokenize --vocab TYPE MODEL`, which prints
// them as an ids header (below) (Note [Tokenizers in a helper process] in cli/convert_command.cc).
struct TokenizerVocab {
  int64_t size = 0;
  int64_t eod = -1;  // -1: the tokenizer names no end-of-document token
};
// A HuggingFaceTokenizer's: `model` a directory holding tokenizer.json (and
// tokenizer_config.json), or the tokenizer.json itself. Throws tandem::Error naming the file and
// what is wrong with it.
TokenizerVocab hf_tokenizer_vocab(const std::string& model);
// The sentencepiece types' (GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer)
// from the model's pieces (`piece(i)` for i < `pieces`) and its pad, bos and eos ids (-1: none).
TokenizerVocab sentencepiece_megatron_vocab(const std::string& type, int64_t pieces,
                                            const std::function<std::string(int64_t)>& piece,
                                            int64_t pad_id, int64_t bos_id, int64_t eos_id);
// A sentencepiece model (`tokenizer.model`); encode() is libsentencepiece's Encode, as Python's
// `SentencePieceProcessor.encode(text)` gives it (no BOS or EOS added).
class SentencePieceTokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer();
  std::vector<int32_t> encode(const std::string& text) const;
  int64_t vocab_size() const;
  int64_t eos_id() const;  // -1 when the model defines none
  // Megatron-LM's figures for this model under a sentencepiece --tokenizer-type
  // (Note [Megatron-LM's tokenizer vocabulary]).
  TokenizerVocab megatron_vocab(const std::string& type) const;

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
