// HostRead (Note [Reads to the host ahead of use] in host_read.h).
#include "core/host_read.h"

#include <utility>

#include "core/device.h"
#include "core/error.h"

namespace tandem {

HostRead::HostRead(const Tensor& t) : started_(true), device_(t.device()) {
  TANDEM_ASSERT(t.dtype() == DType::kI32, "HostRead reads i32 tensors");
  const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(int32_t);
  TANDEM_ASSERT(bytes <= kMaxBytes, "HostRead of ", bytes, " bytes; at most ", kMaxBytes);
  if (device_ == Device::kCPU) {
    values_.assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
    return;
  }
  values_.resize(static_cast<size_t>(t.numel()));
  ticket_ = device_backend(device_).start_read(t.raw_data(), bytes);
}

HostRead::~HostRead() { drop(); }

HostRead::HostRead(HostRead&& other) noexcept
    : started_(std::exchange(other.started_, false)),
      device_(other.device_),
      ticket_(std::exchange(other.ticket_, 0)),
      values_(std::move(other.values_)) {}

HostRead& HostRead::operator=(HostRead&& other) noexcept {
  if (this != &other) {
    drop();
    started_ = std::exchange(other.started_, false);
    device_ = other.device_;
    ticket_ = std::exchange(other.ticket_, 0);
    values_ = std::move(other.values_);
  }
  return *this;
}

std::vector<int32_t> HostRead::take() {
  TANDEM_ASSERT(started_, "HostRead::take without a read started");
  if (ticket_ != 0) {
    device_backend(device_).finish_read(std::exchange(ticket_, 0), values_.data(),
                                        values_.size() * sizeof(int32_t));
  }
  started_ = false;
  return std::exchange(values_, {});
}

void HostRead::drop() {
  if (ticket_ != 0) device_backend(device_).drop_read(std::exchange(ticket_, 0));
  started_ = false;
}

}  // namespace tandem
