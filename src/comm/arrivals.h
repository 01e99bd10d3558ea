// Which ranks of a group have entered its collectives, for the message of a collective that
// times out (Note [Who did not arrive]); used by the MPI and the NCCL communicators.
//
// Note [Who did not arrive]: when a collective times out, the message names the ranks that never
// reached it, not only the group. Each rank, as it enters a collective, sends every other rank of
// the group an empty message on a duplicate of the group's MPI communicator (so it matches
// nothing else), and counts the ones it receives from each peer; MPI keeps one sender's messages
// in order, so a peer's count is the number of the group's collectives it has entered. On a
// timeout the rank receives what has arrived and names each peer whose count is below its own:
// that peer has stopped, hangs, or is still in an earlier operation. The cost is size - 1 empty
// sends and a probe per collective (MPI sends them eagerly: the sender never waits). An NCCL
// group announces on a duplicate of the MPI group it was built from; there a rank enters a
// collective when it enqueues it, so a healthy peer whose host already waits for the GPU at an
// earlier point is named too ("still in an earlier operation").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_check.h"

namespace tandem::comm {

class ArrivalBoard {
 public:
  // `announcements`: a duplicate of the group's MPI communicator that carries nothing else;
  // the board owns it.
  explicit ArrivalBoard(MPI_Comm announcements);
  // Receives what has arrived and frees the communicator.
  ~ArrivalBoard();
  ArrivalBoard(const ArrivalBoard&) = delete;
  ArrivalBoard& operator=(const ArrivalBoard&) = delete;

  // Tells every peer that this rank enters the group's next collective; never waits.
  void arrive();
  // "not arrived: rank 2 (world rank 5), rank 3 (world rank 6) (stopped, hung, or still in an
  // earlier operation)": the peers that have not announced every collective this rank entered
  // (group rank and world rank); "" when none.
  std::string not_arrived();
  int world_rank(int group_rank) const { return world_ranks_[static_cast<size_t>(group_rank)]; }

 private:
  void receive();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int64_t entered_ = 0;           // collectives this rank has entered
  std::vector<int64_t> arrived_;  // of each peer: collectives it has announced to this rank
  std::vector<int> world_ranks_;  // of each group rank
};

}  // namespace tandem::comm
