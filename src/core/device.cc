// Device hooks and the per-thread current device (Note [Current device] in device.h).
#include "core/device.h"

#include <array>

#include "core/allocator.h"
#include "core/error.h"

namespace tandem {

namespace {
std::array<DeviceBackend, 2> g_backends{};
std::array<bool, 2> g_registered{};
thread_local Device t_current = Device::kCPU;
}  // namespace

std::string_view device_name(Device device) { return device == Device::kCPU ? "cpu" : "cuda"; }

void register_device_backend(Device device, const DeviceBackend& backend) {
  TANDEM_ASSERT(device != Device::kCPU, "the CPU needs no device backend");
  g_backends[static_cast<size_t>(device)] = backend;
  g_registered[static_cast<size_t>(device)] = true;
}

bool device_available(Device device) {
  return device == Device::kCPU || g_registered[static_cast<size_t>(device)];
}

const DeviceBackend& device_backend(Device device) {
  TANDEM_CHECK(device_available(device), "device '", device_name(device),
               "' is not available: this binary was built without it or it was not initialised");
  return g_backends[static_cast<size_t>(device)];
}

Device current_device() { return t_current; }

Allocator& allocator_for(Device device) {
  return device == Device::kCPU ? cpu_allocator() : *device_backend(device).allocator;
}

void synchronize_device(Device device) {
  if (device != Device::kCPU) device_backend(device).synchronize();
}

DeviceScope::DeviceScope(Device device) : previous_(t_current) {
  if (device != Device::kCPU) device_backend(device);  // throws when absent
  t_current = device;
}

DeviceScope::~DeviceScope() { t_current = previous_; }

}  // namespace tandem
