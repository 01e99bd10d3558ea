// libFuzzer target for the safetensors reader: any bytes, written to a file, must either load or
// be rejected with tandem::Error. Any other exception, a sanitizer report, an abort (a broken
// TANDEM_ASSERT) or a hang is a bug, and libFuzzer stops with the input that caused it.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// A per-process scratch file, in /dev/shm when there is one (it is rewritten for every input);
// removed after each input, so a finished run leaves nothing behind.
std::string scratch_path() {
  const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return std::string(dir) + "/tandem_fuzz_" + std::to_string(::getpid()) + ".safetensors";
}

void write_input(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

void load_and_read(const std::string& path) {
  try {
    const auto tensors = tandem::io::load_safetensors(path, tandem::MemCategory::kOther);
    for (const auto& [name, t] : tensors) {
      const tandem::DType d = t.dtype();
      if (d == tandem::DType::kF32 || d == tandem::DType::kF64 || d == tandem::DType::kBF16) {
        tandem::io::to_float(t, tandem::DType::kF32);  // reads every element
      }
    }
  } catch (const tandem::Error&) {
    // A clear rejection: what the reader must do with a bad file.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = scratch_path();
  write_input(path, data, size);
  load_and_read(path);
  ::unlink(path.c_str());
  return 0;
}
