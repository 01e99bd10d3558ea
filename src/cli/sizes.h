// Sizes in bytes as options take them: "5GB", "7.5GiB", "141e9", "512MB".
#pragma once

#include <optional>
#include <string>

namespace tandem::cli {

// What a valid size looks like, for messages.
inline constexpr const char* kSizeForms =
    "bytes (141e9) or a number with a unit (80GiB, 7.5GiB, 512MB; KiB MiB GiB TiB are powers of "
    "1024, KB MB GB TB of 1000)";

// The bytes `text` names (units case-insensitive), or nullopt when it is not a size >= 0.
std::optional<double> parse_size(const std::string& text);

}  // namespace tandem::cli
