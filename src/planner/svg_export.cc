// SVG chart of a plan: per rank a compute row and a comm row (with data parallelism a third, the
// gradient all-reduce's; spans of one action closer than
// half a pixel are merged, so the file stays small for big schedules), and beneath them the
// rank's memory curve (static + activations + in flight + workspace), all ranks on one byte scale.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "planner/planner.h"

namespace tandem::schedule {
namespace {

constexpr double kWidth = 1600, kLeft = 110, kRight = 20, kTop = 40, kRow = 16, kMem = 56,
                 kGap = 14;

const char* action_color(ActionKind kind, Phase phase) {
  switch (kind) {
    case ActionKind::kForward:
      return "#4e79a7";
    case ActionKind::kBackward:
      return phase == Phase::kBackwardWeight ? "#3b7a35" : "#59a14f";
    case ActionKind::kBackwardInput:
      return "#8cd17d";
    case ActionKind::kBackwardWeight:
      return "#9c9c9c";
    case ActionKind::kForwardBackward:
      return "#b07aa1";
    case ActionKind::kForwardForward:
      return "#76b7b2";
    case ActionKind::kSendF:
    case ActionKind::kSendB:
      return "#f28e2b";
    case ActionKind::kRecvF:
    case ActionKind::kRecvB:
      return "#ffbe7d";
  }
  return "#000";
}

struct Canvas {
  std::string out;
  double step;
  double x(double t) const { return kLeft + (step > 0 ? t / step : 0) * (kWidth - kLeft - kRight); }
  void rect(double x0, double y, double w, double h, const char* fill, const std::string& title) {
    char buf[384];
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                  "stroke=\"white\" stroke-width=\"0.4\"><title>%s</title></rect>\n",
                  x0, y, std::max(w, 0.3), h, fill, title.c_str());
    out += buf;
  }
  void text(double x0, double y, const std::string& s, const char* extra = "") {
    char buf[384];
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" %s>%s</text>\n", x0, y, extra,
                  s.c_str());
    out += buf;
  }
};

// The reduce stream's spans are drawn in one colour of their own, each titled by the action
// whose weight gradient made its unit final.
constexpr const char* kReduceColor = "#edc948";

void draw_stream(Canvas& c, const RankResult& r, const std::vector<Action>& list, Stream stream,
                 double y) {
  struct Box {
    double start, end;
    int32_t action;
    Phase phase;
  };
  std::vector<Box> boxes;
  for (const Span& s : r.spans) {
    if (s.stream != stream) continue;
    if (!boxes.empty() && boxes.back().action == s.action &&
        c.x(s.start) - c.x(boxes.back().end) < 0.5) {
      boxes.back().end = s.end;
      continue;
    }
    boxes.push_back({s.start, s.end, s.action, s.phase});
  }
  for (const Box& b : boxes) {
    const Action& a = list[b.action];
    const double x0 = c.x(b.start), w = c.x(b.end) - x0;
    const std::string label = to_string(a);
    c.rect(x0, y, w, kRow - 2,
           stream == Stream::kReduce ? kReduceColor : action_color(a.kind, b.phase),
           stream == Stream::kReduce ? "reduce after " + label : label);
    if (w >= 7.0 * static_cast<double>(label.size())) {
      c.text(x0 + 2, y + kRow - 5, label, "font-size=\"10\" fill=\"white\"");
    }
  }
}

// Bytes as MiB below a GiB, else GiB.
std::string byte_label(double bytes) {
  char buf[32];
  if (bytes < static_cast<double>(1 << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1 << 30));
  }
  return buf;
}

void draw_memory(Canvas& c, const RankResult& r, double y, double top_bytes) {
  const double base = static_cast<double>(r.static_memory.static_bytes());
  auto yv = [&](double bytes) { return y + kMem - (top_bytes > 0 ? bytes / top_bytes : 0) * kMem; };
  // Column maxima, so a curve of a million samples draws as at most a few thousand points.
  std::vector<double> col(static_cast<size_t>(kWidth) + 1, -1);
  double prev = base;
  for (const MemorySample& m : r.memory) {
    const auto px = static_cast<size_t>(std::clamp(c.x(m.time), 0.0, kWidth));
    const double v =
        base + static_cast<double>(m.activation_bytes + m.in_flight_bytes + m.workspace_bytes);
    col[px] = std::max({col[px], v, prev});
    prev = v;
  }
  std::string pts;
  char buf[64];
  double last = base;
  for (size_t px = static_cast<size_t>(kLeft); px < col.size() - static_cast<size_t>(kRight);
       ++px) {
    if (col[px] >= 0) last = col[px];
    std::snprintf(buf, sizeof buf, "%zu,%.1f ", px, yv(last));
    pts += buf;
  }
  c.out +=
      "<polyline fill=\"none\" stroke=\"#e15759\" stroke-width=\"1\" points=\"" + pts + "\"/>\n";
  std::snprintf(buf, sizeof buf, "%.1f", yv(base));
  c.out += std::string("<line x1=\"") + std::to_string(kLeft) + "\" x2=\"" +
           std::to_string(kWidth - kRight) + "\" y1=\"" + buf + "\" y2=\"" + buf +
           "\" stroke=\"#999\" stroke-dasharray=\"3,3\"/>\n";
  std::snprintf(buf, sizeof buf, "peak %s", byte_label(static_cast<double>(r.peak_bytes)).c_str());
  c.text(c.x(r.peak_time_s) + 3, yv(static_cast<double>(r.peak_bytes)) + 10, buf,
         "font-size=\"10\" fill=\"#e15759\"");
  c.text(4, y + kMem / 2 + 4, "memory", "font-size=\"11\"");
  // The scale: the band runs from 0 at its foot to the largest rank's peak at its head.
  c.text(kLeft - 4, y + kMem, "0", "font-size=\"9\" fill=\"#666\" text-anchor=\"end\"");
  c.text(kLeft - 4, y + 9, byte_label(top_bytes),
         "font-size=\"9\" fill=\"#666\" text-anchor=\"end\"");
}

