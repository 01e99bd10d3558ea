// NCCL backend: non-blocking NCCL communicators bootstrapped over MPI, every wait polled against
// a deadline (Note [NCCL completion] and Note [NCCL matching] in nccl_communicator.h).
#include "comm/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "comm/arrivals.h"
#include "comm/mpi_communicator.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/cuda_allocator.h"
#include "core/cuda/wait.h"
#include "core/error.h"

namespace tandem::comm {
namespace {

// Throws tandem::InternalError naming the call and NCCL's error text unless `status` is
// ncclSuccess or ncclInProgress: a non-blocking communicator still at work (settled by watch()).
#define TANDEM_NCCL_CHECK(call)                                                         \
  do {                                                                                  \
    const ncclResult_t tandem_nccl_status_ = (call);                                    \
    if (tandem_nccl_status_ != ncclSuccess && tandem_nccl_status_ != ncclInProgress)    \
      TANDEM_INTERNAL_ERROR("NCCL call ", #call,                                        \
                            " failed: ", ncclGetErrorString(tandem_nccl_status_), " (", \
                            ncclGetLastError(nullptr), ")");                            \
  } while (false)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
  }
  TANDEM_ASSERT(false, "dtype without an NCCL type");
  return ncclFloat32;
}

size_t count_of(const Tensor& t) { return static_cast<size_t>(t.numel()); }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Note [Polling NCCL]: a call on a non-blocking communicator returns while NCCL may still be
// enqueuing it (ncclInProgress), and the next call must wait for that; the wait is short (tens
// of microseconds), but it is on the host's path to the GPU: nothing else is issued meanwhile.
// A sleep, however short it asks for, lasts at least the kernel's timer slack (~55 us on
// Linux), and a dispatch makes three calls: sleeping from the first poll would cost the host
// a few hundred microseconds a dispatch, and the GPU would idle behind it. So the first kSpin
// of a wait polls without sleeping (yielding the core), and only a longer wait backs off:
// 50 us, 100 us, ... up to 500 us between polls.
class Backoff {
 public:
  void pause() {
    if (Clock::now() - start_ < kSpin) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(500));
  }

 private:
  static constexpr std::chrono::microseconds kSpin{2000};
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds pause_{50};
};

// True once the work `query` asks about is done; throws tandem::InternalError on a CUDA error.
bool cuda_done(cudaError_t status, const char* call) {
  if (status == cudaErrorNotReady) return false;
  if (status != cudaSuccess) {
    TANDEM_INTERNAL_ERROR("CUDA call ", call, " failed: ", cudaGetErrorName(status), " (",
                          cudaGetErrorString(status), ")");
  }
  return true;
}

// ncclGroupStart .. ncclGroupEnd. Ending on an error path (a call inside failed) lets NCCL drop
// the group: a group whose calls reported an error is not launched.
class NcclGroup {
 public:
  NcclGroup() { TANDEM_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    TANDEM_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

}  // namespace

// A send enqueued on a stream, with an event recorded after it; keeps the tensor alive.
class NcclPendingSend final : public PendingSend {
 public:
  NcclPendingSend(NcclCommunicator* comm, Tensor t, int peer)
      : comm_(comm), t_(std::move(t)), peer_(peer) {
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(event_, cuda::current_stream());
    if (recorded != cudaSuccess) cudaEventDestroy(event_);
    TANDEM_CUDA_CHECK(recorded);
  }
  // Destroying an event whose work is pending is allowed: CUDA frees it once the work is done.
  // The send itself cannot be cancelled (an unwaited one still runs, or was aborted).
  ~NcclPendingSend() override { cudaEventDestroy(event_); }
  NcclPendingSend(const NcclPendingSend&) = delete;
  NcclPendingSend& operator=(const NcclPendingSend&) = delete;

