// Topology and communicator tests: the split communicators hold exactly the
// ranks DESIGN.md's mesh order says (checked from the members' own
// coordinates, not from the mesh's helpers), for every cluster shape and
// pp/cp/ep the world size allows; override parsing and its errors; detection
// against what the process can see for itself.
#include <mpi.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "env_guard.hpp"
#include "mpi_test_util.hpp"
#include "trident/core/error.hpp"
#include "trident/topo/devices.hpp"
#include "trident/topo/topology.hpp"

using namespace trident;
using trident::testing::EnvGuard;
using trident::testing::world_rank;
using trident::testing::world_size;

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

Config override_config(int nodes, int dpn, int nvl, int pp, int cp, int ep) {
  Config cfg;
  cfg.source = "test.toml";
  cfg.topology = TopologyOverride{nodes, dpn, nvl};
  cfg.parallel.pp = pp;
  cfg.parallel.cp = cp;
  cfg.parallel.ep = ep;
  cfg.model.n_experts = 8;
  cfg.runtime.timeout_s = 30;
  return cfg;
}

struct Member {
  int world, logical, node, pp, dp, cp, ep, ep_group;
};

// Every member's coordinates as the member itself reports them, in group order.
std::vector<Member> members(const Communicator& comm, const Communicators& c) {
  const RankCoord& k = c.me;
  Member m{c.world_rank, k.rank,    c.topo.ranks[c.world_rank].node, k.pp, k.dp, k.cp,
           k.ep,         k.ep_group};
  std::vector<Member> all(comm.size());
  MPI_Allgather(&m, sizeof m, MPI_BYTE, all.data(), sizeof m, MPI_BYTE, mpi_handles(comm).comm);
  return all;
}

// Counts violations of the mesh rules in all six communicators of this rank.
int check_communicators(const Communicators& c) {
  const Mesh& m = c.mesh;
  int bad = 0;
  auto expect = [&](bool ok) { bad += ok ? 0 : 1; };
  const RankCoord& me = c.me;
  // DESIGN.md: logical rank = (pp * dp + dp_i) * cp + cp_i; logical order is node-major.
  expect(me.rank == (me.pp * m.dp + me.dp) * m.cp + me.cp);
  expect(c.topo.ranks[c.world_rank].logical == me.rank);
  expect(m.pp * m.dp * m.cp == world_size());

  auto cp = members(*c.cp, c);
  expect(int(cp.size()) == m.cp);
  for (int i = 0; i < int(cp.size()); ++i)
    expect(cp[i].pp == me.pp && cp[i].dp == me.dp && cp[i].cp == i);

  auto pp = members(*c.pp, c);
  expect(int(pp.size()) == m.pp);
  for (int i = 0; i < int(pp.size()); ++i)
    expect(pp[i].dp == me.dp && pp[i].cp == me.cp && pp[i].pp == i);

  auto dp = members(*c.dp, c);
  expect(int(dp.size()) == m.dp);
  for (int i = 0; i < int(dp.size()); ++i)
    expect(dp[i].pp == me.pp && dp[i].cp == me.cp && dp[i].dp == i);

  auto dpcp = members(*c.dpcp, c);
  expect(int(dpcp.size()) == m.dp * m.cp);
  for (int i = 0; i < int(dpcp.size()); ++i)
    expect(dpcp[i].pp == me.pp && dpcp[i].dp * m.cp + dpcp[i].cp == i);

  // EP: ep contiguous ranks of one stage, inside one node.
  auto ep = members(*c.ep, c);
  expect(int(ep.size()) == m.ep);
  for (int i = 0; i < int(ep.size()); ++i) {
    expect(ep[i].pp == me.pp && ep[i].ep_group == me.ep_group && ep[i].ep == i);
    expect(ep[i].node == ep[0].node);
    expect(ep[i].logical == ep[0].logical + i);
  }

  // Replicas of one expert: same stage and ep index, one per EP group.
  auto rep = members(*c.expert_replica, c);
  expect(int(rep.size()) == m.dp * m.cp / m.ep);
  for (int i = 0; i < int(rep.size()); ++i)
    expect(rep[i].pp == me.pp && rep[i].ep == me.ep && rep[i].ep_group == i);

  // The mesh's own group listing agrees with the communicator, rank by rank.
  const auto g = m.cp_group(me.rank);
  for (int i = 0; i < c.cp->size(); ++i) expect(cp[i].logical == g[i]);
  return bad;
}

int any_rank(int v) {
  int out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

}  // namespace

