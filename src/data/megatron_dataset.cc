// Megatron-LM's indexed dataset (.idx index version 1, "MMIDIDX\0\0"), as written by
// megatron/core/datasets/indexed_dataset.py's _IndexWriter:
//   9 bytes magic | u64 version (1) | u8 dtype code | u64 sequence count S | u64 document count D
//   | int32 lengths[S] | int64 byte pointers[S] | int64 document indices[D] | (int8 modes[S])
// The whole index is validated before a token is read; sequences must be contiguous in the .bin.
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "data/file_dataset.h"

namespace tandem::data {
namespace {

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kIndexFixedBytes = 9 + 8 + 1 + 8 + 8;

std::string megatron_prefix(const std::string& path) {
  const auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return path.size() >= n && path.compare(path.size() - n, n, suffix) == 0;
  };
  if (ends_with(".bin") || ends_with(".idx")) return path.substr(0, path.size() - 4);
  return path;
}

uint64_t read_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

TokenType token_type_of_code(int code, const std::string& idx_path) {
  // Megatron's DType codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
  // 8 uint16; token ids are stored as uint8, uint16 or int32.
  switch (code) {
    case 1:
      return TokenType::kU8;
    case 8:
      return TokenType::kU16;
    case 4:
      return TokenType::kI32;
    default:
      break;
  }
  TANDEM_CHECK(false, "Megatron index '", idx_path, "' has dtype code ", code,
               "; supported token types: 1 (uint8), 8 (uint16), 4 (int32)");
  return TokenType::kU8;
}

struct IndexLayout {
  TokenType type;
  int64_t num_tokens;
  int64_t sequences, document_indices;
};

// Checks the index against itself and the .bin's size; returns the token stream's layout.
IndexLayout read_index(const std::string& idx_path, int64_t bin_size) {
  const MappedFile idx(idx_path);
  const int64_t size = idx.size();
  TANDEM_CHECK(size >= kIndexFixedBytes, "Megatron index '", idx_path, "' is ", size,
               " bytes, shorter than its ", kIndexFixedBytes, "-byte header");
  const unsigned char* p = idx.data();
  TANDEM_CHECK(std::memcmp(p, kIndexMagic, 9) == 0, "Megatron index '", idx_path,
               "' does not start with MMIDIDX\\0\\0");
  const uint64_t version = read_u64(p + 9);
  TANDEM_CHECK(version == 1, "Megatron index '", idx_path, "' has version ", version,
               "; supported: 1");
  const TokenType type = token_type_of_code(p[17], idx_path);
  const uint64_t seqs = read_u64(p + 18);
  const uint64_t docs = read_u64(p + 26);
  // Bounds first, in a way that cannot overflow: each array must fit in what is left.
  const uint64_t rest = static_cast<uint64_t>(size - kIndexFixedBytes);
  TANDEM_CHECK(seqs <= rest / 12 && docs <= (rest - seqs * 12) / 8, "Megatron index '", idx_path,
               "' claims ", seqs, " sequences and ", docs, " documents, more than its ", size,
               " bytes can hold");
  const uint64_t needed = seqs * 12 + docs * 8;
  TANDEM_CHECK(rest == needed || rest == needed + seqs, "Megatron index '", idx_path, "' is ", size,
               " bytes; ", seqs, " sequences and ", docs, " documents need ",
               kIndexFixedBytes + needed, " (or ", kIndexFixedBytes + needed + seqs,
               " with sequence modes)");
  const unsigned char* lengths = p + kIndexFixedBytes;
  const unsigned char* pointers = lengths + seqs * 4;
  const int64_t width = token_type_size(type);
  int64_t tokens = 0;
  for (uint64_t i = 0; i < seqs; ++i) {
    int32_t length = 0;
    std::memcpy(&length, lengths + i * 4, 4);
    const uint64_t pointer = read_u64(pointers + i * 8);
    TANDEM_CHECK(length >= 0, "Megatron index '", idx_path, "': sequence ", i,
                 " has negative length ", length);
    TANDEM_CHECK(pointer == static_cast<uint64_t>(tokens * width), "Megatron index '", idx_path,
                 "': sequence ", i, " starts at byte ", pointer, " of the .bin, expected ",
                 tokens * width, " (sequences must be stored back to back)");
    TANDEM_CHECK(tokens + length <= bin_size / width, "Megatron index '", idx_path, "': sequence ",
                 i, " ends past the .bin's ", bin_size, " bytes");
    tokens += length;
  }
  TANDEM_CHECK(tokens * width == bin_size, "Megatron index '", idx_path, "' covers ",
               tokens * width, " bytes of tokens but the .bin is ", bin_size, " bytes");
  return {type, tokens, static_cast<int64_t>(seqs), static_cast<int64_t>(docs)};
}

}  // namespace

bool is_megatron_dataset(const std::string& path) {
  const std::string prefix = megatron_prefix(path);
  if (regular_file_size(prefix + ".bin") < 0) return false;
  std::FILE* f = std::fopen((prefix + ".idx").c_str(), "rb");
  if (f == nullptr) return false;
  char magic[9] = {};
  const size_t got = std::fread(magic, 1, 9, f);
  std::fclose(f);
  return got == 9 && std::memcmp(magic, kIndexMagic, 9) == 0;
}

MegatronDataset::MegatronDataset(const std::string& path, int64_t vocab_size, uint64_t seed)
    : FileTokenDataset(megatron_prefix(path) + ".bin", "Megatron dataset", vocab_size, seed) {
  idx_path_ = megatron_prefix(path) + ".idx";
  const IndexLayout layout = read_index(idx_path_, file().size());
  set_layout(0, layout.type, layout.num_tokens);
  num_sequences_ = layout.sequences;
  // An index without document indices counts as recording no documents.
  num_documents_ = layout.document_indices > 0 ? layout.document_indices - 1 : 0;
}

int64_t MegatronDataset::document_start(int64_t d) const {
  TANDEM_ASSERT(d >= 0 && d <= num_documents_, "document ", d, " of ", num_documents_);
  const MappedFile idx(idx_path_);
  const unsigned char* lengths = idx.data() + kIndexFixedBytes;
  const unsigned char* documents = lengths + num_sequences_ * 12;
  const uint64_t first = read_u64(documents + d * 8);
  TANDEM_CHECK(first <= static_cast<uint64_t>(num_sequences_), "Megatron index '", idx_path_,
               "': document ", d, " starts at sequence ", first, " but the index has ",
               num_sequences_, " sequences");
  int64_t tokens = 0;
  for (uint64_t i = 0; i < first; ++i) {
    int32_t length = 0;
    std::memcpy(&length, lengths + i * 4, 4);  // read_index checked every length
    tokens += length;
  }
  return tokens;
}

}  // namespace tandem::data
