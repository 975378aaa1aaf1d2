// Topology: what this job runs on (nodes, devices, NVLink domains) and the
// communicators of each group kind, built from the mesh.
//
// Detection: nodes from the ranks that share memory (split_node), labelled
// by SLURMD_NODENAME or the host name; device = local rank % CUDA device
// count (TRIDENT_DEVICE overrides); NVLink domains from NVML (dlopen'ed,
// optional). The [topology] table or
// TRIDENT_TOPOLOGY="nodes=2,devices_per_node=4,nvlink_domain=4" replaces
// detection; `source` records which was used.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/backend.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/topo/mesh.hpp"

namespace trident {

struct RankInfo {
  int rank = 0;     // MPI world rank
  int logical = 0;  // position in the mesh order (node-major)
  int node = 0, local_rank = 0, device = -1;
  std::string hostname;  // node label
};

struct Topology {
  ClusterShape shape;
  std::string source = "detected";  // "detected" | "override"
  std::vector<RankInfo> ranks;      // indexed by MPI world rank
  int cuda_devices = 0;             // visible CUDA devices on this node
};

// Collective over world. Throws InputError if the override does not match
// the world size.
Topology detect_topology(Communicator& world, const Config& cfg);

// The communicators of one rank. Group ranks follow the mesh's order.
struct Communicators {
  Mesh mesh;
  Topology topo;
  int world_rank = 0;
  RankCoord me;
  // world is on MPI; the others on comm_backend (runtime.comm, resolved).
  std::unique_ptr<Communicator> world, cp, pp, dp, dpcp, ep, expert_replica;
  CommBackend comm_backend = CommBackend::mpi;
  // This rank's kernel device: runtime.backend on the device the topology
  // chose (RankInfo::device), current from before the first group on.
  Device device = Device::cpu();
  // pp neighbours as pp-group ranks (-1 at the ends).
  int pp_prev() const { return me.pp > 0 ? me.pp - 1 : -1; }
  int pp_next() const { return me.pp + 1 < mesh.pp ? me.pp + 1 : -1; }
};

// Maps the config's request onto the topology, makes this rank's device
// (runtime.backend on the topology's choice) current, then splits the
// communicators on runtime.comm's backend, so a device group is made on the
// rank's own device. Collective over world. Throws InputError, on every rank
// alike, for an impossible mesh, an unusable runtime.comm or runtime.backend.
std::unique_ptr<Communicators> build_communicators(Communicator& world, const Config& cfg,
                                                   Topology topo);

// Text table rank -> node, local rank, device, pp, dp, cp, ep (`trident topo`).
std::string topology_table(const Communicators& c);

}  // namespace trident
