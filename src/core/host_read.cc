// HostRead (Note [Reads to the host ahead of use] in host_read.h).
#include "core/host_read.h"

#include <utility>

#include "core/device.h"
#include "core/error.h"

namespace tandem {

HostRead::HostRead(const Tensor& t) : started_(true), device_(t.device()), dtype_(t.dtype()) {
  const auto bytes = static_cast<size_t>(t.numel() * dtype_size(t.dtype()));
  TANDEM_ASSERT(bytes <= kMaxBytes, "HostRead of ", bytes, " bytes; at most ", kMaxBytes);
  bytes_.resize(bytes);
  if (device_ == Device::kCPU) {
    if (bytes > 0) std::memcpy(bytes_.data(), t.raw_data(), bytes);
    return;
  }
  ticket_ = device_backend(device_).start_read(t.raw_data(), bytes);
}

HostRead::~HostRead() { drop(); }

HostRead::HostRead(HostRead&& other) noexcept
    : started_(std::exchange(other.started_, false)),
      device_(other.device_),
      dtype_(other.dtype_),
      ticket_(std::exchange(other.ticket_, 0)),
      bytes_(std::move(other.bytes_)) {}

HostRead& HostRead::operator=(HostRead&& other) noexcept {
  if (this != &other) {
    drop();
    started_ = std::exchange(other.started_, false);
    device_ = other.device_;
    dtype_ = other.dtype_;
    ticket_ = std::exchange(other.ticket_, 0);
    bytes_ = std::move(other.bytes_);
  }
  return *this;
}

void HostRead::check_take(DType want) const {
  TANDEM_ASSERT(started_, "HostRead: no read started, or its values were taken already");
  TANDEM_ASSERT(want == dtype_, "HostRead of a ", dtype_name(dtype_), " tensor taken as ",
                dtype_name(want));
}

std::vector<std::byte> HostRead::take_bytes() {
  if (ticket_ != 0) {
    device_backend(device_).finish_read(std::exchange(ticket_, 0), bytes_.data(), bytes_.size());
  }
  started_ = false;
  return std::exchange(bytes_, {});
}

void HostRead::drop() {
  if (ticket_ != 0) device_backend(device_).drop_read(std::exchange(ticket_, 0));
  started_ = false;
}

}  // namespace tandem
