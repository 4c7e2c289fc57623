#pragma once
// The process-wide MPI communicator of the MPI test binary (tests/distributed/mpi/), made in main().
#include "distributed/mpi_communicator.h"

namespace scalelab::testing {
MpiCommunicator& mpi_world();
}  // namespace scalelab::testing
