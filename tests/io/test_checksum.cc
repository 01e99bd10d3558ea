// CRC-32C. Oracle: the check value of the CRC catalogue (crc32c("123456789") = 0xe3069283) and
// RFC 3720's test vectors, and agreement between the streamed file checksum and the in-memory one.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/checksum.h"

namespace tandem::io {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(0, ones.data(), ones.size()), 0x62a8ab43u);
  // Extending in pieces equals one pass.
  EXPECT_EQ(crc32c(crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
  EXPECT_EQ(crc32c_hex(0xe3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x0000abcdu), "0000abcd");
}

TEST(Crc32c, FileMatchesMemoryAndSeesOneBit) {
  std::string pattern = (std::filesystem::temp_directory_path() / "tandem_crc_XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string path = pattern + "/data";
  std::string bytes(3 << 20, '\0');  // more than one read block
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + (i >> 11));
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(file_crc32c(path), crc32c(0, bytes.data(), bytes.size()));
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(file_crc32c(path), crc32c(0, bytes.data(), bytes.size()));
  EXPECT_THROW(file_crc32c(pattern + "/missing"), Error);
  std::filesystem::remove_all(pattern);
}

}  // namespace
}  // namespace tandem::io
