// Mesh: ranks mapped onto pp x dp x cp with EP groups, by DESIGN.md's rules.
//
// Pure functions of (cluster shape, parallel sizes): no MPI here, so that
// `trident plan` can map 1024 nodes x 8 devices without launching anything.
// Rank order, fastest to slowest: cp, dp, pp. Logical rank r (ordered by node,
// then local rank) has cp = r % cp, dp = (r / cp) % dp, pp = r / (cp * dp).
// EP groups are contiguous runs of ep ranks among the dp*cp ranks of a stage.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"

namespace trident {

// What map_mesh throws: an InputError whose `key` is the config key of the
// request that failed ("parallel.cp", "parallel.ep", "parallel.pp", or
// "topology.*" for a malformed cluster shape), so that a caller holding the
// Config can point at that key's line.
struct MeshError : InputError {
  MeshError(std::string config_key, const std::string& msg)
      : InputError(msg), key(std::move(config_key)) {}
  std::string key;
};

struct ClusterShape {
  int nodes = 1;
  int devices_per_node = 1;  // ranks per node
  int nvlink_domain = 1;     // ranks per NVLink domain (divides devices_per_node)
  int world() const { return nodes * devices_per_node; }
};

// cp_mode / cp_ulysses: how a CP group splits (parallel/cp/config_rules.hpp).
// ring and ulysses keep the whole CP group inside one NVLink domain; hybrid
// puts each Ulysses group (cp_ulysses consecutive cp ranks) inside a domain
// and lets the ring of cp/cp_ulysses groups cross domains and nodes.
struct MeshRequest {
  int pp = 1, cp = 1, ep = 1;
  CpMode cp_mode = CpMode::ring;
  int cp_ulysses = 0;  // hybrid: the Ulysses group size
};

struct RankCoord {
  int rank = 0;  // logical rank
  int node = 0, local_rank = 0;
  int pp = 0, dp = 0, cp = 0;
  int ep = 0;        // rank within its EP group
  int ep_group = 0;  // which EP group within the stage
};

struct Mesh {
  ClusterShape shape;
  int pp = 1, dp = 1, cp = 1, ep = 1;
  int world = 1;
  CpMode cp_mode = CpMode::ring;
  int cp_ulysses = 1;  // all-to-all group size: ring 1, ulysses cp, hybrid cp_ulysses
  int cp_ring() const { return cp / cp_ulysses; }

  RankCoord coord(int rank) const;
  int rank_of(int pp_i, int dp_i, int cp_i) const { return (pp_i * dp + dp_i) * cp + cp_i; }

  // Group members (logical ranks, in group-rank order) of the group holding `rank`.
  std::vector<int> cp_group(int rank) const;              // same pp, dp
  std::vector<int> cp_ulysses_group(int rank) const;      // cp_ulysses consecutive cp ranks
  std::vector<int> cp_ring_group(int rank) const;         // same Ulysses index of a cp group
  std::vector<int> pp_group(int rank) const;              // same dp, cp: the stages
  std::vector<int> dp_group(int rank) const;              // same pp, cp
  std::vector<int> dpcp_group(int rank) const;            // same pp: dense gradient reduction
  std::vector<int> ep_group(int rank) const;              // ep contiguous ranks of a stage
  std::vector<int> expert_replica_group(int rank) const;  // same pp and ep index

  // All groups of a kind, each once (for plan output and tests). Kinds: "cp",
  // "pp", "dp", "dpcp", "ep", "expert_replica", and with cp_ulysses > 1 and a
  // ring "cp_ulysses", "cp_ring".
  std::vector<std::vector<int>> all_groups(const std::string& kind) const;
  // Number of groups of a kind, without listing them.
  int group_count(const std::string& kind) const;

  int stage_size() const { return dp * cp; }  // ranks per pipeline stage
  int node_of(int rank) const { return rank / shape.devices_per_node; }
  int nvlink_domain_of(int rank) const { return rank / shape.nvlink_domain; }
};

// Why (shape, req) cannot be mapped, with the config key at fault; empty
// `rule` when it can. map_mesh() throws this as a MeshError plus a proposal.
struct MeshCheck {
  std::string key, rule;
  bool ok() const { return rule.empty(); }
};
MeshCheck check_mesh(const ClusterShape& shape, const MeshRequest& req, int n_experts = 0);

// The divisors of n (>= 1), ascending: the sizes a parallelism over n ranks can take.
std::vector<int> divisors(long long n);

// The fitting request nearest to req (fewest and smallest changes of pp, cp,
// ep), for error messages; pp=1 cp=1 ep=1 always fits a valid shape.
MeshRequest nearest_fitting_request(const ClusterShape& shape, const MeshRequest& req,
                                    int n_experts = 0);

// Map a request onto a cluster, or throw InputError naming the constraint
// that failed and proposing a mapping that fits (e.g. "cp=8 does not fit
// inside an NVLink domain of 4 ranks; cp<=4 fits, e.g. pp=2 cp=4").
// n_experts (0: dense) is checked for n_experts % ep.
Mesh map_mesh(const ClusterShape& shape, const MeshRequest& req, int n_experts = 0);

// Human-readable summary and group listing (plan/topo), and JSON.
std::string mesh_summary_text(const Mesh& mesh, bool list_groups);
std::string mesh_json(const Mesh& mesh, bool list_groups);

}  // namespace trident