TEST_CASE("communicators hold the mesh's ranks for every shape and pp/cp/ep", "[topo]") {
  EnvGuard g("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_TOPOLOGY");
  const int w = world_size();
  int tried = 0, total_bad = 0;
  for (int nodes : divisors(w)) {
    const int dpn = w / nodes;
    for (int nvl : divisors(dpn)) {
      if (nvl != dpn && nvl * 2 != dpn) continue;  // the whole node, or half of it
      for (int pp : divisors(w))
        for (int cp : divisors(w / pp))
          for (int ep : divisors(w / pp)) {
            Config cfg = override_config(nodes, dpn, nvl, pp, cp, ep);
            try {
              map_mesh(ClusterShape{nodes, dpn, nvl}, MeshRequest{pp, cp, ep}, 8);
            } catch (const InputError&) {
              continue;  // an impossible request: the mesh's own tests cover the rules
            }
            Topology t = detect_topology(trident::testing::world_comm(), cfg);
            REQUIRE(t.source == "override");
            auto c = build_communicators(trident::testing::world_comm(), cfg, t);
            const int bad = check_communicators(*c);
            INFO("nodes=" << nodes << " dpn=" << dpn << " nvl=" << nvl << " pp=" << pp
                          << " cp=" << cp << " ep=" << ep);
            CHECK(bad == 0);
            total_bad += bad;
            ++tried;
          }
    }
  }
  CHECK(tried >= 1);
  CHECK(any_rank(total_bad) == 0);
}

TEST_CASE("8 ranks as 2 nodes x 4: pp=2 cp=2, ep=2 and ep=4", "[topo][np8]") {
  REQUIRE(world_size() == 8);  // the shape needs exactly 8 ranks
  EnvGuard g("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_TOPOLOGY");
  for (int ep : {2, 4}) {
    Config cfg = override_config(2, 4, 4, 2, 2, ep);
    auto c = build_communicators(trident::testing::world_comm(), cfg,
                                 detect_topology(trident::testing::world_comm(), cfg));
    CHECK(check_communicators(*c) == 0);
    const int r = world_rank();
    // With the override, virtual node = rank / 4 and logical = world rank.
    CHECK(c->topo.ranks[r].node == r / 4);
    CHECK(c->mesh.dp == 2);
    // CP pairs are adjacent ranks in one node; the two stages are the two nodes.
    std::vector<int> cp_members, pp_members, ep_members;
    for (int i = 0; i < c->cp->size(); ++i) cp_members.push_back(c->cp->world_rank_of(i));
    for (int i = 0; i < c->pp->size(); ++i) pp_members.push_back(c->pp->world_rank_of(i));
    for (int i = 0; i < c->ep->size(); ++i) ep_members.push_back(c->ep->world_rank_of(i));
    CHECK(cp_members == std::vector<int>{r - r % 2, r - r % 2 + 1});
    CHECK(pp_members == std::vector<int>{r % 4, r % 4 + 4});
    std::vector<int> ep_expect;
    for (int i = 0; i < ep; ++i) ep_expect.push_back(r - r % ep + i);
    CHECK(ep_members == ep_expect);
    CHECK(c->pp_prev() == (r < 4 ? -1 : 0));
    CHECK(c->pp_next() == (r < 4 ? 1 : -1));
    // Traffic on a split communicator is accounted to its kind.
    const CommCounters before = c->pp->counters();
    float x[3] = {1.f, 2.f, float(r)};
    c->pp->allreduce_sum(x, 3);
    CHECK((c->pp->counters() - before).bytes_sent[int(CommKind::pp)] == 3 * sizeof(float));
    CHECK(x[2] == float(r % 4 + r % 4 + 4));
  }
}

