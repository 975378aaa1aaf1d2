// Helpers shared by MPI tests.
#pragma once
#include <mpi.h>

#include <memory>

#include "trident/comm/mpi/mpi_communicator.hpp"

namespace trident::testing {
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// Every rank of the test job as a Communicator (wraps MPI_COMM_WORLD, not owned).
inline Communicator& world_comm() {
  static MpiCommunicator world(MPI_COMM_WORLD, CommKind::world, "world", 300.0, false);
  return world;
}
// The world ranks of colour `color` as a group of `kind` (owned, 60 s
// deadlines), ordered by world rank. Collective over the world.
inline std::unique_ptr<Communicator> split_world(int color, CommKind kind, const char* name) {
  MPI_Comm c;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &c);
  return std::make_unique<MpiCommunicator>(c, kind, name, 60.0, true);
}
// A CP group of `cp` adjacent world ranks (mesh order: cp fastest).
inline std::unique_ptr<Communicator> split_cp(int cp) {
  return split_world(world_rank() / cp, CommKind::cp, "cp");
}
}  // namespace trident::testing
