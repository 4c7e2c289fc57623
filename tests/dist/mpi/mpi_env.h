#pragma once
// The process-wide MPI communicator of the MPI test binary (tests/dist/mpi/), made in main().
#include "dist/mpi_communicator.h"

namespace scalelab::testing {
MpiCommunicator& mpi_world();
}  // namespace scalelab::testing
