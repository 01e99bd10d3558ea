// Reading a small text input whole (text_file.h).
#include "core/text_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace tandem {

std::string read_text_input(const std::string& path, const std::string& what, int64_t max_bytes) {
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), what, " is a directory; give a file");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  TANDEM_CHECK(f != nullptr, "cannot read ", what, " (", std::strerror(errno), ")");
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) {
    text.append(buf, n);
    TANDEM_CHECK(static_cast<int64_t>(text.size()) <= max_bytes, what, " holds more than ",
                 max_bytes, " bytes, more than any such file: is it the right path?");
  }
  TANDEM_CHECK(!std::ferror(f.get()), "cannot read ", what, " (", std::strerror(errno), ")");
  return text;
}

}  // namespace tandem
