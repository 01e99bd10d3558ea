// Writing llm.c token files (tests and `tandem convert`): header then tokens, into a temporary
// file beside the target that is synced and renamed into place (core/atomic_file.h), so the
// target name only ever holds a complete file.
#include <algorithm>
#include <limits>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/file_dataset.h"
#include "data/mapped_file.h"

namespace tandem::data {
namespace {

std::vector<unsigned char> llmc_header(int64_t count) {
  std::vector<unsigned char> header(kLlmcHeaderBytes, 0);
  const int32_t fields[3] = {kLlmcMagic, 1, static_cast<int32_t>(count)};
  for (int f = 0; f < 3; ++f) {
    const uint32_t v = static_cast<uint32_t>(fields[f]);
    for (int b = 0; b < 4; ++b) header[f * 4 + b] = static_cast<unsigned char>(v >> (8 * b));
  }
  return header;
}

void check_count(int64_t count, const std::string& what) {
  TANDEM_CHECK(count >= 0 && count <= std::numeric_limits<int32_t>::max(), what, " has ", count,
               " tokens; an llm.c token file holds at most ", std::numeric_limits<int32_t>::max(),
               " (split the input)");
}

}  // namespace

void write_token_file(const std::string& out_path, const uint16_t* tokens, int64_t count) {
  check_count(count, "token file '" + out_path + "'");
  AtomicFileWriter out(out_path);
  const std::vector<unsigned char> header = llmc_header(count);
  out.write(header.data(), kLlmcHeaderBytes);
  std::vector<unsigned char> chunk;
  constexpr int64_t kChunk = 1 << 16;
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    chunk.resize(static_cast<size_t>(n * 2));
    for (int64_t i = 0; i < n; ++i) {
      chunk[i * 2] = static_cast<unsigned char>(tokens[begin + i] & 0xff);
      chunk[i * 2 + 1] = static_cast<unsigned char>(tokens[begin + i] >> 8);
    }
    out.write(chunk.data(), n * 2);
  }
  out.commit();
}

void convert_text_to_tokens(const std::string& text_path, const std::string& out_path) {
  const MappedFile text(text_path);
  const int64_t count = text.size();
  check_count(count, "text file '" + text_path + "'");
  AtomicFileWriter out(out_path);
  const std::vector<unsigned char> header = llmc_header(count);
  out.write(header.data(), kLlmcHeaderBytes);
  std::vector<unsigned char> chunk;
  constexpr int64_t kChunk = 1 << 16;
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    chunk.assign(static_cast<size_t>(n * 2), 0);
    for (int64_t i = 0; i < n; ++i) chunk[i * 2] = text.data()[begin + i];  // high byte 0
    out.write(chunk.data(), n * 2);
  }
  out.commit();
}

}  // namespace tandem::data
