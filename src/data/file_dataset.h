// Datasets read from files: raw bytes of any file, nanoGPT/llm.c token files and Megatron's
// indexed .bin/.idx pair, all seen as one flat stream of tokens that samples are windows of.
// Invariants: offsets are 64-bit (files past 4 GiB work); every token id handed out is checked
// against the vocabulary, and a bad one raises tandem::Error naming the file, the token index and
// its byte offset; headers are validated before any token is read.
//
// Note [Window order]: the stream of n tokens is cut into windows of `length` tokens with stride
// length - 1 (a window's last token, a target, is the next window's first input, as in
// Megatron's GPT samples). Sample index i is window permute(i mod W) of epoch i / W, where W is
// the number of windows and the permutation is a seeded Feistel permutation keyed by the epoch;
// each epoch also shifts every window by one seeded offset within the slack left at the end.
// So an epoch visits every window once, epochs differ, and any sample is random-access.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/enum_names.h"
#include "data/dataset.h"
#include "data/mapped_file.h"

namespace tandem::data {

// How token ids are stored in a file (little-endian).
enum class TokenType { kU8, kU16, kI32, kU32 };
int64_t token_type_size(TokenType type);

// The first token of sample `index` among `num_tokens` tokens for windows of `length` tokens
// (Note [Window order]); requires 1 <= length <= num_tokens.
int64_t window_start(uint64_t seed, int64_t index, int64_t num_tokens, int64_t length);

// The shared reader: a mapped file whose tokens start at a byte offset.
class FileTokenDataset : public Dataset {
 public:
  // Writes the window of `length` tokens chosen for `index` (Note [Window order]).
  void sample(int64_t index, int32_t* out, int64_t length) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string describe() const override;

  const std::string& path() const { return file_->path(); }
  int64_t num_tokens() const { return num_tokens_; }
  TokenType token_type() const { return token_type_; }
  // Byte offset in the file of token 0.
  int64_t data_offset() const { return data_offset_; }
  // The start token of sample `index` for windows of `length` tokens.
  int64_t window_start(int64_t index, int64_t length) const;
  // Tokens [start, start + length) of the stream, each checked against the vocabulary.
  void read_tokens(int64_t start, int32_t* out, int64_t length) const;
  // Every token of the file against the vocabulary (Note [Token ids checked up front]); throws
  // tandem::Error naming the first bad one as read_tokens does.
  void check_token_ids() const;
  uint64_t seed() const { return seed_; }
  // The documents the file records (a Megatron index does; the others record none: 0), and the
  // first token of document d for d in [0, num_documents()], num_documents() giving the end.
  // Used by Megatron's --split, which divides a file by documents (data/split.h).
  virtual int64_t num_documents() const { return 0; }
  virtual int64_t document_start(int64_t d) const;

 protected:
  FileTokenDataset(const std::string& data_path, std::string kind, int64_t vocab_size,
                   uint64_t seed);
  const MappedFile& file() const { return *file_; }
  void set_layout(int64_t data_offset, TokenType type, int64_t num_tokens);

 private:
  std::unique_ptr<MappedFile> file_;
  std::string kind_;
  int64_t vocab_size_;
  uint64_t seed_;
  int64_t data_offset_ = 0;
  TokenType token_type_ = TokenType::kU8;
  int64_t num_tokens_ = 0;
};

// Every byte of any file is one token (vocab 256 for a byte-level model).
class TextBytesDataset : public FileTokenDataset {
 public:
  TextBytesDataset(const std::string& path, int64_t vocab_size, uint64_t seed);
};

// nanoGPT/llm.c token files: a header of 256 int32 (header[0] = kLlmcMagic, header[1] = version:
// 1 for uint16 tokens, 2 for uint32 tokens; header[2] = token count), then the tokens.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;
class TokenFileDataset : public FileTokenDataset {
 public:
  TokenFileDataset(const std::string& path, int64_t vocab_size, uint64_t seed);
};

// Megatron-LM's indexed dataset (MMIDIDX index version 1): `prefix`.idx holds sequence lengths
// and byte pointers, `prefix`.bin the tokens; the sequences must lie back to back in the .bin
// (as Megatron's builder writes them) and are read as one stream, documents included.
// `path` may be the prefix or either file's name.
class MegatronDataset : public FileTokenDataset {
 public:
  MegatronDataset(const std::string& path, int64_t vocab_size, uint64_t seed);
  // Megatron's document indices: document d is sequences [doc[d], doc[d + 1]), so the index
  // records one more entry than documents. document_start reads the index again (a split asks
  // for a few boundaries, once) and throws naming the index when an entry is out of order.
  int64_t num_documents() const override { return num_documents_; }
  int64_t document_start(int64_t d) const override;

 private:
  std::string idx_path_;
  int64_t num_sequences_ = 0, num_documents_ = 0;
};
// True when `path` names a Megatron pair (prefix, .bin or .idx) whose .idx starts with MMIDIDX.
bool is_megatron_dataset(const std::string& path);

enum class DatasetFormat : uint8_t { kAuto, kTokens, kText, kMegatron };
// --data-format's names (Note [One name table per enumeration] in core/enum_names.h).
inline constexpr EnumName<DatasetFormat> kDatasetFormatNames[] = {
    {DatasetFormat::kAuto, "auto"},
    {DatasetFormat::kTokens, "tokens"},
    {DatasetFormat::kText, "text"},
    {DatasetFormat::kMegatron, "megatron"}};
constexpr std::span<const EnumName<DatasetFormat>> enum_names(DatasetFormat) {
  return kDatasetFormatNames;
}
// A name of the table; throws naming the valid names otherwise.
DatasetFormat parse_dataset_format(const std::string& name);

// Opens `path` in `format` (kAuto: Megatron when a .idx with the MMIDIDX header sits beside it,
// an llm.c token file when the file starts with kLlmcMagic, raw bytes otherwise) and checks it
// holds at least one sample of `seq_plus_one` tokens and that every token id is in the
// vocabulary (check_token_ids).
std::unique_ptr<FileTokenDataset> open_file_dataset(const std::string& path, DatasetFormat format,
                                                    int64_t vocab_size, uint64_t seed,
                                                    int64_t seq_plus_one);
std::unique_ptr<Dataset> open_dataset(const std::string& path, DatasetFormat format,
                                      int64_t vocab_size, uint64_t seed, int64_t seq_plus_one);
std::unique_ptr<Dataset> open_dataset(const std::string& path, const std::string& format,
                                      int64_t vocab_size, uint64_t seed, int64_t seq_plus_one);

// Writes an llm.c version-1 token file of `count` uint16 tokens: to a temporary file beside
// `out_path`, synced, then renamed into place, so a partial file never appears under that name.
void write_token_file(const std::string& out_path, const uint16_t* tokens, int64_t count);

// `tandem convert`: the bytes of `text_path` as an llm.c version-1 token file (same atomicity as
// write_token_file). Throws when the text is longer than an llm.c header can count (2^31 - 1).
void convert_text_to_tokens(const std::string& text_path, const std::string& out_path);

}  // namespace tandem::data