  void wait() override {
    if (done_) return;
    const std::string op = detail::concat("send to rank ", peer_);
    comm_->ensure_usable(op.c_str());
    const cudaEvent_t event = event_;
    comm_->watch(op, comm_->timeout_s_,
                 [event] { return cuda_done(cudaEventQuery(event), "cudaEventQuery"); });
    done_ = true;
  }
  bool done() override {
    if (!done_) done_ = cuda_done(cudaEventQuery(event_), "cudaEventQuery");
    return done_;
  }

 private:
  NcclCommunicator* comm_;
  Tensor t_;  // the storage stays alive until the send is known to be done
  int peer_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

NcclCommunicator::NcclCommunicator(Communicator& mpi_group, double timeout_s)
    : mpi_(&mpi_group), timeout_s_(timeout_s) {
  initialize();
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> mpi_group, double timeout_s)
    : owned_mpi_(std::move(mpi_group)), mpi_(owned_mpi_.get()), timeout_s_(timeout_s) {
  TANDEM_ASSERT(mpi_ != nullptr, "an NCCL communicator needs its MPI group");
  initialize();
}

// Rank 0 makes the unique id and broadcasts it over the MPI group with a flag saying whether it
// could, so that the others never wait for an id that will not come. Then every rank joins.
void NcclCommunicator::initialize() {
  rank_ = mpi_->rank();
  size_ = mpi_->size();
  name_ = mpi_->name();
  TANDEM_CHECK(timeout_s_ > 0, "NCCL group '", name_, "': the timeout must be positive, not ",
               timeout_s_, " s");
  (void)cuda::current_stream();  // throws unless CUDA is initialised; selects our GPU here
  board_ = arrival_board(*mpi_);

  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  constexpr int64_t kIdWords = sizeof(ncclUniqueId) / sizeof(int64_t);
  Tensor message = Tensor::zeros({1 + kIdWords}, DType::kI64, MemCategory::kCommunication,
                                 "nccl.unique_id");  // (1 + 16,) on the host: flag, id bytes
  ncclUniqueId id{};
  std::string root_error;
  if (rank_ == 0) {
    try {
      TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
      message.data<int64_t>()[0] = 1;
      std::memcpy(message.data<int64_t>() + 1, &id, sizeof(id));
    } catch (const std::exception& e) {  // sent on below, so that no rank waits for rank 0
      root_error = e.what();
    }
  }
  mpi_->broadcast(message, 0);
  if (!root_error.empty()) {
    TANDEM_INTERNAL_ERROR("rank 0 of NCCL group '", name_,
                          "' could not make the NCCL unique id: ", root_error);
  }
  if (message.data<int64_t>()[0] != 1) {
    TANDEM_INTERNAL_ERROR("rank ", rank_, " of NCCL group '", name_,
                          "': rank 0 could not make the NCCL unique id (its own error says why)");
  }
  std::memcpy(&id, message.data<int64_t>() + 1, sizeof(id));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; watch() bounds the waits
  ncclComm_t comm = nullptr;
  const ncclResult_t status = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  comm_ = comm;
  if (status != ncclSuccess && status != ncclInProgress) {
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    TANDEM_INTERNAL_ERROR(
        "NCCL call ncclCommInitRankConfig(&comm, size, id, rank, &config) "
        "failed: ",
        ncclGetErrorString(status), " (", ncclGetLastError(nullptr), ")");
  }
  TANDEM_CHECK(comm_ != nullptr, "NCCL group '", name_, "': ncclCommInitRankConfig returned ",
               ncclGetErrorString(status), " without a communicator");
  watch(detail::concat("creating the NCCL communicator of ", size_, " rank(s)"),
        std::max(timeout_s_, kNcclInitTimeoutS), nullptr);
  last_op_ = "creation";
  // Note [Bounded waits on the GPU]: a host wait that gives up aborts us, so that our kernels,
  // spinning for a peer that will not come, end.
  abort_hook_ = cuda::add_abort_hook([this]() -> std::string {
    if (comm_ == nullptr) return "";
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    abort_reason_ = "a wait for the GPU ran past its limit";
    std::string absent;
    try {
      absent = not_arrived();
    } catch (const std::exception&) {  // hooks must not throw; the message only lacks the names
    }
    return detail::concat("NCCL group '", name_, "' (rank ", rank_, " of ", size_,
                          ", last operation enqueued: ", last_op_,
                          absent.empty() ? "" : "; " + absent, ")");
  });
}

NcclCommunicator::~NcclCommunicator() {
  if (abort_hook_ != 0) cuda::remove_abort_hook(abort_hook_);
  if (comm_ == nullptr) return;  // aborted: ncclCommAbort has freed it
  // Finalize flushes what is still enqueued; like every wait it is bounded, and a communicator
  // that does not finish in time is aborted instead of destroyed.
  ncclResult_t state = ncclCommFinalize(comm_);
  const auto start = Clock::now();
  Backoff backoff;
  while (state == ncclInProgress || state == ncclSuccess) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    if (state != ncclInProgress) break;
    if (seconds_since(start) > timeout_s_) break;
    backoff.pause();
  }
  if (state == ncclSuccess) {
    (void)ncclCommDestroy(comm_);  // local and quick once finalized
  } else {
    std::fprintf(stderr,
                 "tandem: warning: rank %d of NCCL group '%s': finalizing the communicator %s "
                 "within %g s; aborting it\n",
                 rank_, name_.c_str(),
                 state == ncclInProgress ? "did not finish" : ncclGetErrorString(state),
                 timeout_s_);
    (void)ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

void NcclCommunicator::ensure_usable(const char* op) const {
  TANDEM_CHECK(comm_ != nullptr, "rank ", rank_, " of NCCL group '", name_, "' cannot run ", op,
               ": its NCCL communicator was aborted after an earlier failure (", abort_reason_,
               ")");
}

void NcclCommunicator::settle(const std::string& op) {
  last_op_ = op;
  watch(op, timeout_s_, nullptr);
}

void NcclCommunicator::watch(const std::string& op, double limit_s,
                             const std::function<bool()>& ready) {
  const auto start = Clock::now();
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    TANDEM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(op, detail::concat("failed: NCCL reported '", ncclGetErrorString(state), "' (",
                              ncclGetLastError(comm_), ")"));
    }
    if (state == ncclSuccess && (!ready || ready())) return;
    const double waited = seconds_since(start);
    if (waited > limit_s) {
      const std::string absent = not_arrived();
      fail(op, detail::concat("did not complete within ", limit_s, " s (waited ", waited,
                              " s; --comm-timeout); ",
                              absent.empty() ? "another rank has probably died, diverged or was "
                                               "started with a different configuration"
                                             : absent));
    }
    backoff.pause();
  }
}

void NcclCommunicator::fail(const std::string& op, const std::string& why) {
  const std::string world =
      board_ ? detail::concat(" (world rank ", board_->world_rank(rank_), ")") : "";
  std::string what =
      detail::concat("rank ", rank_, world, " of NCCL group '", name_, "': ", op, " ", why);
  if (comm_ != nullptr) {
    const ncclResult_t aborted = ncclCommAbort(comm_);  // its kernels exit; it is freed
    comm_ = nullptr;
    what += aborted == ncclSuccess
                ? "; the group's NCCL communicator was aborted"
                : detail::concat("; aborting the group's NCCL communicator failed too (",
                                 ncclGetErrorString(aborted), ")");
  }
  abort_reason_ = what;
  throw Error(what);
}

void NcclCommunicator::arrive() {
  if (board_) board_->arrive();
}

std::string NcclCommunicator::not_arrived() { return board_ ? board_->not_arrived() : ""; }

void NcclCommunicator::check_tensor(const Tensor& t, const char* op, const char* arg) const {
  TANDEM_CHECK(t.defined(), "NCCL group '", name_, "': ", op, ": `", arg,
               "` is an undefined tensor");
  TANDEM_CHECK(!t.released(), "NCCL group '", name_, "': ", op, ": `", arg, "` ('",
               t.storage()->tag(), "') was already released");
  TANDEM_CHECK(t.device() == Device::kCUDA, "NCCL group '", name_, "': ", op, ": `", arg, "` ('",
               t.storage()->tag(), "', ", shape_str(t.shape()),
               ") is on the CPU; the NCCL backend moves CUDA tensors (host tensors go through "
               "the MPI group)");
}

void NcclCommunicator::check_same_dtype(const Tensor& out, const Tensor& in, const char* op) const {
  TANDEM_CHECK(out.dtype() == in.dtype(), "NCCL group '", name_, "': ", op, ": `out` is ",
               dtype_name(out.dtype()), " but `in` is ", dtype_name(in.dtype()),
               "; both must have one dtype");
}

void NcclCommunicator::check_peer(int peer, int tag, const char* op) const {
  TANDEM_CHECK(peer >= 0 && peer < size_, "NCCL group '", name_, "': ", op, ": peer ", peer,
               " is not a rank of this group of ", size_, " (valid: 0..", size_ - 1, ")");
  TANDEM_CHECK(peer != rank_, "NCCL group '", name_, "': ", op, ": rank ", rank_,
               " cannot send to or receive from itself (the send would wait on the stream for "
               "a receive queued behind it); all_to_all_v moves a rank's own rows");
  TANDEM_CHECK(tag >= 0, "NCCL group '", name_, "': ", op, ": tag ", tag,
               " must be non-negative (NCCL matches by call order: Note [NCCL matching])");
}

cudaStream_t NcclCommunicator::stream_using(std::initializer_list<const Tensor*> tensors) {
  const cudaStream_t stream = cuda::current_stream();
  for (const Tensor* t : tensors) cuda::record_stream(*t, stream);
  return stream;
}

void NcclCommunicator::enqueue_p2p(const Tensor& t, int peer, int tag, bool sending) {
  const char* op = sending ? "send" : "recv";
  ensure_usable(op);
  check_tensor(t, op, "t");
  check_peer(peer, tag, op);
  const std::string what = detail::concat(sending ? "send to rank " : "receive from rank ", peer);
  if (t.numel() == 0) return;  // the peer's tensor is empty too: nothing moves
  const cudaStream_t stream = stream_using({&t});
  if (sending) {
    TANDEM_NCCL_CHECK(
        ncclSend(t.raw_data(), count_of(t), nccl_type(t.dtype()), peer, comm_, stream));
  } else {
    TANDEM_NCCL_CHECK(
        ncclRecv(t.raw_data(), count_of(t), nccl_type(t.dtype()), peer, comm_, stream));
  }
  settle(what);
}

void NcclCommunicator::send(const Tensor& t, int peer, int tag) {
  enqueue_p2p(t, peer, tag, /*sending=*/true);
}

std::unique_ptr<PendingSend> NcclCommunicator::isend(const Tensor& t, int peer, int tag) {
  enqueue_p2p(t, peer, tag, /*sending=*/true);
  return std::make_unique<NcclPendingSend>(this, t, peer);  // its event follows the send
}

void NcclCommunicator::recv(const Tensor& t, int peer, int tag) {
  enqueue_p2p(t, peer, tag, /*sending=*/false);
}

// Row width of an all-to-all: both tensors' widths agree when both have rows.
int64_t NcclCommunicator::row_width(const Tensor& out, const Tensor& in) const {
  TANDEM_CHECK(in.dim() >= 1 && out.dim() >= 1, "NCCL group '", name_,
               "': all_to_all_v needs tensors of rows, got `in` ", shape_str(in.shape()),
               " and `out` ", shape_str(out.shape()));
  const int64_t in_width = in.size(0) > 0 ? in.numel() / in.size(0) : -1;
  const int64_t out_width = out.size(0) > 0 ? out.numel() / out.size(0) : -1;
  TANDEM_CHECK(in_width < 0 || out_width < 0 || in_width == out_width, "NCCL group '", name_,
               "': all_to_all_v: rows of `in` ", shape_str(in.shape()), " hold ", in_width,
               " elements but rows of `out` ", shape_str(out.shape()), " hold ", out_width);
  return std::max<int64_t>({in_width, out_width, 0});
}

// Checks one side's row counts; returns each peer's first row.
std::vector<int64_t> NcclCommunicator::row_offsets(const std::vector<int64_t>& rows,
                                                   const Tensor& t, const char* which) const {
  TANDEM_CHECK(static_cast<int>(rows.size()) == size_, "NCCL group '", name_,
               "': all_to_all_v: ", which, " has ", rows.size(), " counts for a group of ", size_,
               " ranks");
  std::vector<int64_t> offsets(rows.size());
  int64_t total = 0;
  for (size_t p = 0; p < rows.size(); ++p) {
    TANDEM_CHECK(rows[p] >= 0, "NCCL group '", name_, "': all_to_all_v: ", which, "[", p, "] is ",
                 rows[p], "; row counts must be non-negative");
    offsets[p] = total;
    total += rows[p];
  }
  TANDEM_CHECK(total <= t.size(0), "NCCL group '", name_, "': all_to_all_v: ", which,
               " adds up to ", total, " rows but the tensor ", shape_str(t.shape()), " has ",
               t.size(0));
  return offsets;
}

void NcclCommunicator::all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_rows,
                                    const Tensor& in, const std::vector<int64_t>& send_rows) {
  ensure_usable("all-to-all");
  check_tensor(out, "all_to_all_v", "out");
  check_tensor(in, "all_to_all_v", "in");
  check_same_dtype(out, in, "all_to_all_v");
  const int64_t width = row_width(out, in);
  const std::vector<int64_t> send_at = row_offsets(send_rows, in, "send_rows");
  const std::vector<int64_t> recv_at = row_offsets(recv_rows, out, "recv_rows");
  const cudaStream_t stream = stream_using({&out, &in});
  const ncclDataType_t type = nccl_type(in.dtype());
  const int64_t row_bytes = width * dtype_size(in.dtype());
  // Every argument is checked: from here on only NCCL can fail, and a failed group is dropped.
  char* sbuf = in.numel() > 0 ? static_cast<char*>(in.raw_data()) : nullptr;
  char* rbuf = out.numel() > 0 ? static_cast<char*>(out.raw_data()) : nullptr;
  arrive();
  NcclGroup group;
  for (int p = 0; p < size_; ++p) {
    // Zero rows: the peer has zero rows for us too, so neither side posts anything.
    if (send_rows[p] > 0 && width > 0) {
      TANDEM_NCCL_CHECK(ncclSend(sbuf + send_at[p] * row_bytes,
                                 static_cast<size_t>(send_rows[p] * width), type, p, comm_,
                                 stream));
    }
    if (recv_rows[p] > 0 && width > 0) {
      TANDEM_NCCL_CHECK(ncclRecv(rbuf + recv_at[p] * row_bytes,
                                 static_cast<size_t>(recv_rows[p] * width), type, p, comm_,
                                 stream));
    }
  }
  group.end();
  settle("all-to-all");
}

