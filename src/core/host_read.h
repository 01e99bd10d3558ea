// Note [Reads to the host ahead of use]: a node that needs a few device values on the host
// (routing counts) waits for the stream when it copies them (Note [Host copies] in
// core/cuda/context.cc): the host stops issuing until the GPU has caught up. A HostRead starts
// the copy where the values are made and lets the host wait later, for that copy alone, so the
// host can go on issuing other work (the other micro-batch's nodes) in between. On the CPU the
// values are read at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace tandem {

class HostRead {
 public:
  HostRead() = default;
  // Starts reading a tensor (at most kMaxBytes) on the current stream.
  explicit HostRead(const Tensor& t);
  ~HostRead();
  HostRead(HostRead&& other) noexcept;
  HostRead& operator=(HostRead&& other) noexcept;
  HostRead(const HostRead&) = delete;
  HostRead& operator=(const HostRead&) = delete;

  // Whether a read was started and not yet taken.
  bool started() const { return started_; }
  // The values of an i32 tensor; waits for the copy if it has not landed. Once per read.
  std::vector<int32_t> take() { return take_as<int32_t>(); }
  // The same for any element type T of the tensor's dtype.
  template <typename T>
  std::vector<T> take_as() {
    check_take(DTypeOf<T>::value);
    const std::vector<std::byte> bytes = take_bytes();
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

  static constexpr size_t kMaxBytes = 4096;

 private:
  void drop();
  void check_take(DType want) const;
  std::vector<std::byte> take_bytes();

  bool started_ = false;
  Device device_ = Device::kCPU;
  DType dtype_ = DType::kI32;
  uint64_t ticket_ = 0;
  std::vector<std::byte> bytes_;  // the CPU's, read at once; the device's size otherwise
};

}  // namespace tandem
