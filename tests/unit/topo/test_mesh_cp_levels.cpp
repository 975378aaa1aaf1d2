// The two CP levels of cp_mode = "hybrid" in the mesh: Ulysses groups must
// lie inside an NVLink domain (checked rank by rank here, not by calling
// check_mesh's arithmetic), the ring may cross domains and nodes, ring and
// ulysses keep the whole cp group inside one domain, and the summaries show
// both levels.
#include <catch2/catch.hpp>
#include <set>

#include "trident/core/error.hpp"
#include "trident/topo/mesh.hpp"

using namespace trident;

namespace {

MeshRequest hybrid(int pp, int cp, int u) { return {pp, cp, 1, CpMode::hybrid, u}; }

}  // namespace

TEST_CASE("hybrid: a Ulysses group crossing an NVLink domain is refused with the reason",
          "[topo]") {
  const ClusterShape shape{1, 8, 2};  // domains of 2 ranks
  try {
    map_mesh(shape, hybrid(1, 8, 4));
    FAIL("a Ulysses group of 4 on domains of 2 was accepted");
  } catch (const MeshError& e) {
    CHECK(e.key == "parallel.cp_ulysses");
    const std::string msg = e.what();
    CHECK(msg.find("parallel.cp_ulysses=4") == 0);
    CHECK(msg.find("inside one NVLink domain of 2 ranks") != std::string::npos);
  }
  // The same cp without hybrid: the whole group must fit a domain.
  CHECK_THROWS_AS(map_mesh(shape, MeshRequest{1, 8, 1}), MeshError);
  CHECK_THROWS_AS(map_mesh(shape, MeshRequest{1, 8, 1, CpMode::ulysses, 0}), MeshError);
  // hybrid needs 1 < u < cp dividing cp
  for (int u : {0, 1, 3, 8}) CHECK(!check_mesh(shape, hybrid(1, 8, u)).ok());
}

TEST_CASE("hybrid: the ring crosses domains and nodes, the Ulysses groups do not", "[topo]") {
  // 2 nodes x 4 devices, domains of 2: cp8 = Ulysses 2 x ring 4 over both nodes.
  for (const auto& [shape, req] : {std::pair{ClusterShape{2, 4, 2}, hybrid(1, 8, 2)},
                                   std::pair{ClusterShape{2, 4, 4}, hybrid(1, 8, 4)},
                                   std::pair{ClusterShape{2, 4, 2}, hybrid(2, 4, 2)},
                                   std::pair{ClusterShape{4, 4, 4}, hybrid(2, 8, 4)}}) {
    INFO("nodes " << shape.nodes << " u " << req.cp_ulysses << " cp " << req.cp);
    const Mesh m = map_mesh(shape, req);
    CHECK(m.cp_mode == CpMode::hybrid);
    CHECK(m.cp_ulysses == req.cp_ulysses);
    CHECK(m.cp_ring() == req.cp / req.cp_ulysses);
    std::set<int> nodes_crossed;
    for (int r = 0; r < m.world; ++r) {
      const auto cp = m.cp_group(r), ug = m.cp_ulysses_group(r), rg = m.cp_ring_group(r);
      REQUIRE(int(ug.size()) == m.cp_ulysses);
      REQUIRE(int(rg.size()) == m.cp_ring());
      // Ulysses group: consecutive cp ranks, one domain
      for (int x : ug) CHECK(m.nvlink_domain_of(x) == m.nvlink_domain_of(r));
      // ring: one member per Ulysses group of the cp group, in cp order, with
      // this rank's Ulysses index
      const std::set<int> cps(cp.begin(), cp.end());
      for (size_t j = 0; j < rg.size(); ++j) {
        CHECK(cps.count(rg[j]) == 1);
        CHECK((rg[j] - cp.front()) % m.cp_ulysses == (r - cp.front()) % m.cp_ulysses);
        if (j) CHECK(rg[j] > rg[j - 1]);
      }
      if (m.node_of(rg.front()) != m.node_of(rg.back())) nodes_crossed.insert(r);
    }
    if (shape.nodes > 1 && req.pp == 1) CHECK(!nodes_crossed.empty());  // across nodes
    CHECK(int(m.all_groups("cp_ulysses").size()) == m.world / m.cp_ulysses);
    CHECK(int(m.all_groups("cp_ring").size()) == m.world / m.cp_ring());
  }
}

TEST_CASE("plan/topo summaries show both CP levels", "[topo]") {
  const Mesh m = map_mesh(ClusterShape{2, 4, 2}, hybrid(1, 8, 2));
  const std::string text = mesh_summary_text(m, false);
  CHECK(text.find("cp_mode=hybrid = Ulysses 2 (all-to-all of heads) x ring 4") !=
        std::string::npos);
  CHECK(text.find("CP level 1: Ulysses all-to-all groups") != std::string::npos);
  CHECK(text.find("[0 1]@node0 [2 3]@node0 [4 5]@node1 [6 7]@node1") != std::string::npos);
  CHECK(text.find("[0 2 4 6]@node0-1 [1 3 5 7]@node0-1") != std::string::npos);
  const std::string json = mesh_json(m, false);
  CHECK(json.find("\"cp_mode\": \"hybrid\", \"cp_ulysses\": 2, \"cp_ring\": 4") !=
        std::string::npos);
  CHECK(json.find("\"cp_ring\": {\"count\": 2") != std::string::npos);
  // A plain ring's summary has no level lines.
  const std::string ring = mesh_summary_text(map_mesh(ClusterShape{1, 4, 4}, {1, 4, 1}), false);
  CHECK(ring.find("CP level") == std::string::npos);
  CHECK(ring.find("cp_mode") == std::string::npos);
}
