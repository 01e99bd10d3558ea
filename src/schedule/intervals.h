// Sets of time intervals, as the runtime measures a step's streams and the planner simulates them:
// what is exposed of one stream's work while another is idle.
#pragma once

#include <utility>
#include <vector>

namespace tandem::schedule {

// [start, end) intervals in seconds.
using Intervals = std::vector<std::pair<double, double>>;

// Measure of `a` minus `b`, both sorted lists of disjoint [start, end) intervals.
double uncovered_time(const Intervals& a, const Intervals& b);
// The union of any intervals as a sorted list of disjoint ones (uncovered_time's input).
Intervals merge_intervals(Intervals v);

}  // namespace tandem::schedule
