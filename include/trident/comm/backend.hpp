// Choice of the communication backend (runtime.comm, core's CommBackend),
// made once per job:
//   mpi   MpiCommunicator, host buffers (always built)
//   nccl  NcclCommunicator, device buffers; built when CUDA and NCCL are
//         found (TRIDENT_HAVE_NCCL), usable on a rank that sees a GPU
//   auto  nccl where it is built, a GPU is visible and runtime.backend is
//         "cuda", else mpi (host tensors travel over MPI)
// The world communicator and control traffic stay on MPI; the groups of the
// mesh (cp, pp, dp, ep, ...) are made on the chosen backend by comm_group().
#pragma once
#include <memory>
#include <string>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"

namespace trident {

// Whether this build has the NCCL backend.
bool nccl_built();

// runtime.comm resolved on this rank (mpi or nccl, never automatic).
// `error` is one line naming runtime.comm and why ("nccl" without NCCL in
// the build, or on a rank that sees no GPU); empty when the choice is
// usable. Communicates nothing.
struct CommChoice {
  CommBackend backend = CommBackend::mpi;
  std::string error;
};
CommChoice choose_comm_backend(CommBackend setting, Backend kernel_backend);

// choose_comm_backend on every rank of world, agreed (collective): throws
// InputError on every rank, with the first failing rank's line, when any
// rank's choice is unusable.
CommBackend agree_comm_backend(Communicator& world, CommBackend setting, Backend kernel_backend);

// A group of world's ranks on `backend` (mpi or nccl; collective over
// world): the ranks passing the same color (>= 0), ordered by key; its
// waits have timeout_s.
std::unique_ptr<Communicator> comm_group(Communicator& world, CommBackend backend, int color,
                                         int key, CommKind kind, std::string name,
                                         double timeout_s);

// What comm_group makes of a host group on the nccl backend: an
// NcclCommunicator, on the CUDA device current at that moment. Tests
// replace it (null: NcclCommunicator again) to see, without a GPU, on
// which device every group is made (tests/mpi/topo/test_device_binding.cpp).
using DeviceGroupMaker = std::unique_ptr<Communicator> (*)(std::unique_ptr<Communicator> host);
void set_device_group_maker_for_testing(DeviceGroupMaker maker);

}  // namespace trident
