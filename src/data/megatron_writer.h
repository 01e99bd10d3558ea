// Writing Megatron-LM indexed data sets (`tandem convert` with a tokenizer): PREFIX.bin with the
// tokens and PREFIX.idx with the index that data/megatron_dataset.cc reads, as Megatron's
// _IndexWriter writes them (index version 1, one sequence per document).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {
class AtomicFileWriter;
}  // namespace tandem

namespace tandem::data {

// Megatron's DType.optimal_dtype: uint16 tokens for vocabularies under 65500, else int32.
int64_t megatron_token_bytes(int64_t vocab_size);

// Documents are added one at a time; finish() writes the index and renames both files into
// place (each through a temporary file beside it, so neither name ever holds a partial file).
// Nothing appears under the names unless finish() is reached.
class MegatronWriter {
 public:
  MegatronWriter(const std::string& prefix, int64_t vocab_size);
  ~MegatronWriter();
  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;

  // One document of ids in [0, vocab_size); an empty one is not recorded.
  void add_document(const std::vector<int32_t>& ids);
  void finish();

  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return tokens_; }

 private:
  std::string prefix_;
  int64_t vocab_size_;
  int64_t width_;  // bytes per token
  std::unique_ptr<AtomicFileWriter> bin_;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
  std::vector<unsigned char> buffer_;
};

}  // namespace tandem::data
