// File datasets: window sampling (Note [Window order]), the shared token reader with vocabulary
// checks, raw-byte and llm.c token files, and the format factory.
#include "data/file_dataset.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"
#include "data/random.h"

namespace tandem::data {
namespace {

constexpr uint64_t kWindowStream = 0x7769'6e64'6f77'0001ULL;
constexpr uint64_t kShiftStream = 0x7368'6966'7400'0002ULL;

int32_t read_le_i32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return static_cast<int32_t>(v);
}

// The id stored at p as a 64-bit value (signed for kI32, so a negative id is caught).
int64_t read_token(const unsigned char* p, TokenType type) {
  switch (type) {
    case TokenType::kU8:
      return p[0];
    case TokenType::kU16:
      return static_cast<int64_t>(p[0]) | (static_cast<int64_t>(p[1]) << 8);
    case TokenType::kI32:
      return read_le_i32(p);
    case TokenType::kU32:
      return static_cast<uint32_t>(read_le_i32(p));
  }
  return -1;
}

constexpr EnumName<TokenType> kTokenTypeNames[] = {{TokenType::kU8, "uint8"},
                                                   {TokenType::kU16, "uint16"},
                                                   {TokenType::kI32, "int32"},
                                                   {TokenType::kU32, "uint32"}};

std::string_view token_type_name(TokenType type) { return name_in(kTokenTypeNames, type); }

}  // namespace

int64_t token_type_size(TokenType type) {
  switch (type) {
    case TokenType::kU8:
      return 1;
    case TokenType::kU16:
      return 2;
    case TokenType::kI32:
      return 4;
    case TokenType::kU32:
      return 4;
  }
  return 0;
}

int64_t window_start(uint64_t seed, int64_t index, int64_t num_tokens, int64_t length) {
  TANDEM_ASSERT(index >= 0 && length >= 1 && length <= num_tokens, "index ", index, " length ",
                length, " of ", num_tokens, " tokens");
  const int64_t stride = std::max<int64_t>(1, length - 1);
  const int64_t windows = (num_tokens - length) / stride + 1;
  const int64_t slack = (num_tokens - length) - (windows - 1) * stride;  // in [0, stride)
  const uint64_t epoch = static_cast<uint64_t>(index / windows);
  const uint64_t position = static_cast<uint64_t>(index % windows);
  const uint64_t key = stream_key(seed, kWindowStream, epoch);
  const uint64_t window = permute_index(position, static_cast<uint64_t>(windows), key);
  const uint64_t shift =
      uniform_below(stream_key(seed, kShiftStream, epoch), static_cast<uint64_t>(slack + 1));
  return static_cast<int64_t>(window) * stride + static_cast<int64_t>(shift);
}

FileTokenDataset::FileTokenDataset(const std::string& data_path, std::string kind,
                                   int64_t vocab_size, uint64_t seed)
    : file_(std::make_unique<MappedFile>(data_path)),
      kind_(std::move(kind)),
      vocab_size_(vocab_size),
      seed_(seed) {
  TANDEM_CHECK(vocab_size >= 1, "vocab size ", vocab_size, " for ", kind_, " '", data_path,
               "' is invalid: it must be >= 1");
}

void FileTokenDataset::set_layout(int64_t data_offset, TokenType type, int64_t num_tokens) {
  TANDEM_ASSERT(data_offset >= 0 && num_tokens >= 0 &&
                    data_offset + num_tokens * token_type_size(type) <= file_->size(),
                "layout beyond '", file_->path(), "'");
  data_offset_ = data_offset;
  token_type_ = type;
  num_tokens_ = num_tokens;
}

std::string FileTokenDataset::describe() const {
  return kind_ + " '" + path() + "' (" + std::to_string(num_tokens_) + " " +
         std::string(token_type_name(token_type_)) + " tokens, vocab " +
         std::to_string(vocab_size_) + ", seed " + std::to_string(seed_) + ")";
}

int64_t FileTokenDataset::window_start(int64_t index, int64_t length) const {
  TANDEM_CHECK(index >= 0, "sample index ", index, " is invalid: it must be >= 0");
  TANDEM_CHECK(length >= 1 && length <= num_tokens_, "a sample of ", length, " tokens from ", kind_,
               " '", path(), "' is impossible: it holds ", num_tokens_,
               " tokens; use a sequence length below that");
  return tandem::data::window_start(seed_, index, num_tokens_, length);
}

