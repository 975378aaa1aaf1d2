// Helpers shared by MPI tests.
#pragma once
#include <mpi.h>

namespace trident::testing {
inline int world_rank() { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
inline int world_size() { int s = 1; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }
}  // namespace trident::testing
