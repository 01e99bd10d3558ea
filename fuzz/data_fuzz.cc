// libFuzzer target for the data readers: any bytes, as an llm.c token file, a Megatron .idx/.bin
// pair, a JSONL file of documents or a tokenizer helper's ids, must either be read (every token,
// every document) or be rejected with tandem::Error. Any other exception, a sanitizer report, an
// abort (a broken TANDEM_ASSERT) or a hang is a bug, and libFuzzer stops with the input.
// The first byte picks the reader; for a Megatron pair the next two give the .idx's length.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/file_dataset.h"
#include "data/tokenizer.h"

namespace {

std::string scratch(const char* suffix) {
  const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return std::string(dir) + "/tandem_data_fuzz_" + std::to_string(::getpid()) + suffix;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

// Opens the data set (which checks every id) and reads its first samples and documents.
void read_dataset(const std::string& path, tandem::data::DatasetFormat format) {
  const auto ds = tandem::data::open_file_dataset(path, format, 300, 7, 2);
  std::vector<int32_t> out(2);
  for (int64_t i = 0; i < 4; ++i) ds->sample(i, out.data(), 2);
  const int64_t docs = std::min<int64_t>(ds->num_documents(), 64);
  for (int64_t d = 0; d <= docs && ds->num_documents() > 0; ++d) ds->document_start(d);
}

void read_ids(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  if (!std::getline(in, line)) return;
  const tandem::data::IdsHeader h = tandem::data::parse_ids_header(line, "fuzz");
  for (int64_t n = 2; std::getline(in, line); ++n) {
    tandem::data::parse_ids_line(line, h.vocab_size, "fuzz", n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0] % 4;
  data += 1;
  size -= 1;
  try {
    if (mode == 0) {
      static const std::string path = scratch(".tokens");
      write_file(path, data, size);
      read_dataset(path, tandem::data::DatasetFormat::kTokens);
    } else if (mode == 1) {
      static const std::string prefix = scratch("");
      const size_t idx = std::min<size_t>(size - 2, data[0] | (data[1] << 8));
      write_file(prefix + ".idx", data + 2, idx);
      write_file(prefix + ".bin", data + 2 + idx, size - 2 - idx);
      read_dataset(prefix, tandem::data::DatasetFormat::kMegatron);
    } else if (mode == 2) {
      static const std::string path = scratch(".jsonl");
      write_file(path, data, size);
      tandem::data::for_each_document(path, "text", [](const std::string&, int64_t) {});
    } else {
      read_ids(data, size);
    }
  } catch (const tandem::Error&) {
    // A clear rejection: what a reader must do with a bad file.
  }
  for (const char* suffix : {".tokens", ".idx", ".bin", ".jsonl"}) {
    ::unlink(scratch(suffix).c_str());
  }
  return 0;
}