void FileTokenDataset::sample(int64_t index, int32_t* out, int64_t length) const {
  read_tokens(window_start(index, length), out, length);
}

int64_t FileTokenDataset::document_start(int64_t d) const {
  TANDEM_ASSERT(false, kind_, " '", path(), "' records no documents (asked for document ", d, ")");
  return 0;
}

void FileTokenDataset::read_tokens(int64_t start, int32_t* out, int64_t length) const {
  TANDEM_CHECK(start >= 0 && length >= 0 && length <= num_tokens_ - start, "tokens [", start, ", ",
               start + length, ") are outside ", kind_, " '", path(), "', which holds ",
               num_tokens_, " tokens");
  const int64_t width = token_type_size(token_type_);
  const unsigned char* base = file_->data() + data_offset_;
  for (int64_t i = 0; i < length; ++i) {
    const int64_t token = start + i;
    const int64_t id = read_token(base + token * width, token_type_);
    TANDEM_CHECK(id >= 0 && id < vocab_size_, kind_, " '", path(), "': token ", token,
                 " (byte offset ", data_offset_ + token * width, ") has id ", id,
                 ", outside the vocabulary [0, ", vocab_size_,
                 "); use a larger --vocab-size or a file made for this vocabulary");
    out[i] = static_cast<int32_t>(id);
  }
}

// Note [Token ids checked up front]: a data set checks every token id of its file against the
// vocabulary when it is opened, before training starts. Checked only as samples were read, a bad
// id late in the file stopped the run after checkpoints and log lines had been written. The
// check is one pass over the mapped file, a comparison over chunks that the compiler vectorises:
// it costs about one read of the file (from the page cache, memory speed; from disk, the
// disk's), and nothing when the token type cannot hold an id outside the vocabulary (uint8 with
// a vocabulary of 256 or more, uint16 with 65536 or more). Only a chunk with a bad id is read
// again, token by token, to name its first bad one.
namespace {

// Whether any of the n ids at p lies outside [0, vocab). Each id is widened to int32 (a uint32
// id of 2^31 or more wraps negative: outside too) and compared signed, which SSE2 has for 32-bit
// lanes (unlike 16-bit unsigned min/max), so the loop vectorises on any x86-64.
template <class T>
bool any_outside(const unsigned char* p, int64_t n, int32_t vocab) {
  int32_t outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));  // little-endian host
    const auto id = static_cast<int32_t>(v);
    outside |= static_cast<int32_t>(id < 0) | static_cast<int32_t>(id >= vocab);
  }
  return outside != 0;
}

}  // namespace

void FileTokenDataset::check_token_ids() const {
  const int64_t width = token_type_size(token_type_);
  if (token_type_ == TokenType::kU8 && vocab_size_ >= 256) return;
  if (token_type_ == TokenType::kU16 && vocab_size_ >= 65536) return;
  const auto vocab =
      static_cast<int32_t>(std::min<int64_t>(vocab_size_, std::numeric_limits<int32_t>::max()));
  constexpr int64_t kChunk = int64_t{1} << 20;
  const unsigned char* base = file_->data() + data_offset_;
  std::vector<int32_t> ids;
  for (int64_t begin = 0; begin < num_tokens_; begin += kChunk) {
    const int64_t n = std::min(kChunk, num_tokens_ - begin);
    const unsigned char* p = base + begin * width;
    bool outside = false;
    switch (token_type_) {
      case TokenType::kU8:
        outside = any_outside<uint8_t>(p, n, vocab);
        break;
      case TokenType::kU16:
        outside = any_outside<uint16_t>(p, n, vocab);
        break;
      case TokenType::kI32:
        outside = any_outside<int32_t>(p, n, vocab);
        break;
      case TokenType::kU32:
        outside = any_outside<uint32_t>(p, n, vocab);
        break;
    }
    if (!outside) continue;
    ids.resize(static_cast<size_t>(n));
    read_tokens(begin, ids.data(), n);  // throws naming the first bad token
  }
}

TextBytesDataset::TextBytesDataset(const std::string& path, int64_t vocab_size, uint64_t seed)
    : FileTokenDataset(path, "text file", vocab_size, seed) {
  set_layout(0, TokenType::kU8, file().size());
}

