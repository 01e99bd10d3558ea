// Devices beside the CPU plug into core through one table of hooks (DeviceBackend), registered at
// start-up by the backend's module (src/core/cuda registers CUDA in cuda::initialize()). core
// itself never includes a device header, so it builds and tests without a GPU.
//
// Note [Current device]: each thread has a current device (the CPU unless a DeviceScope says
// otherwise); Tensor::empty allocates there when no device is named. The model's nodes allocate
// through it, so the same node code runs on the CPU and on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tandem {

class Allocator;

struct DeviceBackend {
  Allocator* allocator = nullptr;
  // Sets `bytes` bytes at `ptr` (device memory) to zero on the current stream.
  void (*zero)(void* ptr, size_t bytes) = nullptr;
  // Copies `bytes` bytes between any two of host and device memory, ordered on the current
  // stream; returns once a host destination holds the data.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device,
               size_t bytes) = nullptr;
  // Waits until all work enqueued on the device so far has finished.
  void (*synchronize)() = nullptr;
  // A read of device memory to the host that the host waits for later (core/host_read.h):
  // start_read enqueues the copy of `bytes` on the current stream and returns a ticket;
  // finish_read waits for that copy alone and copies it to `dst`; drop_read forgets an
  // unfinished read (after its copy has landed). Each ticket is finished or dropped once.
  uint64_t (*start_read)(const void* src, size_t bytes) = nullptr;
  void (*finish_read)(uint64_t ticket, void* dst, size_t bytes) = nullptr;
  void (*drop_read)(uint64_t ticket) = nullptr;
  // Page-locked host memory, which the device copies to and from while it computes (activation
  // offload, runtime/activation_offload.h); host_alloc throws tandem::Error when none is left.
  void* (*host_alloc)(size_t bytes) = nullptr;
  void (*host_free)(void* ptr) = nullptr;
  // Copies `bytes` bytes between device memory and page-locked host memory on the current
  // stream and returns at once (the stream's later work, and its events, follow the copy).
  void (*copy_async)(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t bytes) = nullptr;
};

// The allocator of `device` (the CPU allocator or the registered device's).
Allocator& allocator_for(Device device);
// Waits for the device's queued work (nothing to do for the CPU).
void synchronize_device(Device device);

// Installs the hooks for `device` (not the CPU); called once by the backend's initialisation.
void register_device_backend(Device device, const DeviceBackend& backend);
// The hooks for `device`; throws tandem::Error naming the device when none were registered
// (a binary built without CUDA, or cuda::initialize() not called).
const DeviceBackend& device_backend(Device device);
bool device_available(Device device);
std::string_view device_name(Device device);

// The calling thread's current device (Note [Current device]).
Device current_device();

// Makes `device` current on this thread for the scope's lifetime.
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device previous_;
};

}  // namespace tandem
