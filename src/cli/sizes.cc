// Sizes with units (CLI11's AsSizeValue reads whole numbers only: "7.5GiB" would be refused).
#include "cli/sizes.h"

#include <cctype>
#include <cmath>
#include <exception>
#include <utility>

namespace tandem::cli {

std::optional<double> parse_size(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {{"kib", 1024.0},
                                                          {"mib", 1024.0 * 1024},
                                                          {"gib", 1024.0 * 1024 * 1024},
                                                          {"tib", 1024.0 * 1024 * 1024 * 1024},
                                                          {"kb", 1e3},
                                                          {"mb", 1e6},
                                                          {"gb", 1e9},
                                                          {"tb", 1e12},
                                                          {"b", 1.0}};
  std::string lower;
  for (const char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double factor = 1;
  for (const auto& [unit, f] : kUnits) {
    const std::string u = unit;
    if (lower.size() > u.size() && lower.compare(lower.size() - u.size(), u.size(), u) == 0) {
      lower.resize(lower.size() - u.size());
      factor = f;
      break;
    }
  }
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(lower, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != lower.size() || !(v >= 0) || !std::isfinite(v * factor)) {
    return std::nullopt;
  }
  return v * factor;
}

}  // namespace tandem::cli
