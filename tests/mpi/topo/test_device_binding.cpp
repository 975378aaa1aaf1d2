// Device selection on a node with several GPUs, without a GPU: 8 ranks over
// two simulated nodes of 4 GPUs ([topology] nodes = 2, devices_per_node = 4),
// a fake device runtime (kernels::DeviceRuntime) that reports 4 devices and
// records what each rank makes current, and a fake NCCL group maker that
// records the device current when each device group is made. Every rank's
// device must come from its topology (local rank, or TRIDENT_DEVICE), be
// made current once, before the first group, and every NCCL group and the
// trainer's device must be that one.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "env_guard.hpp"
#include "mpi_test_util.hpp"
#include "trident/comm/backend.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;
using trident::testing::EnvGuard;
using trident::testing::world_rank;

namespace {

constexpr int kGpusPerNode = 4;

// What the fakes saw on this rank.
struct Seen {
  int sets = 0;                    // set_current calls
  int current = -1;                // the current device (-1: none made current)
  std::vector<int> group_devices;  // the current device as each device group was made
};
Seen seen;

const kernels::DeviceRuntime kFakeRuntime{[] { return kGpusPerNode; },
                                          [](int device) {
                                            ++seen.sets;
                                            seen.current = device;
                                          },
                                          [] { return seen.current < 0 ? 0 : seen.current; }};

std::unique_ptr<Communicator> fake_nccl_group(std::unique_ptr<Communicator> host) {
  seen.group_devices.push_back(seen.current);
  return host;  // the host group stands in for the NCCL one
}

// Installs the fakes for a scope and restores the real runtime after it.
struct Fakes {
  Fakes() {
    seen = Seen{};
    kernels::set_device_runtime_for_testing(&kFakeRuntime);
    set_device_group_maker_for_testing(fake_nccl_group);
  }
  ~Fakes() {
    kernels::set_device_runtime_for_testing(nullptr);
    set_device_group_maker_for_testing(nullptr);
  }
};

// pp 2 x dp 2 x cp 2 with ep 2: every group kind has members on both nodes'
// devices.
Config mesh_config() {
  Config cfg;
  cfg.source = "test.toml";
  cfg.topology = TopologyOverride{2, kGpusPerNode, kGpusPerNode};
  cfg.parallel.pp = 2;
  cfg.parallel.cp = 2;
  cfg.parallel.ep = 2;
  cfg.model.n_experts = 8;
  cfg.runtime.backend = Backend::cuda;
  cfg.runtime.comm = CommBackend::nccl;
  cfg.runtime.timeout_s = 30;
  return cfg;
}

// Builds the communicators under the fakes; checks what they saw against
// `want`, this rank's device.
void check_binding(int want) {
  Fakes fakes;
  Communicator& world = trident::testing::world_comm();
  const Config cfg = mesh_config();
  auto c = build_communicators(world, cfg, detect_topology(world, cfg));
  CHECK(c->topo.ranks[size_t(world_rank())].device == want);
  CHECK(c->comm_backend == CommBackend::nccl);
  CHECK(c->device == Device::cuda(want));
  CHECK(seen.sets == 1);  // chosen once
  CHECK(seen.current == want);
  // cp, pp, dp, dpcp, ep, expert_replica: each made on this rank's device.
  CHECK(seen.group_devices.size() == 6);
  for (int d : seen.group_devices) CHECK(d == want);
  // The trainer computes on the current device.
  CHECK(train::training_device(Backend::cuda) == Device::cuda(want));
  CHECK(train::training_device(Backend::automatic) == Device::cuda(want));
  CHECK(train::training_device(Backend::cpu) == Device::cpu());
}

}  // namespace

TEST_CASE("each rank's NCCL groups and trainer are on its local rank's GPU", "[np8]") {
  REQUIRE(trident::testing::world_size() == 8);
  EnvGuard g("TRIDENT_DEVICE"), gt("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_DEVICE");
  unsetenv("TRIDENT_TOPOLOGY");
  check_binding(world_rank() % kGpusPerNode);  // local rank on its virtual node
}

TEST_CASE("TRIDENT_DEVICE chooses the rank's GPU for groups and trainer alike", "[np8]") {
  REQUIRE(trident::testing::world_size() == 8);
  EnvGuard g("TRIDENT_DEVICE"), gt("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_TOPOLOGY");
  const int want = (world_rank() + 1) % kGpusPerNode;  // not the local rank
  setenv("TRIDENT_DEVICE", std::to_string(want).c_str(), 1);
  check_binding(want);
}

TEST_CASE("a rank that asks for a GPU it lacks fails every rank with its line", "[np8]") {
  REQUIRE(trident::testing::world_size() == 8);
  EnvGuard g("TRIDENT_DEVICE"), gt("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_DEVICE");
  unsetenv("TRIDENT_TOPOLOGY");
  // Rank 5 sees no GPU: runtime.backend = "cuda" (with MPI groups) is an
  // input error on every rank, with rank 5's line, before any group is made.
  static const kernels::DeviceRuntime no_gpu_on_5{
      [] { return world_rank() == 5 ? 0 : kGpusPerNode; }, kFakeRuntime.set_current,
      kFakeRuntime.current};
  Fakes fakes;
  kernels::set_device_runtime_for_testing(&no_gpu_on_5);
  Config cfg = mesh_config();
  cfg.runtime.comm = CommBackend::mpi;
  Communicator& world = trident::testing::world_comm();
  CHECK_THROWS_WITH(build_communicators(world, cfg, detect_topology(world, cfg)),
                    Catch::StartsWith("rank 5: runtime.backend: 'cuda' asked for, but this rank "
                                      "sees no CUDA device"));
  CHECK(seen.sets == 0);
  CHECK(seen.group_devices.empty());
}
