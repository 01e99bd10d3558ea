// Saved activations in host memory between forward and backward (Note [Activation offload] in
// activation_offload.h).
#include "runtime/activation_offload.h"

#include <cstdlib>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "core/device.h"
#include "core/error.h"

namespace tandem::runtime {

namespace {

// The distinct storages in device memory among the saved tensors of the layer's chosen nodes.
std::vector<Storage> saved_storages(const model::LayerActs& layer, uint32_t kinds) {
  std::vector<Storage> out;
  std::unordered_set<const StorageImpl*> seen;
  for (const OffloadKind& k : offload_kinds()) {
    if (!offloads(kinds, k.kind)) continue;
    for (const Tensor* t : model::saved_tensors(k.kind, layer)) {
      if (!t->defined() || t->released() || t->evicted() || t->storage()->bytes() == 0) continue;
      if (seen.insert(t->storage().get()).second) out.push_back(t->storage());
    }
  }
  return out;
}

// Copies between the storage's memory and a host block on the current stream, at once on the
// CPU.
void copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) {
  if (dst_device == Device::kCPU && src_device == Device::kCPU) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  device_backend(dst_device == Device::kCPU ? src_device : dst_device)
      .copy_async(dst, dst_device, src, src_device, static_cast<size_t>(bytes));
}

// What a stream's work needs of a layer's moves: it may run after the entry is gone.
std::vector<std::pair<Storage, void*>> pairs(const auto& entry) {
  std::vector<std::pair<Storage, void*>> out;
  for (const auto& m : entry.moved) out.emplace_back(m.storage, m.host.ptr);
  return out;
}

SpanInfo copy_span(const char* name, int64_t bytes) {
  SpanInfo span;
  span.track = "offload";
  span.name = std::string(name) + " " + std::to_string(bytes) + " B";
  return span;
}

}  // namespace

ActivationOffload::ActivationOffload(Streams& streams, uint32_t kinds, Device device)
    : streams_(&streams), kinds_(kinds), device_(device) {}

ActivationOffload::~ActivationOffload() {
  // Copies in flight read or write the blocks: wait for the device before freeing them.
  if (device_ != Device::kCPU && !owned_.empty()) {
    try {
      synchronize_device(device_);
    } catch (...) {
    }
  }
  for (void* p : owned_) {
    if (device_ == Device::kCPU) {
      std::free(p);
    } else {
      device_backend(device_).host_free(p);
    }
  }
}

ActivationOffload::HostBlock ActivationOffload::take_host(int64_t bytes) {
  auto it = pool_.find(bytes);
  if (it != pool_.end()) {
    HostBlock b = std::move(it->second);
    pool_.erase(it);
    return b;
  }
  HostBlock b;
  b.bytes = bytes;
  const auto n = static_cast<size_t>(bytes);
  b.ptr = device_ == Device::kCPU ? std::malloc(n) : device_backend(device_).host_alloc(n);
  TANDEM_CHECK(b.ptr != nullptr, "cannot allocate ", bytes,
               " bytes of host memory for offloaded activations");
  owned_.push_back(b.ptr);
  return b;
}

void ActivationOffload::send_out(model::LayerActs& layer, const StreamEvent& done, StreamId from) {
  std::vector<Storage> storages = saved_storages(layer, kinds_);
  if (storages.empty()) return;
  TANDEM_ASSERT(out_.count(&layer) == 0, "a layer's activations sent out twice");
  Layer& entry = out_[&layer];
  streams_->wait(StreamId::kOffloadOut, done, from, std::string());
  int64_t bytes = 0;
  for (Storage& s : storages) {
    HostBlock host = take_host(s->bytes());
    // The block's last copy back must have read it before this copy writes it.
    if (host.free_after.cpu || host.free_after.device) {
      streams_->wait(StreamId::kOffloadOut, host.free_after, StreamId::kOffloadIn, std::string());
    }
    bytes += s->bytes();
    entry.moved.push_back({std::move(s), std::move(host)});
  }
  host_in_use_ += bytes;
  host_peak_ = std::max(host_peak_, host_in_use_);
  streams_->run(StreamId::kOffloadOut, copy_span("offload", bytes), [moves = pairs(entry)] {
    for (const auto& [storage, host] : moves) {
      copy(host, Device::kCPU, storage->data(), storage->device(), storage->bytes());
      storage->evict();  // on the copy stream: the block waits for the copy
    }
  });
  entry.out_done = streams_->mark(StreamId::kOffloadOut);
}

void ActivationOffload::bring_back(model::LayerActs& layer, StreamId alloc) {
  auto it = out_.find(&layer);
  if (it == out_.end() || it->second.coming_back) return;
  Layer& entry = it->second;
  int64_t bytes = 0;
  for (const Moved& m : entry.moved) bytes += m.storage->bytes();
  // Readmitted on the stream that will use them, which frees them in its backward; the copy
  // back starts once that stream has reached this point and the copies out have landed.
  SpanInfo readmit;
  readmit.track = alloc == StreamId::kCompute2 ? "compute2" : "compute";
  readmit.name = "readmit " + std::to_string(bytes) + " B";
  streams_->run(alloc, std::move(readmit), [moves = pairs(entry)] {
    for (const auto& [storage, host] : moves) storage->readmit();
  });
  streams_->wait(StreamId::kOffloadIn, streams_->mark(alloc), alloc, std::string());
  streams_->wait(StreamId::kOffloadIn, entry.out_done, StreamId::kOffloadOut, std::string());
  streams_->run(StreamId::kOffloadIn, copy_span("reload", bytes), [moves = pairs(entry)] {
    for (const auto& [storage, host] : moves) {
      copy(storage->data(), storage->device(), host, Device::kCPU, storage->bytes());
    }
  });
  entry.in_done = streams_->mark(StreamId::kOffloadIn);
  entry.coming_back = true;
  host_in_use_ -= bytes;
}

void ActivationOffload::wait_back(model::LayerActs& layer, StreamId stream, StreamId alloc) {
  auto it = out_.find(&layer);
  if (it == out_.end()) return;
  bring_back(layer, alloc);
  Layer& entry = it->second;
  streams_->wait(stream, entry.in_done, StreamId::kOffloadIn, "reload");
  for (Moved& m : entry.moved) {
    m.host.free_after = entry.in_done;
    pool_.emplace(m.host.bytes, std::move(m.host));
  }
  out_.erase(it);
}

}  // namespace tandem::runtime
