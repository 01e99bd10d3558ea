// Note [Reads to the host ahead of use]: a node that needs a few device values on the host
// (routing counts) waits for the stream when it copies them (Note [Host copies] in
// core/cuda/context.cc): the host stops issuing until the GPU has caught up. A HostRead starts
// the copy where the values are made and lets the host wait later, for that copy alone, so the
// host can go on issuing other work (the other micro-batch's nodes) in between. On the CPU the
// values are read at once.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem {

class HostRead {
 public:
  HostRead() = default;
  // Starts reading an i32 tensor (at most kMaxBytes) on the current stream.
  explicit HostRead(const Tensor& t);
  ~HostRead();
  HostRead(HostRead&& other) noexcept;
  HostRead& operator=(HostRead&& other) noexcept;
  HostRead(const HostRead&) = delete;
  HostRead& operator=(const HostRead&) = delete;

  // Whether a read was started and not yet taken.
  bool started() const { return started_; }
  // The values; waits for the copy if it has not landed. Once per read.
  std::vector<int32_t> take();

  static constexpr size_t kMaxBytes = 4096;

 private:
  void drop();

  bool started_ = false;
  Device device_ = Device::kCPU;
  uint64_t ticket_ = 0;
  std::vector<int32_t> values_;  // the CPU's, read at once; the device's size otherwise
};

}  // namespace tandem