void NcclCommunicator::all_reduce_sum(const Tensor& t) {
  ensure_usable("all-reduce");
  check_tensor(t, "all_reduce_sum", "t");
  if (t.numel() == 0) return;
  const cudaStream_t stream = stream_using({&t});
  arrive();
  TANDEM_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), count_of(t), nccl_type(t.dtype()),
                                  ncclSum, comm_, stream));
  settle("all-reduce");
}

void NcclCommunicator::reduce_scatter_sum(const Tensor& out, const Tensor& in) {
  ensure_usable("reduce-scatter");
  check_tensor(out, "reduce_scatter_sum", "out");
  check_tensor(in, "reduce_scatter_sum", "in");
  check_same_dtype(out, in, "reduce_scatter_sum");
  TANDEM_CHECK(out.numel() * size_ == in.numel(), "NCCL group '", name_,
               "': reduce_scatter_sum: `in` ", shape_str(in.shape()), " must hold ", size_,
               " x the ", out.numel(), " elements of `out` ", shape_str(out.shape()));
  if (out.numel() == 0) return;
  const cudaStream_t stream = stream_using({&out, &in});
  arrive();
  TANDEM_NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), count_of(out),
                                      nccl_type(in.dtype()), ncclSum, comm_, stream));
  settle("reduce-scatter");
}

