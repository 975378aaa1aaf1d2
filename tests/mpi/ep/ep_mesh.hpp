// Meshes for the EP MPI tests: ep groups of contiguous ranks, their expert
// replicas (same position in every ep group), and cp pairs of adjacent ranks.
#pragma once
#include <mpi.h>

#include <memory>

#include "mpi_test_util.hpp"
#include "trident/comm/comm.hpp"

namespace trident::eptest {

using testing::split_world;

struct EpMesh {
  int ep = 1, cp = 1;
  std::unique_ptr<Communicator> ep_comm, replicas, cp_comm, world;
  EpMesh(int ep_size, int cp_size) : ep(ep_size), cp(cp_size) {
    const int r = testing::world_rank();
    ep_comm = split_world(r / ep, CommKind::ep, "ep");
    replicas = split_world(r % ep, CommKind::dp, "expert replicas");
    cp_comm = split_world(r / cp, CommKind::cp, "cp");
    world = split_world(0, CommKind::world, "world");
  }
};

}  // namespace trident::eptest
