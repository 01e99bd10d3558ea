// What a measured peak holds: the allocator's trace of a training step walked to its highest
// point, the tensors live there summed by category and name. The whole-peak tests print it on a
// mismatch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "runtime/pipeline_trainer.h"

namespace tandem::testing {

// The tensors live at the trace's highest point, by category and name, from `base` bytes.
inline std::string live_at_peak(const std::vector<MemEvent>& events, int64_t base) {
  int64_t now = base, peak = base;
  size_t at = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    now += events[i].bytes;
    if (now > peak) {
      peak = now;
      at = i + 1;
    }
  }
  std::map<std::string, int64_t> live;
  for (size_t i = 0; i < at; ++i) {
    live[std::string(category_name(events[i].category)) + " " + events[i].tag] += events[i].bytes;
  }
  std::string out = "live at the measured peak beyond the step's start:\n";
  for (const auto& [name, bytes] : live) {
    if (bytes != 0) out += "  " + name + " " + std::to_string(bytes) + "\n";
  }
  return out;
}

// The second of two steps of `trainer` (the first also makes the Adam moments), with the
// allocator's trace of it and the bytes in use before it.
struct TracedStep {
  runtime::StepResult result;
  std::vector<MemEvent> events;
  int64_t base = 0;
};
inline TracedStep traced_second_step(runtime::PipelineTrainer& trainer) {
  trainer.step();
  TracedStep out;
  out.base = cpu_allocator().stats().total_in_use;
  cpu_allocator().set_trace(true);
  out.result = trainer.step();
  out.events = cpu_allocator().trace();
  cpu_allocator().set_trace(false);
  return out;
}

}  // namespace tandem::testing
