// The Megatron writer (megatron_writer.h); the layout is the one data/megatron_dataset.cc reads.
#include "data/megatron_writer.h"

#include <limits>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tandem::data {
namespace {

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

void put_le(std::vector<unsigned char>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

}  // namespace

int64_t megatron_token_bytes(int64_t vocab_size) { return vocab_size < 65500 ? 2 : 4; }

MegatronWriter::MegatronWriter(const std::string& prefix, int64_t vocab_size)
    : prefix_(prefix),
      vocab_size_(vocab_size),
      width_(megatron_token_bytes(vocab_size)),
      bin_(std::make_unique<AtomicFileWriter>(prefix + ".bin")) {
  TANDEM_CHECK(vocab_size >= 1 && vocab_size <= std::numeric_limits<int32_t>::max(),
               "a vocabulary of ", vocab_size, " ids cannot be written: 1 to 2^31 - 1");
}

MegatronWriter::~MegatronWriter() = default;

void MegatronWriter::add_document(const std::vector<int32_t>& ids) {
  if (ids.empty()) return;
  TANDEM_CHECK(ids.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "a document of ", ids.size(), " tokens is longer than a Megatron index can record");
  buffer_.clear();
  for (const int32_t id : ids) {
    TANDEM_ASSERT(id >= 0 && id < vocab_size_, "token id ", id, " outside [0, ", vocab_size_, ")");
    put_le(buffer_, static_cast<uint32_t>(id), static_cast<int>(width_));
  }
  bin_->write(buffer_.data(), static_cast<int64_t>(buffer_.size()));
  lengths_.push_back(static_cast<int32_t>(ids.size()));
  tokens_ += static_cast<int64_t>(ids.size());
}

void MegatronWriter::finish() {
  const uint64_t n = lengths_.size();
  std::vector<unsigned char> idx(kIndexMagic, kIndexMagic + 9);
  put_le(idx, 1, 8);                   // version
  idx.push_back(width_ == 2 ? 8 : 4);  // Megatron's DType codes: 8 uint16, 4 int32
  put_le(idx, n, 8);                   // sequences
  put_le(idx, n + 1, 8);               // document indices: one more than documents
  for (const int32_t length : lengths_) put_le(idx, static_cast<uint32_t>(length), 4);
  uint64_t pointer = 0;
  for (const int32_t length : lengths_) {
    put_le(idx, pointer, 8);
    pointer += static_cast<uint64_t>(length) * static_cast<uint64_t>(width_);
  }
  for (uint64_t d = 0; d <= n; ++d) put_le(idx, d, 8);  // one sequence per document
  AtomicFileWriter idx_file(prefix_ + ".idx");
  idx_file.write(idx.data(), static_cast<int64_t>(idx.size()));
  bin_->commit();
  idx_file.commit();
}

}  // namespace tandem::data
