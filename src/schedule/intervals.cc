// Interval arithmetic (intervals.h).
#include "schedule/intervals.h"

#include <algorithm>

namespace tandem::schedule {

double uncovered_time(const Intervals& a, const Intervals& b) {
  double out = 0;
  size_t j = 0;
  for (const auto& [start, end] : a) {
    double cur = start;
    while (j < b.size() && b[j].second <= cur) ++j;
    for (size_t k = j; k < b.size() && b[k].first < end && cur < end; ++k) {
      if (b[k].first > cur) out += b[k].first - cur;
      cur = std::max(cur, b[k].second);
    }
    if (cur < end) out += end - cur;
  }
  return out;
}

Intervals merge_intervals(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [start, end] : v) {
    if (!out.empty() && start <= out.back().second) {
      out.back().second = std::max(out.back().second, end);
    } else {
      out.emplace_back(start, end);
    }
  }
  return out;
}

}  // namespace tandem::schedule
