// The Communicator interface: point-to-point and collectives over a group of ranks, on CPU
// tensors (MPI backend) or GPU tensors (NCCL backend, later), one interface for both.
// Note [Bounded waits]: no call blocks forever. Every operation gives up after the timeout and
// throws tandem::Error naming the operation, the peer or group and the time waited, so that a
// dead or diverged rank makes the others exit with a clear message instead of hanging.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem::comm {

// A send in flight; wait() completes it (bounded, Note [Bounded waits]). It keeps the tensor's
// storage alive until then. done() asks without waiting whether it has completed (then the
// object, and with it the storage, may go).
class PendingSend {
 public:
  virtual ~PendingSend() = default;
  virtual void wait() = 0;
  virtual bool done() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "pp", "ep", ... for messages

  // Point to point; `peer` is a group rank; matching send/recv pairs use the same tag.
  virtual void send(const Tensor& t, int peer, int tag) = 0;
  // Starts a send and returns at once (schedules assume a SEND never waits).
  virtual std::unique_ptr<PendingSend> isend(const Tensor& t, int peer, int tag) = 0;
  virtual void recv(const Tensor& t, int peer, int tag) = 0;
  // Rows of `in` go to each peer in group-rank order: send_rows[p] rows to peer p; `out`
  // receives recv_rows[p] rows from each peer in order. Row width is in.numel() / in.size(0).
  virtual void all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_rows,
                            const Tensor& in, const std::vector<int64_t>& send_rows) = 0;
  // In place, element-wise sum over the group (f32, f64, i32, i64).
  virtual void all_reduce_sum(const Tensor& t) = 0;
  // out (numel / size) = my slice of the element-wise sum of in over the group.
  virtual void reduce_scatter_sum(const Tensor& out, const Tensor& in) = 0;
  // out (size * in.numel()) = the concatenation of every rank's in, in rank order.
  virtual void all_gather(const Tensor& out, const Tensor& in) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Gathers every rank's bytes (any length) to every rank.
  virtual std::vector<std::string> all_gather_bytes(const std::string& mine) = 0;

  // A sub-group of the ranks listed (world-rank order given by `ranks`); every rank of this
  // communicator must call it, each with the list of the group it belongs to.
  virtual std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks,
                                                 const std::string& name) = 0;
};

}  // namespace tandem::comm
