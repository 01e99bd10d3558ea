// The measured trace's tracks (runtime/timeline.h): each span goes to the thread named after its
// stream, and a track is named only when some span is on it (compute and comm always). Oracle:
// the Chrome trace JSON parsed back.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "planner/pipeline_model.h"
#include "runtime/timeline.h"

namespace tandem::runtime {
namespace {

// thread id -> its name, and span name -> its thread id, from one rank's events.
struct Parsed {
  std::map<int, std::string> tracks;
  std::map<std::string, int> span_tid;
};

Parsed parse(const std::string& events) {
  Parsed p;
  for (const auto& e : nlohmann::json::parse("[" + events + "]")) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      p.tracks[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    } else if (e["ph"] == "X") {
      p.span_tid[e["name"].get<std::string>()] = e["tid"].get<int>();
    }
  }
  return p;
}

TEST(Timeline, EverySpanIsOnTheTrackOfItsStream) {
  const std::vector<Span> spans = {
      {"compute", "F0 attention", 0, 1}, {"comm", "F0 dispatch", 1, 2},
      {"host", "F0 experts", 0, 0.5},    {"compute2", "B1 experts", 1, 3},
      {"comm2", "B1 combine", 0.5, 1},   {"reduce", "reduce layer 3", 2, 4}};
  const Parsed p = parse(rank_trace_events(0, spans, {}, 0));
  EXPECT_EQ(p.tracks.size(), spans.size());
  for (const Span& s : spans) {
    ASSERT_TRUE(p.span_tid.count(s.name)) << s.name;
    EXPECT_EQ(p.tracks.at(p.span_tid.at(s.name)), s.stream) << s.name;
  }
  // The planner's streams keep their rows when a measured and a planned trace are open together.
  EXPECT_EQ(p.span_tid.at("F0 attention"), static_cast<int>(schedule::Stream::kCompute));
  EXPECT_EQ(p.span_tid.at("F0 dispatch"), static_cast<int>(schedule::Stream::kComm));
  EXPECT_EQ(p.span_tid.at("reduce layer 3"), static_cast<int>(schedule::Stream::kReduce));
}

TEST(Timeline, OnlyTracksWithSpansAreNamedBesideComputeAndComm) {
  const Parsed p = parse(rank_trace_events(1, {{"compute", "F0 embed", 0, 1}}, {}, 0));
  ASSERT_EQ(p.tracks.size(), 2u);
  EXPECT_EQ(p.tracks.at(0), "compute");
  EXPECT_EQ(p.tracks.at(1), "comm");
}

}  // namespace
}  // namespace tandem::runtime