TEST_CASE("TRIDENT_TOPOLOGY wins over [topology]; malformed or mismatched input is an InputError",
          "[topo]") {
  EnvGuard g("TRIDENT_TOPOLOGY");
  const int w = world_size();
  Config cfg = override_config(w, 1, 1, 1, 1, 1);
  const std::string ok = "nodes=1,devices_per_node=" + std::to_string(w);
  setenv("TRIDENT_TOPOLOGY", ok.c_str(), 1);
  Topology t = detect_topology(trident::testing::world_comm(), cfg);
  CHECK(t.source == "override");
  CHECK(t.shape.nodes == 1);
  CHECK(t.shape.devices_per_node == w);
  CHECK(t.shape.nvlink_domain == w);  // defaults to the node
  CHECK(t.ranks[world_rank()].local_rank == world_rank());

  for (const char* bad :
       {"nodes=2", "nodes=two,devices_per_node=4", "nodes=1;devices_per_node=8",
        "nodes=1,devices_per_node=8,gpus=8", "nodes=0,devices_per_node=8", "garbage"}) {
    setenv("TRIDENT_TOPOLOGY", bad, 1);
    std::string msg;
    try {
      detect_topology(trident::testing::world_comm(), cfg);
    } catch (const InputError& e) {
      msg = e.what();
    }
    INFO(bad << " -> " << msg);
    CHECK(msg.find("TRIDENT_TOPOLOGY") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  // Mismatch with the world size names both numbers.
  const std::string wrong = "nodes=3,devices_per_node=" + std::to_string(w);
  setenv("TRIDENT_TOPOLOGY", wrong.c_str(), 1);
  std::string msg;
  try {
    detect_topology(trident::testing::world_comm(), cfg);
  } catch (const InputError& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("TRIDENT_TOPOLOGY") != std::string::npos);
  CHECK(msg.find(std::to_string(3 * w) + " ranks") != std::string::npos);
  CHECK(msg.find("job has " + std::to_string(w) + " ranks") != std::string::npos);

  // nvlink_domain must divide the node; the config table is named by its file.
  unsetenv("TRIDENT_TOPOLOGY");
  if (w >= 2) {
    Config bad_cfg = override_config(1, w, w + 1, 1, 1, 1);
    std::string m2;
    try {
      detect_topology(trident::testing::world_comm(), bad_cfg);
    } catch (const InputError& e) {
      m2 = e.what();
    }
    CHECK(m2.find("test.toml: [topology]") != std::string::npos);
    CHECK(m2.find("nvlink_domain") != std::string::npos);
  }
}

TEST_CASE("an impossible mesh request is an InputError on every rank", "[topo]") {
  EnvGuard g("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_TOPOLOGY");
  const int w = world_size();
  Config cfg = override_config(1, w, w, 1, 2 * w, 1);  // cp larger than the world
  bool thrown = false;
  try {
    build_communicators(trident::testing::world_comm(), cfg,
                        detect_topology(trident::testing::world_comm(), cfg));
  } catch (const InputError&) {
    thrown = true;
  }
  CHECK(thrown);
}

TEST_CASE("detection: shared-memory nodes, host labels, devices", "[topo]") {
  EnvGuard g("TRIDENT_TOPOLOGY"), gd("TRIDENT_DEVICE");
  unsetenv("TRIDENT_TOPOLOGY");
  unsetenv("TRIDENT_DEVICE");
  Config cfg;
  cfg.runtime.timeout_s = 30;
  Topology t = detect_topology(trident::testing::world_comm(), cfg);
  CHECK(t.source == "detected");
  const int w = world_size(), r = world_rank();
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &local);
  int lr = 0, ls = 1;
  MPI_Comm_rank(local, &lr);
  MPI_Comm_size(local, &ls);
  MPI_Comm_free(&local);
  CHECK(t.shape.devices_per_node == ls);
  CHECK(t.shape.nodes * ls == w);
  CHECK(t.ranks[r].local_rank == lr);
  CHECK(t.shape.devices_per_node % t.shape.nvlink_domain == 0);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const char* slurm = std::getenv("SLURMD_NODENAME");
  CHECK(t.ranks[r].hostname == std::string(slurm && *slurm ? slurm : host));
  const int ndev = cuda_device_count();
  CHECK(t.cuda_devices == ndev);
  CHECK(t.ranks[r].device == (ndev > 0 ? lr % ndev : -1));
  if (ndev == 0) CHECK(t.shape.nvlink_domain == ls);  // no NVML facts: the node

  // Every rank sees the same table.
  std::vector<int> flat;
  for (const auto& ri : t.ranks) {
    flat.push_back(ri.node);
    flat.push_back(ri.local_rank);
    flat.push_back(ri.logical);
  }
  std::vector<int> root = flat;
  MPI_Bcast(root.data(), int(root.size()), MPI_INT, 0, MPI_COMM_WORLD);
  CHECK(root == flat);
  // Logical order is node-major: each node's ranks form one contiguous run.
  std::set<int> logicals;
  for (const auto& ri : t.ranks) {
    logicals.insert(ri.logical);
    CHECK(ri.logical / t.shape.devices_per_node == ri.node);
  }
  CHECK(int(logicals.size()) == w);

  // TRIDENT_DEVICE overrides the choice on every rank; a non-number is refused.
  setenv("TRIDENT_DEVICE", "0", 1);
  CHECK(detect_topology(trident::testing::world_comm(), cfg).ranks[r].device == 0);
  setenv("TRIDENT_DEVICE", "gpu1", 1);
  CHECK_THROWS_AS(detect_topology(trident::testing::world_comm(), cfg), InputError);
}