void NcclCommunicator::all_gather(const Tensor& out, const Tensor& in) {
  ensure_usable("all-gather");
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "in");
  check_same_dtype(out, in, "all_gather");
  TANDEM_CHECK(out.numel() == in.numel() * size_, "NCCL group '", name_, "': all_gather: `out` ",
               shape_str(out.shape()), " must hold ", size_, " x the ", in.numel(),
               " elements of `in` ", shape_str(in.shape()));
  if (in.numel() == 0) return;
  const cudaStream_t stream = stream_using({&out, &in});
  arrive();
  TANDEM_NCCL_CHECK(ncclAllGather(in.raw_data(), out.raw_data(), count_of(in),
                                  nccl_type(in.dtype()), comm_, stream));
  settle("all-gather");
}

void NcclCommunicator::broadcast(const Tensor& t, int root) {
  ensure_usable("broadcast");
  check_tensor(t, "broadcast", "t");
  TANDEM_CHECK(root >= 0 && root < size_, "NCCL group '", name_, "': broadcast: root ", root,
               " is not a rank of this group of ", size_, " (valid: 0..", size_ - 1, ")");
  if (t.numel() == 0) return;
  const cudaStream_t stream = stream_using({&t});
  arrive();
  TANDEM_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), count_of(t), nccl_type(t.dtype()),
                                  root, comm_, stream));
  settle(detail::concat("broadcast from rank ", root));
}

