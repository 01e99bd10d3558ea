#include "runtime/alltoall_wait.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "schedule/intervals.h"

namespace tandem::runtime {

std::string alltoall_durations_text(const std::vector<AllToAllSpan>& mine) {
  std::string out;
  char buf[64];
  for (const AllToAllSpan& s : mine) {
    std::snprintf(buf, sizeof buf, "\t%.17g\n", s.end - s.start);
    out += s.name + buf;
  }
  return out;
}

namespace {

// The durations of one rank's text, if it names mine's all-to-alls in mine's order.
bool durations_of(const std::string& text, const std::vector<AllToAllSpan>& mine,
                  std::vector<double>& out) {
  out.clear();
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.rfind('\t');
    if (tab == std::string::npos || out.size() >= mine.size()) return false;
    if (line.compare(0, tab, mine[out.size()].name) != 0) return false;
    out.push_back(std::strtod(line.c_str() + tab + 1, nullptr));
  }
  return out.size() == mine.size();
}

}  // namespace

double exposed_waiting_seconds(const std::vector<AllToAllSpan>& mine,
                               const std::vector<std::string>& groups_text,
                               const std::vector<std::pair<double, double>>& compute) {
  std::vector<double> shortest(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) shortest[i] = mine[i].end - mine[i].start;
  std::vector<double> theirs;
  for (const std::string& text : groups_text) {
    if (!durations_of(text, mine, theirs)) return -1;
    for (size_t i = 0; i < mine.size(); ++i) shortest[i] = std::min(shortest[i], theirs[i]);
  }
  std::vector<std::pair<double, double>> whole, transfer;
  for (size_t i = 0; i < mine.size(); ++i) {
    whole.emplace_back(mine[i].start, mine[i].end);
    // The last arrival's duration, ending where this rank's ends.
    transfer.emplace_back(std::max(mine[i].start, mine[i].end - shortest[i]), mine[i].end);
  }
  const auto busy = schedule::merge_intervals(compute);
  const double exposed = schedule::uncovered_time(schedule::merge_intervals(whole), busy);
  const double exposed_transfer =
      schedule::uncovered_time(schedule::merge_intervals(transfer), busy);
  return std::max(0.0, exposed - exposed_transfer);
}

}  // namespace tandem::runtime
