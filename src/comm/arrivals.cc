// The arrival counts of a group's collectives (Note [Who did not arrive] in arrivals.h).
#include "comm/arrivals.h"

#include <exception>

namespace tandem::comm {
namespace {

constexpr int kArrivalTag = 1;

// The world rank of each rank of `comm`.
std::vector<int> world_ranks_of(MPI_Comm comm, int size) {
  MPI_Group group, world;
  TANDEM_MPI_CHECK(MPI_Comm_group(comm, &group));
  TANDEM_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> mine(static_cast<size_t>(size)), theirs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) mine[r] = r;
  TANDEM_MPI_CHECK(MPI_Group_translate_ranks(group, size, mine.data(), world, theirs.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return theirs;
}

}  // namespace

ArrivalBoard::ArrivalBoard(MPI_Comm announcements) : comm_(announcements) {
  TANDEM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  TANDEM_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  arrived_.assign(static_cast<size_t>(size_), 0);
  world_ranks_ = world_ranks_of(comm_, size_);
}

ArrivalBoard::~ArrivalBoard() {
  try {
    receive();
  } catch (const std::exception&) {  // a destructor must not throw; the counts are unused now
  }
  MPI_Comm_free(&comm_);
}

void ArrivalBoard::arrive() {
  static char empty = 0;  // an empty message reads nothing from its buffer
  receive();
  ++entered_;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    MPI_Request req;
    TANDEM_MPI_CHECK(MPI_Isend(&empty, 0, MPI_CHAR, p, kArrivalTag, comm_, &req));
    TANDEM_MPI_CHECK(MPI_Request_free(&req));  // completes on its own; nothing to keep alive
  }
}

void ArrivalBoard::receive() {
  for (;;) {
    int pending = 0;
    MPI_Status status;
    TANDEM_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, comm_, &pending, &status));
    if (!pending) return;
    char empty = 0;
    TANDEM_MPI_CHECK(
        MPI_Recv(&empty, 0, MPI_CHAR, status.MPI_SOURCE, kArrivalTag, comm_, MPI_STATUS_IGNORE));
    ++arrived_[static_cast<size_t>(status.MPI_SOURCE)];
  }
}

std::string ArrivalBoard::not_arrived() {
  receive();
  std::string missing;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || arrived_[static_cast<size_t>(p)] >= entered_) continue;
    missing += detail::concat(missing.empty() ? "" : ", ", "rank ", p, " (world rank ",
                              world_rank(p), ")");
  }
  if (missing.empty()) return "";
  return "not arrived: " + missing + " (stopped, hung, or still in an earlier operation)";
}

}  // namespace tandem::comm
