// CRC-32C, table-driven (reflected polynomial 0x82f63b78), one byte per step: checkpoints are
// read from disk anyway, and this keeps the code obviously right.
#include "io/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace tandem::io {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78U : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) crc = kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t file_crc32c(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "cannot open '", path, "' to check it: ", std::strerror(errno));
  std::vector<unsigned char> block(size_t{1} << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      TANDEM_CHECK(n == 0, "cannot read '", path, "': ", std::strerror(err));
      return crc;
    }
    crc = crc32c(crc, block.data(), static_cast<size_t>(n));
  }
}

std::string crc32c_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

}  // namespace tandem::io
