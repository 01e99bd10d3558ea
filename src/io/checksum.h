// CRC-32C (Castagnoli) of memory and of files, for the per-file checksums a checkpoint records:
// a bit flip inside tensor data passes every structural check, so only a checksum catches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::io {

// Extends `crc` (0 to start) by `bytes` bytes at `data`; crc32c("123456789") = 0xe3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t bytes);

// The CRC-32C of the whole file at `path`, read in blocks; throws naming the file on error.
uint32_t file_crc32c(const std::string& path);

// "e3069283": eight lowercase hex digits, as checkpoints store it.
std::string crc32c_hex(uint32_t crc);

}  // namespace tandem::io
