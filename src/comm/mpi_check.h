// MPI's C API for the communicators' sources (src/comm only: the MPI target is private to
// tandem_comm), and TANDEM_MPI_CHECK over it.
#pragma once

// The C API only: the deprecated C++ bindings do not compile cleanly with -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <string>

#include "core/error.h"

namespace tandem::comm {

// MPI's text for a failed call's return code.
inline std::string mpi_error_text(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, len);
}

}  // namespace tandem::comm

// Throws tandem::InternalError naming the call and MPI's text unless it returned MPI_SUCCESS.
#define TANDEM_MPI_CHECK(call)                                                            \
  do {                                                                                    \
    const int tandem_mpi_rc_ = (call);                                                    \
    if (tandem_mpi_rc_ != MPI_SUCCESS)                                                    \
      TANDEM_INTERNAL_ERROR("MPI call ", #call,                                           \
                            " failed: ", ::tandem::comm::mpi_error_text(tandem_mpi_rc_)); \
  } while (false)