// The time axis under the ranks: ticks 1, 2 or 5 times a power of ten apart, about ten over the
// step, labelled in the plan's unit (ms for seconds; cost units for a uniform plan).
void draw_time_axis(Canvas& c, double y, bool seconds) {
  if (c.step <= 0) return;
  const double scale = seconds ? 1e3 : 1.0;  // the labels' unit per plan unit
  const double span = c.step * scale;
  const double raw = span / 10;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  double tick = decade;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * decade >= raw) {
      tick = m * decade;
      break;
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", y);
  c.out += std::string("<line x1=\"") + std::to_string(kLeft) + "\" x2=\"" +
           std::to_string(kWidth - kRight) + "\" y1=\"" + buf + "\" y2=\"" + buf +
           "\" stroke=\"#333\"/>\n";
  for (int i = 0; i * tick <= span * (1 + 1e-9); ++i) {
    const double px = c.x(i * tick / scale);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", px,
                  px, y, y + 4);
    c.out += buf;
    std::snprintf(buf, sizeof buf, "%g", i * tick);
    c.text(px, y + 14, buf, "font-size=\"9\" text-anchor=\"middle\"");
  }
  c.text(kLeft - 4, y + 14, seconds ? "ms" : "units", "font-size=\"9\" text-anchor=\"end\"");
}

}  // namespace

std::string plan_svg(const Plan& plan) {
  const auto& ranks = plan.sim.ranks;
  // Note [Gradient reduction in the plan]: a reduce row, and the chart as long as the step with it.
  const bool reduce = plan.model.data_parallel_size > 1;
  const double rows = reduce ? 3 : 2;
  const double band = rows * kRow + kMem + kGap;
  const double axis = kTop + band * static_cast<double>(ranks.size());
  const double height = axis + 50;
  Canvas c{"", std::max(plan.sim.step_time_s, plan.sim.step_with_reduce_s)};
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      kWidth, height);
  c.out += buf;
  std::snprintf(buf, sizeof buf,
                "%s: %d ranks, %d stages, %d micro-batches; bubble %.1f%%; "
                "F blue, B green (W dark), I light green, W grey, FB purple, SEND/RECV orange",
                plan.schedule.name.c_str(), plan.schedule.num_ranks, plan.schedule.num_stages,
                plan.schedule.num_microbatches, 100 * plan.sim.bubble_fraction);
  c.text(kLeft, 20, buf, "font-size=\"13\"");
  double top_bytes = 0;
  for (const RankResult& r : ranks)
    top_bytes = std::max(top_bytes, static_cast<double>(r.peak_bytes));
  for (size_t i = 0; i < ranks.size(); ++i) {
    const double y = kTop + band * static_cast<double>(i);
    const RankResult& r = ranks[i];
    c.text(4, y + kRow - 4, "rank " + std::to_string(r.rank) + " compute", "font-size=\"11\"");
    c.text(4, y + 2 * kRow - 4, "comm", "font-size=\"11\"");
    draw_stream(c, r, plan.schedule.ranks[r.rank], Stream::kCompute, y);
    draw_stream(c, r, plan.schedule.ranks[r.rank], Stream::kComm, y + kRow);
    if (reduce) {
      c.text(4, y + 3 * kRow - 4, "reduce", "font-size=\"11\"");
      draw_stream(c, r, plan.schedule.ranks[r.rank], Stream::kReduce, y + 2 * kRow);
    }
    draw_memory(c, r, y + rows * kRow, top_bytes);
  }
  const bool seconds = plan.inputs.cost.kind != CostModelKind::kUniform;
  draw_time_axis(c, axis, seconds);
  std::snprintf(buf, sizeof buf, "step time %.6g %s%s", plan.sim.step_time_s,
                plan.inputs.cost.kind == CostModelKind::kUniform ? "units" : "s",
                reduce ? "; with the gradient all-reduce (yellow) to its end" : "");
  c.text(kLeft, height - 10, buf, "font-size=\"11\"");
  c.out += "</svg>\n";
  return c.out;
}

void write_svg(const Plan& plan, const std::string& path) {
  std::ofstream f(path);
  TANDEM_CHECK(f.good(), "cannot write the SVG file '", path, "'");
  f << plan_svg(plan);
  TANDEM_CHECK(f.good(), "writing the SVG file '", path, "' failed");
}

}  // namespace tandem::schedule
