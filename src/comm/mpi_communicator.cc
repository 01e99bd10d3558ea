// MPI backend: nonblocking MPI calls polled against a deadline (Note [Bounded waits]).
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comm/arrivals.h"
#include "comm/mpi_check.h"
#include "core/error.h"

namespace tandem::comm {
namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kBF16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

int as_count(int64_t n, const char* what) {
  TANDEM_CHECK(n >= 0 && n <= INT_MAX, what, ": ", n, " elements exceed MPI's int count");
  return static_cast<int>(n);
}

enum class WaitKind : uint8_t { kPointToPoint, kCollective, kSetUp };

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_s)
      : comm_(comm), name_(std::move(name)), timeout_s_(timeout_s) {
    TANDEM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    TANDEM_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    TANDEM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
    board_ = new_board();
  }
  ~MpiCommunicator() override {
    board_.reset();
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void send(const Tensor& t, int peer, int tag) override {
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Isend(t.raw_data(), as_count(t.numel(), "send"), mpi_type(t.dtype()), peer,
                               tag, comm_, &req));
    wait(req, "send to", peer);
  }

  std::unique_ptr<PendingSend> isend(const Tensor& t, int peer, int tag) override;

  void recv(const Tensor& t, int peer, int tag) override {
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Irecv(t.raw_data(), as_count(t.numel(), "recv"), mpi_type(t.dtype()), peer,
                               tag, comm_, &req));
    wait(req, "receive from", peer);
  }

  void all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_rows, const Tensor& in,
                    const std::vector<int64_t>& send_rows) override {
    TANDEM_ASSERT(static_cast<int>(recv_rows.size()) == size_ &&
                  static_cast<int>(send_rows.size()) == size_);
    const int64_t width = in.dim() > 0 && in.size(0) > 0
                              ? in.numel() / in.size(0)
                              : (out.dim() > 0 && out.size(0) > 0 ? out.numel() / out.size(0) : 0);
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    int64_t s_off = 0, r_off = 0;
    for (int p = 0; p < size_; ++p) {
      sc[p] = as_count(send_rows[p] * width, "all_to_all_v");
      rc[p] = as_count(recv_rows[p] * width, "all_to_all_v");
      sd[p] = as_count(s_off, "all_to_all_v");
      rd[p] = as_count(r_off, "all_to_all_v");
      s_off += sc[p];
      r_off += rc[p];
    }
    TANDEM_ASSERT(s_off <= in.numel() && r_off <= out.numel(), "all_to_all_v counts");
    static float dummy = 0;  // MPI wants a valid pointer even for zero-sized buffers
    void* sbuf = in.numel() ? in.raw_data() : &dummy;
    void* rbuf = out.numel() ? out.raw_data() : &dummy;
    board_->arrive();
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Ialltoallv(sbuf, sc.data(), sd.data(), mpi_type(in.dtype()), rbuf,
                                    rc.data(), rd.data(), mpi_type(in.dtype()), comm_, &req));
    wait(req, "all-to-all in", -1, WaitKind::kCollective);
  }

  void all_reduce_sum(const Tensor& t) override {
    board_->arrive();
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), as_count(t.numel(), "all_reduce"),
                                    mpi_type(t.dtype()), MPI_SUM, comm_, &req));
    wait(req, "all-reduce in", -1, WaitKind::kCollective);
  }

  void reduce_scatter_sum(const Tensor& out, const Tensor& in) override {
    TANDEM_ASSERT(out.numel() * size_ == in.numel());
    board_->arrive();
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(),
                                               as_count(out.numel(), "reduce_scatter"),
                                               mpi_type(in.dtype()), MPI_SUM, comm_, &req));
    wait(req, "reduce-scatter in", -1, WaitKind::kCollective);
  }

  void all_gather(const Tensor& out, const Tensor& in) override {
    TANDEM_ASSERT(out.numel() == in.numel() * size_);
    board_->arrive();
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Iallgather(
        in.raw_data(), as_count(in.numel(), "all_gather"), mpi_type(in.dtype()), out.raw_data(),
        as_count(in.numel(), "all_gather"), mpi_type(in.dtype()), comm_, &req));
    wait(req, "all-gather in", -1, WaitKind::kCollective);
  }

  void broadcast(const Tensor& t, int root) override {
    board_->arrive();
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Ibcast(t.raw_data(), as_count(t.numel(), "broadcast"), mpi_type(t.dtype()),
                                root, comm_, &req));
    wait(req, "broadcast from", root, WaitKind::kCollective);
  }

  void barrier() override {
    board_->arrive();
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Ibarrier(comm_, &req));
    wait(req, "barrier in", -1, WaitKind::kCollective);
  }

  std::vector<std::string> all_gather_bytes(const std::string& mine) override;
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks,
                                         const std::string& name) override;

  // A board of Note [Who did not arrive] on a new duplicate of this communicator (collective).
  std::unique_ptr<ArrivalBoard> new_board();

 private:
  friend class MpiPendingSend;
  void wait(MPI_Request& req, const char* op, int peer, WaitKind kind = WaitKind::kPointToPoint);

  MPI_Comm comm_;
  std::string name_;
  double timeout_s_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  std::unique_ptr<ArrivalBoard> board_;  // Note [Who did not arrive]
};