void NcclCommunicator::barrier() {
  ensure_usable("barrier");
  const cudaStream_t stream = cuda::current_stream();
  Tensor flag =
      Tensor::zeros({1}, DType::kI32, MemCategory::kCommunication, "nccl.barrier", Device::kCUDA);
  arrive();
  TANDEM_NCCL_CHECK(
      ncclAllReduce(flag.raw_data(), flag.raw_data(), 1, ncclInt32, ncclSum, comm_, stream));
  settle("barrier");
  watch("barrier", timeout_s_,
        [stream] { return cuda_done(cudaStreamQuery(stream), "cudaStreamQuery"); });
}

void NcclCommunicator::synchronize() {
  ensure_usable("synchronize");
  const cudaStream_t stream = cuda::current_stream();
  watch(detail::concat(
            "the work enqueued on the current stream (its last NCCL operation: ", last_op_, ")"),
        timeout_s_, [stream] { return cuda_done(cudaStreamQuery(stream), "cudaStreamQuery"); });
}

std::vector<std::string> NcclCommunicator::all_gather_bytes(const std::string& mine) {
  return mpi_->all_gather_bytes(mine);  // host bytes: the MPI group's bounded wait
}

std::unique_ptr<Communicator> NcclCommunicator::subgroup(const std::vector<int>& ranks,
                                                         const std::string& name) {
  TANDEM_CHECK(!ranks.empty(), "NCCL group '", name_, "': subgroup '", name, "' lists no ranks");
  return std::make_unique<NcclCommunicator>(mpi_->subgroup(ranks, name), timeout_s_);
}

std::string nccl_version() {
  int code = 0;
  TANDEM_NCCL_CHECK(ncclGetVersion(&code));
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  return detail::concat("NCCL ", code / 10000, ".", code / 100 % 100, ".", code % 100,
                        " (built with ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH, ")");
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& mpi_group,
                                                         double timeout_s) {
  return std::make_unique<NcclCommunicator>(mpi_group, timeout_s);
}

}  // namespace tandem::comm
