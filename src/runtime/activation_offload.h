// Saved activations of chosen nodes kept in host memory between a layer's forward and its
// backward (--offload-activations, Megatron-LM's fine-grained activation offloading).
//
// Note [Activation offload]: with TrainConfig::offload_activations naming node kinds
// (attention, experts, shared-expert, combine, mlp), every tensor those nodes of a layer save
// for their backward (core/footprint.h's node_saved_bytes) leaves device memory once the layer's
// forward has been issued, and comes back one layer ahead of its backward:
//  - out: the copy-out stream waits for the layer's last node (a layer's nodes read each other's
//    saved tensors during the forward: dispatch and combine read the router's, the shared expert
//    attention's n2), copies each saved storage to a page-locked host buffer and evicts it
//    (Note [Offloaded storage] in core/tensor.h). The free is recorded on the copy-out stream, so
//    the device block is handed out again only after the copy.
//  - in: when the backward of layer l begins (its first node in backward order), layer l's
//    tensors must be back (the node's stream waits for their copy: the trace's "wait reload"
//    span), and layer l - 1's are readmitted on l's compute stream and copied back on the
//    copy-in stream, beside l's backward. The stage's top layer is brought back when the loss
//    node's backward begins (last stage), else at its own first backward node.
// The device bytes go where the forward issues the eviction and come back where the backward
// issues the readmission: the planner counts the same bytes at the same nodes
// (Note [Offload in the plan] in planner/simulator_state.cc), so the planned peak stays the
// measured one. The
// host holds the offloaded bytes from eviction to readmission; its buffers are pooled by size
// and reused once their copy back has landed. The values are the same bytes, so the results do
// not change. A forward without backward (evaluation) offloads nothing.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "core/footprint.h"
#include "core/tensor.h"
#include "model/nodes.h"
#include "runtime/streams.h"

namespace tandem::runtime {

class ActivationOffload {
 public:
  // kinds: bit (1 << NodeKind) for each kind offloaded (TrainConfig::offload_activations).
  ActivationOffload(Streams& streams, uint32_t kinds, Device device);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // The layer's forward was issued; its last node's event `done` is on stream `from`.
  void send_out(model::LayerActs& layer, const StreamEvent& done, StreamId from);
  // Readmits the layer's tensors on `alloc` (the compute stream of its backward) and copies them
  // back, unless that was done already or nothing of the layer is out.
  void bring_back(model::LayerActs& layer, StreamId alloc);
  // Before the layer's first backward node on `stream`: brought back (now, if not yet), and
  // `stream` waits for the copies.
  void wait_back(model::LayerActs& layer, StreamId stream, StreamId alloc);

  // Host bytes holding offloaded activations now, and their peak since reset_peak().
  int64_t host_bytes() const { return host_in_use_; }
  int64_t host_peak() const { return host_peak_; }
  void reset_peak() { host_peak_ = host_in_use_; }
  // Layers sent out and not yet waited for (0 after every training step).
  size_t layers_out() const { return out_.size(); }

 private:
  struct HostBlock {
    void* ptr = nullptr;
    int64_t bytes = 0;
    StreamEvent free_after;  // the copy back that last read it (none: free at once)
  };
  struct Moved {
    Storage storage;
    HostBlock host;
  };
  struct Layer {
    std::vector<Moved> moved;
    StreamEvent out_done, in_done;
    bool coming_back = false;
  };

  HostBlock take_host(int64_t bytes);

  Streams* streams_;
  uint32_t kinds_;
  Device device_;
  std::unordered_map<const model::LayerActs*, Layer> out_;
  std::multimap<int64_t, HostBlock> pool_;  // free host blocks by size
  std::vector<void*> owned_;                // every host block, freed at destruction
  int64_t host_in_use_ = 0, host_peak_ = 0;
};

}  // namespace tandem::runtime
