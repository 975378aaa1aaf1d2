// runtime.comm resolved once per job and agreed by every rank, and the
// factory that makes the mesh's groups on the chosen backend.
#include "trident/comm/backend.hpp"

#include <algorithm>
#include <cstdlib>

#include "trident/comm/mpi/mpi_communicator.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/backend.hpp"
#ifdef TRIDENT_HAVE_NCCL
#include "trident/comm/nccl/nccl_communicator.hpp"
#endif

namespace trident {

bool nccl_built() {
#ifdef TRIDENT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// GPUs this process sees (0 in a build without NCCL).
int visible_gpus() {
#ifdef TRIDENT_HAVE_NCCL
  return kernels::visible_cuda_devices();
#else
  return 0;
#endif
}

DeviceGroupMaker device_group_maker = nullptr;  // set by tests only

}  // namespace

CommChoice choose_comm_backend(CommBackend setting, Backend kernel_backend) {
  CommChoice c;
  if (setting == CommBackend::mpi) return c;
  if (setting == CommBackend::automatic) {
    // NCCL moves device buffers; "auto" picks it only where the kernels run
    // on the GPU (backend "cuda", or "auto" on a rank that sees one), never
    // for host tensors, and only where every local rank has a GPU of its
    // own (NCCL refuses two ranks on one device; they share it through MPI's
    // host staging instead).
    const bool on_gpu = kernel_backend == Backend::cuda || kernel_backend == Backend::automatic;
    const int gpus = nccl_built() ? visible_gpus() : 0;
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int local_ranks = local ? std::max(1, std::atoi(local)) : 1;
    if (on_gpu && gpus > 0 && local_ranks <= gpus) c.backend = CommBackend::nccl;
    return c;
  }
  const std::string key = "runtime.comm = \"nccl\": ";
  if (!nccl_built()) {
    c.error = key + "this build has no NCCL (built without CUDA/NCCL); use \"mpi\" or \"auto\"";
  } else if (visible_gpus() == 0) {
    c.error =
        key + "rank " + std::to_string(comm_world_rank()) + " sees no GPU; use \"mpi\" or \"auto\"";
  } else {
    c.backend = CommBackend::nccl;
  }
  return c;
}

CommBackend agree_comm_backend(Communicator& world, CommBackend setting, Backend kernel_backend) {
  const CommChoice mine = choose_comm_backend(setting, kernel_backend);
  // The first failing rank's line, on every rank: an input error that all
  // ranks raise alike ends the job cleanly with exit code 2.
  const CheckOutcome all = agree_on_check(world.host(), mine.error.empty(), mine.error);
  if (!all.all_passed) throw InputError(all.message);
  return mine.backend;
}

std::unique_ptr<Communicator> comm_group(Communicator& world, CommBackend backend, int color,
                                         int key, CommKind kind, std::string name,
                                         double timeout_s) {
  // The group on the host backend first (a device backend bootstraps over it).
  auto group = world.host().split(color, key, kind, std::move(name));
  if (!group) return group;
  group->set_timeout_s(timeout_s);
  if (backend == CommBackend::mpi) return group;
  if (device_group_maker) return device_group_maker(std::move(group));
#ifdef TRIDENT_HAVE_NCCL
  return std::make_unique<NcclCommunicator>(std::move(group));
#else
  throw Error("comm_group: only MPI is built");
#endif
}

void set_device_group_maker_for_testing(DeviceGroupMaker maker) { device_group_maker = maker; }

}  // namespace trident