class MpiPendingSend final : public PendingSend {
 public:
  MpiPendingSend(MpiCommunicator* comm, Tensor t, int peer)
      : comm_(comm), t_(std::move(t)), peer_(peer) {}
  ~MpiPendingSend() override {
    if (req_ == MPI_REQUEST_NULL) return;  // only on an error path: abandon the send
    MPI_Cancel(&req_);
    MPI_Request_free(&req_);
  }
  void wait() override {
    if (req_ != MPI_REQUEST_NULL) comm_->wait(req_, "send to", peer_);
  }
  bool done() override {
    int flag = 1;
    if (req_ != MPI_REQUEST_NULL) TANDEM_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;  // a completed request is MPI_REQUEST_NULL from here on
  }
  MPI_Request req_ = MPI_REQUEST_NULL;

 private:
  MpiCommunicator* comm_;
  Tensor t_;  // keeps the storage alive until the send completes
  int peer_;
};

std::unique_ptr<PendingSend> MpiCommunicator::isend(const Tensor& t, int peer, int tag) {
  auto pending = std::make_unique<MpiPendingSend>(this, t, peer);
  TANDEM_MPI_CHECK(MPI_Isend(t.raw_data(), as_count(t.numel(), "send"), mpi_type(t.dtype()), peer,
                             tag, comm_, &pending->req_));
  return pending;
}

std::unique_ptr<ArrivalBoard> MpiCommunicator::new_board() {
  MPI_Comm announcements;
  MPI_Request req;  // a collective too: bounded like the others (Note [Bounded waits])
  TANDEM_MPI_CHECK(MPI_Comm_idup(comm_, &announcements, &req));
  wait(req, "set-up of", -1, WaitKind::kSetUp);
  return std::make_unique<ArrivalBoard>(announcements);
}

void MpiCommunicator::wait(MPI_Request& req, const char* op, int peer, WaitKind kind) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    int done = 0;
    TANDEM_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited > timeout_s_) {
      const std::string head =
          detail::concat("rank ", rank_, " (world rank ", world_rank_, ") of group '", name_,
                         "': ", op, " ", peer >= 0 ? "rank " + std::to_string(peer) : "the group",
                         " did not complete within ", timeout_s_, " s (--comm-timeout)");
      if (kind != WaitKind::kCollective) {
        throw Error(detail::concat(head, "; ", peer >= 0 ? "that rank" : "a rank of the group",
                                   " has probably died, hung or diverged, or was started with a "
                                   "different configuration"));
      }
      const std::string absent = board_->not_arrived();  // Note [Who did not arrive]
      throw Error(detail::concat(
          head, "; ",
          absent.empty() ? "every rank of the group entered it, so one stopped inside it"
                         : absent));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

std::vector<std::string> MpiCommunicator::all_gather_bytes(const std::string& mine) {
  Tensor len = Tensor::empty({1}, DType::kI64, MemCategory::kCommunication, "gather.len");
  len.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  Tensor lens = Tensor::empty({size_}, DType::kI64, MemCategory::kCommunication, "gather.lens");
  all_gather(lens, len);
  std::vector<int> counts(size_), displs(size_);
  int total = 0;
  for (int p = 0; p < size_; ++p) {
    counts[p] = as_count(lens.data<int64_t>()[p], "all_gather_bytes");
    displs[p] = total;
    total += counts[p];
  }
  std::string all(static_cast<size_t>(std::max(total, 1)), '\0');
  board_->arrive();
  MPI_Request req;
  TANDEM_MPI_CHECK(MPI_Iallgatherv(mine.data(), counts[rank_], MPI_CHAR, all.data(), counts.data(),
                                   displs.data(), MPI_CHAR, comm_, &req));
  wait(req, "all-gather in", -1, WaitKind::kCollective);
  std::vector<std::string> out;
  for (int p = 0; p < size_; ++p) out.push_back(all.substr(displs[p], counts[p]));
  return out;
}

std::unique_ptr<Communicator> MpiCommunicator::subgroup(const std::vector<int>& ranks,
                                                        const std::string& name) {
  const int color = *std::min_element(ranks.begin(), ranks.end());
  const int key = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  TANDEM_ASSERT(key < static_cast<int>(ranks.size()), "rank ", rank_, " not in its own group");
  MPI_Comm sub;
  TANDEM_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  return std::make_unique<MpiCommunicator>(sub, name, timeout_s_);
}

bool g_started = false;

}  // namespace

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

int local_size() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}) {
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  }
  return 1;
}

bool mpi_initialize(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return true;
  int provided = 0;
  TANDEM_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  g_started = true;
  TANDEM_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI library provides thread level ",
               provided, " but tandem needs MPI_THREAD_SERIALIZED");
  return true;
}

void mpi_finalize() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized && g_started) MPI_Finalize();
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

std::unique_ptr<Communicator> mpi_world(double timeout_s) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", timeout_s);
}

std::unique_ptr<ArrivalBoard> arrival_board(Communicator& group) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&group);
  return mpi != nullptr ? mpi->new_board() : nullptr;
}

}  // namespace tandem::comm
