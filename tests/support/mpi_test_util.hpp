// Helpers shared by MPI tests.
#pragma once
#include <mpi.h>

#include "trident/comm/mpi/mpi_communicator.hpp"

namespace trident::testing {
inline int world_rank() { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
inline int world_size() { int s = 1; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }
// Every rank of the test job as a Communicator (wraps MPI_COMM_WORLD, not owned).
inline Communicator& world_comm() {
  static MpiCommunicator world(MPI_COMM_WORLD, CommKind::world, "world", 300.0, false);
  return world;
}
}  // namespace trident::testing
