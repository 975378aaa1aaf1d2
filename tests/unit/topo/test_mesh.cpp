// Mesh: every (nodes, devices, nvlink, pp, cp, ep) of a grid is either mapped
// with groups that obey DESIGN.md's placement rules, or refused with a message
// naming the constraint and a proposal that itself maps. The rules are
// re-derived here by brute force over ranks, not by calling check_mesh().
#include <catch2/catch.hpp>
#include <regex>
#include <set>

#include "trident/core/error.hpp"
#include "trident/topo/mesh.hpp"

using namespace trident;

namespace {

// A check cheap enough for millions of passing uses (a mesh of 8192 ranks);
// a failure still reports its condition and stops the test case.
#define EXPECT(cond)                     \
  do {                                   \
    if (!(cond)) FAIL("failed: " #cond); \
  } while (0)

std::vector<int> divisors_of(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// DESIGN.md's rules, checked rank by rank from the rank order alone (cp
// fastest, then dp, then pp; node-major logical ranks).
bool placement_is_legal(const ClusterShape& s, const MeshRequest& r, int n_experts) {
  const int world = s.world();
  if (world % (r.pp * r.cp) != 0) return false;
  const int stage = world / r.pp;
  if (stage % r.ep != 0) return false;
  if (n_experts > 0 && n_experts % r.ep != 0) return false;
  auto node = [&](int rank) { return rank / s.devices_per_node; };
  auto domain = [&](int rank) { return rank / s.nvlink_domain; };
  // CP: cp consecutive ranks share an NVLink domain.
  for (int first = 0; first < world; first += r.cp)
    for (int k = 0; k < r.cp; ++k)
      if (domain(first + k) != domain(first)) return false;
  // EP: ep consecutive ranks of a stage share a node.
  for (int first = 0; first < world; first += r.ep)
    for (int k = 0; k < r.ep; ++k)
      if (node(first + k) != node(first)) return false;
  // PP across nodes: with pp >= nodes no stage straddles a node; with pp < nodes
  // each stage is made of whole nodes.
  if (s.nodes > 1) {
    for (int p = 0; p < r.pp; ++p) {
      const int a = p * stage, b = a + stage - 1;
      if (r.pp >= s.nodes && node(a) != node(b)) return false;
      if (r.pp < s.nodes && (a % s.devices_per_node != 0 || (b + 1) % s.devices_per_node != 0))
        return false;
    }
  }
  return true;
}

// Checks every group function of a mapped mesh against the coordinates.
void check_groups(const Mesh& m, int n_experts) {
  const int world = m.world;
  EXPECT(m.pp * m.dp * m.cp == world);
  const int stage = m.dp * m.cp;
  for (int r = 0; r < world; ++r) {
    const RankCoord c = m.coord(r);
    EXPECT(c.rank == r);
    EXPECT(m.rank_of(c.pp, c.dp, c.cp) == r);
    EXPECT(c.cp == r % m.cp);
    EXPECT(c.dp == (r / m.cp) % m.dp);
    EXPECT(c.pp == r / stage);
    EXPECT(c.node == r / m.shape.devices_per_node);
    EXPECT(c.local_rank == r % m.shape.devices_per_node);
    EXPECT(c.ep == (r % stage) % m.ep);
    EXPECT(c.ep_group == (r % stage) / m.ep);

    const auto cp = m.cp_group(r);
    EXPECT(static_cast<int>(cp.size()) == m.cp);
    for (int i = 0; i < m.cp; ++i) {
      const RankCoord o = m.coord(cp[i]);
      EXPECT((o.pp == c.pp && o.dp == c.dp && o.cp == i));
      EXPECT(cp[i] / m.shape.nvlink_domain == r / m.shape.nvlink_domain);
    }
    const auto pp = m.pp_group(r);
    EXPECT(static_cast<int>(pp.size()) == m.pp);
    for (int i = 0; i < m.pp; ++i) {
      const RankCoord o = m.coord(pp[i]);
      EXPECT((o.pp == i && o.dp == c.dp && o.cp == c.cp));
    }
    const auto dp = m.dp_group(r);
    EXPECT(static_cast<int>(dp.size()) == m.dp);
    for (int i = 0; i < m.dp; ++i) {
      const RankCoord o = m.coord(dp[i]);
      EXPECT((o.pp == c.pp && o.dp == i && o.cp == c.cp));
    }
    const auto dpcp = m.dpcp_group(r);
    EXPECT(static_cast<int>(dpcp.size()) == stage);
    for (int i = 0; i < stage; ++i) EXPECT(m.coord(dpcp[i]).pp == c.pp);
    const auto ep = m.ep_group(r);
    EXPECT(static_cast<int>(ep.size()) == m.ep);
    for (int i = 0; i < m.ep; ++i) {
      const RankCoord o = m.coord(ep[i]);
      EXPECT((o.pp == c.pp && o.ep_group == c.ep_group && o.ep == i));
      EXPECT(o.node == c.node);
    }
    const auto rep = m.expert_replica_group(r);
    EXPECT(static_cast<int>(rep.size()) == stage / m.ep);
    for (int i = 0; i < stage / m.ep; ++i) {
      const RankCoord o = m.coord(rep[i]);
      EXPECT((o.pp == c.pp && o.ep == c.ep && o.ep_group == i));
    }
    if (n_experts > 0) EXPECT(n_experts % m.ep == 0);
  }
  // all_groups: each kind partitions the world, and holds each rank's group.
  for (const char* kind : {"cp", "pp", "dp", "dpcp", "ep", "expert_replica"}) {
    INFO(kind);
    const auto groups = m.all_groups(kind);
    EXPECT(static_cast<int>(groups.size()) == m.group_count(kind));
    std::vector<int> seen(world, 0);
    for (const auto& g : groups) {
      for (int r : g) seen[r]++;
      const std::string k = kind;
      const auto own = k == "cp"     ? m.cp_group(g[0])
                       : k == "pp"   ? m.pp_group(g[0])
                       : k == "dp"   ? m.dp_group(g[0])
                       : k == "dpcp" ? m.dpcp_group(g[0])
                       : k == "ep"   ? m.ep_group(g[0])
                                     : m.expert_replica_group(g[0]);
      EXPECT(own == g);
    }
    for (int r = 0; r < world; ++r) EXPECT(seen[r] == 1);
  }
}

// The proposal in a map_mesh message: "... a mapping that fits is pp=P cp=C ep=E".
MeshRequest proposal_in(const std::string& msg) {
  std::smatch mt;
  const std::regex re("a mapping that fits is pp=([0-9]+) cp=([0-9]+) ep=([0-9]+)");
  REQUIRE(std::regex_search(msg, mt, re));
  return {std::stoi(mt[1]), std::stoi(mt[2]), std::stoi(mt[3])};
}

}  // namespace

TEST_CASE("every mesh of a grid maps exactly when DESIGN.md's rules allow it") {
  int mapped = 0, refused = 0;
  for (int nodes : {1, 2, 3, 4}) {
    for (int dpn : {1, 2, 4, 6, 8}) {
      for (int nvl : divisors_of(dpn)) {
        const ClusterShape shape{nodes, dpn, nvl};
        const int world = shape.world();
        for (int pp : divisors_of(world)) {
          for (int cp : divisors_of(world / pp)) {
            for (int ep : {1, 2, 3, 4, 8}) {
              for (int n_experts : {0, 8, 9}) {  // 9: remainders of 1
                const MeshRequest req{pp, cp, ep};
                INFO("nodes=" << nodes << " dpn=" << dpn << " nvl=" << nvl << " pp=" << pp
                              << " cp=" << cp << " ep=" << ep << " n_experts=" << n_experts);
                const bool legal = placement_is_legal(shape, req, n_experts);
                std::string msg;
                std::string key;
                Mesh m;
                try {
                  m = map_mesh(shape, req, n_experts);
                } catch (const MeshError& e) {
                  msg = e.what();
                  key = e.key;
                }
                REQUIRE(legal == msg.empty());
                REQUIRE(check_mesh(shape, req, n_experts).ok() == legal);
                if (legal) {
                  ++mapped;
                  REQUIRE((m.pp == pp && m.cp == cp && m.ep == ep && m.dp == world / (pp * cp)));
                  check_groups(m, n_experts);
                } else {
                  ++refused;
                  // One line: the key at fault with its value, the rule, a proposal.
                  REQUIRE(msg.find('\n') == std::string::npos);
                  REQUIRE((key == "parallel.pp" || key == "parallel.cp" || key == "parallel.ep"));
                  const int val = key == "parallel.pp" ? pp : key == "parallel.cp" ? cp : ep;
                  REQUIRE(msg.rfind(key + "=" + std::to_string(val) + ": ", 0) == 0);
                  const MeshRequest f = proposal_in(msg);
                  REQUIRE(placement_is_legal(shape, f, n_experts));
                  REQUIRE_NOTHROW(map_mesh(shape, f, n_experts));
                }
              }
            }
          }
        }
      }
    }
  }
  // The grid reaches both outcomes many times.
  CHECK(mapped > 500);
  CHECK(refused > 500);
}

TEST_CASE("each impossible request names its constraint") {
  auto err = [](ClusterShape s, MeshRequest r, int n_experts = 0) {
    try {
      map_mesh(s, r, n_experts);
    } catch (const MeshError& e) {
      return e.key + " | " + e.what();
    }
    return std::string("mapped");
  };
  // CP larger than an NVLink domain: the nearest fitting cp is proposed.
  CHECK(err({2, 4, 4}, {2, 8, 1}) ==
        "parallel.pp | parallel.pp=2: pp*cp = 16 must divide the world size 8; on 2 nodes x 4 "
        "devices (NVLink domain 4) a mapping that fits is pp=2 cp=4 ep=1 (dp=1)");
  CHECK(err({4, 4, 4}, {2, 8, 2}) ==
        "parallel.cp | parallel.cp=8: a CP group must lie inside one NVLink domain of 4 ranks (cp "
        "must divide 4); on 4 nodes x 4 devices (NVLink domain 4) a mapping that fits is pp=2 "
        "cp=4 ep=2 (dp=2)");
  CHECK(err({1, 8, 2}, {1, 4, 1}).find("cp must divide 2") != std::string::npos);
  CHECK(err({1, 12, 4}, {1, 3, 1}).find("cp must divide 4") != std::string::npos);
  // A stage that would straddle nodes (pp >= nodes), or not be whole nodes.
  CHECK(
      err({3, 4, 4}, {4, 1, 1})
          .rfind("parallel.pp | parallel.pp=4: a pipeline stage (3 ranks) must not straddle nodes",
                 0) == 0);
  CHECK(err({4, 2, 2}, {3, 1, 1}).find("parallel.pp=3: pp*cp = 3 must divide the world size 8") !=
        std::string::npos);
  CHECK(
      err({3, 2, 2}, {2, 1, 1})
          .rfind(
              "parallel.pp | parallel.pp=2: with pp < nodes (3) each pipeline stage must be whole "
              "nodes",
              0) == 0);
  // EP over two nodes; EP not dividing the experts or the stage.
  CHECK(err({2, 4, 4}, {1, 1, 8}, 8)
            .rfind("parallel.ep | parallel.ep=8: an EP group must lie inside one node of 4 devices",
                   0) == 0);
  CHECK(err({1, 8, 8}, {1, 1, 4}, 6).find("parallel.ep=4: must divide model.n_experts=6") !=
        std::string::npos);
  CHECK(err({1, 8, 8}, {2, 1, 8}, 8).find("parallel.ep=8: must divide dp*cp = 4") !=
        std::string::npos);
  // A malformed shape names the topology key and proposes nothing.
  CHECK(err({2, 4, 3}, {1, 1, 1}) ==
        "topology.nvlink_domain | topology.nvlink_domain: the NVLink domain (3 ranks) must divide "
        "the devices per node (4)");
  CHECK(err({0, 4, 4}, {1, 1, 1}).rfind("topology.nodes | ", 0) == 0);
  // A mesh error is an InputError (exit code 2).
  CHECK_THROWS_AS(map_mesh({2, 4, 4}, {1, 8, 1}), InputError);
}

TEST_CASE("the quickstart mesh: CP pairs inside a node, stages on different nodes") {
  const Mesh m = map_mesh({2, 4, 4}, {2, 2, 2}, 4);
  CHECK(m.dp == 2);
  CHECK(m.all_groups("cp") == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(m.all_groups("pp") == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(m.all_groups("dp") == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(m.all_groups("dpcp") == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(m.all_groups("ep") == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(m.all_groups("expert_replica") ==
        std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  for (int r = 0; r < 4; ++r) CHECK(m.coord(r).node == 0);
  for (int r = 4; r < 8; ++r) CHECK(m.coord(r).node == 1);

  const std::string text = mesh_summary_text(m, false);
  CHECK(text.find("stage 0: ranks 0-3 on node 0\n") != std::string::npos);
  CHECK(text.find("stage 1: ranks 4-7 on node 1\n") != std::string::npos);
  CHECK(text.find("[0 1]@node0 [2 3]@node0 [4 5]@node1 [6 7]@node1") != std::string::npos);
  const std::string json = mesh_json(m, false);
  CHECK(json.find("\"cp\": {\"count\": 4, \"complete\": true, \"list\": [[0, 1], [2, 3], [4, 5], "
                  "[6, 7]]}") != std::string::npos);
  CHECK(json.find("{\"stage\": 1, \"first_rank\": 4, \"last_rank\": 7, \"first_node\": 1, "
                  "\"last_node\": 1}") != std::string::npos);
  CHECK_THROWS_AS(m.all_groups("tp"), InputError);
}

TEST_CASE("1024 nodes x 8 devices: correct groups; the summary lists only the first") {
  const ClusterShape shape{1024, 8, 8};
  const Mesh m = map_mesh(shape, {8, 8, 8}, 64);
  CHECK(m.dp == 128);
  check_groups(m, 64);
  // Eight stages over 1024 nodes: 128 whole nodes each.
  for (int p = 0; p < 8; ++p) {
    const int a = p * m.stage_size(), b = a + m.stage_size() - 1;
    CHECK(m.node_of(a) == 128 * p);
    CHECK(m.node_of(b) == 128 * p + 127);
  }
  const std::string brief = mesh_summary_text(m, false);
  CHECK(brief.find("... 1020 more (--groups lists all)") != std::string::npos);
  CHECK(brief.size() < 4000);
  const std::string full = mesh_summary_text(m, true);
  CHECK(full.find("[8184 8185 8186 8187 8188 8189 8190 8191]@node1023") != std::string::npos);
  CHECK(full.find("more (--groups lists all)") == std::string::npos);
  CHECK(mesh_json(m, false).find("\"complete\": false") != std::string::npos);
  CHECK(mesh_json(m, true).find("\"complete\": false") == std::string::npos);

  // The same cluster refuses pp=3 and proposes a pp that places.
  try {
    map_mesh(shape, {3, 8, 8}, 64);
    FAIL("pp=3 on 8192 ranks must be refused");
  } catch (const MeshError& e) {
    CHECK(e.key == "parallel.pp");
    const MeshRequest f = proposal_in(e.what());
    CHECK((f.cp == 8 && f.ep == 8));
    CHECK(placement_is_legal(shape, f, 64));
  }
}

TEST_CASE("nearest_fitting_request keeps what already fits") {
  // Only cp is wrong: pp and ep stay.
  const MeshRequest f = nearest_fitting_request({4, 8, 4}, {4, 8, 2}, 8);
  CHECK(f.pp == 4);
  CHECK(f.ep == 2);
  CHECK(f.cp == 4);
  // A fitting request is its own nearest.
  const MeshRequest same = nearest_fitting_request({2, 4, 4}, {2, 2, 2}, 4);
  CHECK((same.pp == 2 && same.cp == 2 && same.ep == 2));
}
