// The NCCL backend of Communicator for CUDA tensors: one process per GPU, bootstrapped over MPI
// (rank 0 of the group makes NCCL's unique id and the MPI group broadcasts it), one NCCL
// communicator per group. Built only with the CUDA backend (TANDEM_HAS_CUDA). Every NCCL
// communicator is non-blocking (ncclConfig_t::blocking = 0), so no call can hang inside NCCL:
// each is polled against a deadline (Note [Bounded waits] in communicator.h).
//
// Note [NCCL completion]: operations are enqueued on the calling thread's current stream
// (Note [Current stream] in core/cuda/context.h; the executor picks its communication stream
// with cuda::StreamScope) and return once NCCL has enqueued them, not once they have run:
//   - send, isend, recv, all_to_all_v, all_reduce_sum, reduce_scatter_sum, all_gather and
//     broadcast are stream-ordered. Work enqueued later on the same stream sees their results;
//     another stream must wait for an event recorded after them. Each records the stream's use
//     of its tensors with the caching allocator, so freeing a tensor on another stream is safe.
//   - barrier blocks: every rank has reached it and the work enqueued on the current stream
//     before it has completed. all_gather_bytes blocks (it runs on the MPI group, host bytes).
//   - PendingSend::wait and synchronize() block until the send, or everything enqueued on the
//     current stream, has completed on the GPU.
// The blocking calls, and the enqueueing itself (NCCL may connect to a peer first), poll
// cudaStreamQuery / cudaEventQuery and ncclCommGetAsyncError until the deadline. On a timeout or
// an asynchronous NCCL error the communicator is aborted (ncclCommAbort makes its kernels exit)
// and tandem::Error names the rank, the group, the operation, the time waited and the peers that
// have not enqueued this rank's latest collective (Note [Who did not arrive]); every later
// call on that communicator throws. Creating a communicator waits at least kNcclInitTimeoutS,
// because NCCL's first initialisation probes the machine's topology.
//
// Note [NCCL matching]: NCCL has no tags. Sends and receives between two ranks match in the
// order they are called, per peer pair and per group; a communicator runs its operations one
// after another in call order, on any stream. The `tag` arguments are therefore only checked
// to be non-negative; the schedules' validated order (schedule/validator.h) is what makes the
// n-th send to a peer meet the peer's n-th receive from us. Unlike the validator's model, a send
// here does wait on the GPU for its receive to be posted: two ranks that exchange in the same
// step must not both send first (the lower rank sends first, or both use all_to_all_v, whose
// sends and receives form one NCCL group).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

struct ncclComm;  // nccl.h's communicator; the header stays out of the includers' way

namespace tandem::comm {

class ArrivalBoard;  // comm/arrivals.h

// The least time creating an NCCL communicator may take before it counts as hung (seconds).
inline constexpr double kNcclInitTimeoutS = 60.0;

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the ranks of `mpi_group` (each calls it): creates an NCCL communicator of
  // the same ranks, rank for rank, on this process's GPU (cuda::initialize() first).
  // `mpi_group` must outlive this communicator; `timeout_s` bounds every wait.
  NcclCommunicator(Communicator& mpi_group, double timeout_s);
  // The same, owning its MPI group (how subgroup() makes one).
  NcclCommunicator(std::unique_ptr<Communicator> mpi_group, double timeout_s);
  // Finalizes the NCCL communicator (bounded: aborts it when finalizing does not end in time).
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  // Tensors are CUDA tensors of any dtype (bf16, f32, f64, i32, i64); a zero-element tensor
  // moves nothing. Completion and matching: Note [NCCL completion], Note [NCCL matching].
  void send(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<PendingSend> isend(const Tensor& t, int peer, int tag) override;
  void recv(const Tensor& t, int peer, int tag) override;
  // Row counts on the host, as given (every rank's send_rows[p] equals peer p's recv_rows[me]);
  // `in` (>= sum(send_rows) rows) and `out` (>= sum(recv_rows) rows) have the same dtype and row
  // width. One NCCL group of a send and a receive per peer with rows to move.
  void all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                    const std::vector<int64_t>& send_rows) override;
  // Sums in the tensor's dtype (bf16 sums are rounded to bf16 by NCCL).
  void all_reduce_sum(const Tensor& t) override;
  void reduce_scatter_sum(const Tensor& out, const Tensor& in) override;
  void all_gather(const Tensor& out, const Tensor& in) override;
  void broadcast(const Tensor& t, int root) override;
  void barrier() override;
  std::vector<std::string> all_gather_bytes(const std::string& mine) override;
  // The MPI subgroup of the same ranks (its subgroup()), and an NCCL communicator over it.
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks,
                                         const std::string& name) override;

  // Waits (bounded) until the work enqueued so far on the current stream has completed.
  void synchronize();
  // True once a timeout or an NCCL error has aborted this communicator.
  bool aborted() const { return comm_ == nullptr; }
  // The MPI group this communicator was bootstrapped from.
  Communicator& mpi_group() { return *mpi_; }

 private:
  friend class NcclPendingSend;
  void initialize();
  void ensure_usable(const char* op) const;
  void check_tensor(const Tensor& t, const char* op, const char* arg) const;
  void check_same_dtype(const Tensor& out, const Tensor& in, const char* op) const;
  void check_peer(int peer, int tag, const char* op) const;
  int64_t row_width(const Tensor& out, const Tensor& in) const;
  std::vector<int64_t> row_offsets(const std::vector<int64_t>& rows, const Tensor& t,
                                   const char* which) const;
  // The current stream, recorded as a user of each tensor's block (Note [NCCL completion]).
  cudaStream_t stream_using(std::initializer_list<const Tensor*> tensors);
  void enqueue_p2p(const Tensor& t, int peer, int tag, bool sending);
  // Waits until NCCL has finished enqueuing the last call and names it the last operation.
  void settle(const std::string& op);
  // Polls NCCL's state, and `ready` once NCCL is idle (null: NCCL alone), for `limit_s` seconds;
  // on an NCCL error or a timeout, aborts the communicator and throws (fail()).
  void watch(const std::string& op, double limit_s, const std::function<bool()>& ready);
  [[noreturn]] void fail(const std::string& op, const std::string& why);
  // Announces the collective this rank is about to enqueue (Note [Who did not arrive]).
  void arrive();
  // The peers that have not enqueued every collective this rank has ("not arrived: ..."), or
  // "" when none has fallen behind or the group has no board.
  std::string not_arrived();

  std::unique_ptr<Communicator> owned_mpi_;  // null when the MPI group belongs to the caller
  Communicator* mpi_;
  std::string name_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  ncclComm* comm_ = nullptr;  // null once aborted (ncclCommAbort frees it)
  std::string last_op_ = "none";
  std::string abort_reason_;
  // Aborts this communicator when a host wait for the GPU runs past its limit
  // (Note [Bounded waits on the GPU] in core/cuda/wait.h); 0 until registered.
  int abort_hook_ = 0;
  // On a duplicate of the MPI group's communicator (Note [Who did not arrive]); null over a
  // group that is not MPI's (one process without mpirun).
  std::unique_ptr<ArrivalBoard> board_;
};

// "NCCL 2.28.9 (built with 2.28.9)": the library loaded and the header compiled against.
std::string nccl_version();

// An NCCL communicator over the ranks of `mpi_group` (collective; see the constructor).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& mpi_group, double timeout_s);

}  // namespace tandem::comm