TokenFileDataset::TokenFileDataset(const std::string& path, int64_t vocab_size, uint64_t seed)
    : FileTokenDataset(path, "token file", vocab_size, seed) {
  const int64_t size = file().size();
  TANDEM_CHECK(size >= kLlmcHeaderBytes, "token file '", path, "' is ", size,
               " bytes, shorter than the ", kLlmcHeaderBytes, "-byte llm.c header");
  const unsigned char* h = file().data();
  const int32_t magic = read_le_i32(h);
  TANDEM_CHECK(magic == kLlmcMagic, "token file '", path, "' has magic number ", magic,
               " where an llm.c token file has ", kLlmcMagic, "; for raw text use the text format");
  const int32_t version = read_le_i32(h + 4);
  TANDEM_CHECK(version == 1 || version == 2, "token file '", path, "' has version ", version,
               "; supported: 1 (uint16 tokens) and 2 (uint32 tokens)");
  const TokenType type = version == 1 ? TokenType::kU16 : TokenType::kU32;
  const int64_t count = read_le_i32(h + 8);
  TANDEM_CHECK(count >= 0, "token file '", path, "' has a negative token count ", count);
  const int64_t expected = kLlmcHeaderBytes + count * token_type_size(type);
  TANDEM_CHECK(size == expected, "token file '", path, "' is ", size, " bytes but its header says ",
               count, " ", token_type_name(type), " tokens, which take ", expected,
               " bytes with the header: the file is ", size < expected ? "truncated" : "too long");
  set_layout(kLlmcHeaderBytes, type, count);
}

DatasetFormat parse_dataset_format(const std::string& name) {
  const std::optional<DatasetFormat> format = parse_enum<DatasetFormat>(name);
  if (format) return *format;
  const std::vector<std::string> names = enum_name_list<DatasetFormat>();
  std::string valid;
  for (size_t i = 0; i + 1 < names.size(); ++i) valid += (i ? ", " : "") + names[i];
  throw Error(detail::concat("data format '", name, "' is unknown: valid formats are ", valid,
                             " and ", names.back()));
}

namespace {

DatasetFormat detect_format(const std::string& path) {
  if (is_megatron_dataset(path)) return DatasetFormat::kMegatron;
  const int64_t size = regular_file_size(path);
  TANDEM_CHECK(size >= 0, "data path '", path,
               "' is not a regular file (nor the prefix of a Megatron .bin/.idx pair)");
  if (size >= kLlmcHeaderBytes) {
    const MappedFile file(path);
    if (read_le_i32(file.data()) == kLlmcMagic) return DatasetFormat::kTokens;
  }
  return DatasetFormat::kText;
}

}  // namespace

std::unique_ptr<FileTokenDataset> open_file_dataset(const std::string& path, DatasetFormat format,
                                                    int64_t vocab_size, uint64_t seed,
                                                    int64_t seq_plus_one) {
  TANDEM_CHECK(seq_plus_one >= 2, "sample length ", seq_plus_one,
               " is invalid: a sample needs at least 2 tokens (seq-length + 1)");
  if (format == DatasetFormat::kAuto) format = detect_format(path);
  std::unique_ptr<FileTokenDataset> ds;
  switch (format) {
    case DatasetFormat::kTokens:
      ds = std::make_unique<TokenFileDataset>(path, vocab_size, seed);
      break;
    case DatasetFormat::kText:
      ds = std::make_unique<TextBytesDataset>(path, vocab_size, seed);
      break;
    case DatasetFormat::kMegatron:
      ds = std::make_unique<MegatronDataset>(path, vocab_size, seed);
      break;
    case DatasetFormat::kAuto:
      TANDEM_ASSERT(false, "format detection returned auto");
  }
  TANDEM_CHECK(ds->num_tokens() >= seq_plus_one, ds->describe(), " holds fewer tokens than one ",
               "sample of seq-length + 1 = ", seq_plus_one,
               "; use a longer file or a shorter --seq-length");
  ds->check_token_ids();
  return ds;
}

std::unique_ptr<Dataset> open_dataset(const std::string& path, DatasetFormat format,
                                      int64_t vocab_size, uint64_t seed, int64_t seq_plus_one) {
  return open_file_dataset(path, format, vocab_size, seed, seq_plus_one);
}

std::unique_ptr<Dataset> open_dataset(const std::string& path, const std::string& format,
                                      int64_t vocab_size, uint64_t seed, int64_t seq_plus_one) {
  return open_dataset(path, parse_dataset_format(format), vocab_size, seed, seq_plus_one);
}

}  // namespace tandem::data
