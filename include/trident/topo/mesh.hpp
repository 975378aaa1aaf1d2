// Mesh: ranks mapped onto pp x dp x cp with EP groups, by DESIGN.md's rules.
//
// Pure functions of (cluster shape, parallel sizes): no MPI here, so that
// `trident plan` can map 1024 nodes x 8 devices without launching anything.
// Rank order, fastest to slowest: cp, dp, pp. Logical rank r (ordered by node,
// then local rank) has cp = r % cp, dp = (r / cp) % dp, pp = r / (cp * dp).
// EP groups are contiguous runs of ep ranks among the dp*cp ranks of a stage.
#pragma once
#include <string>
#include <vector>

namespace trident {

struct ClusterShape {
  int nodes = 1;
  int devices_per_node = 1;  // ranks per node
  int nvlink_domain = 1;     // ranks per NVLink domain (divides devices_per_node)
  int world() const { return nodes * devices_per_node; }
};

struct MeshRequest {
  int pp = 1, cp = 1, ep = 1;
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

  RankCoord coord(int rank) const;
  int rank_of(int pp_i, int dp_i, int cp_i) const { return (pp_i * dp + dp_i) * cp + cp_i; }

  // Group members (logical ranks, in group-rank order) of the group holding `rank`.
  std::vector<int> cp_group(int rank) const;    // same pp, dp
  std::vector<int> pp_group(int rank) const;    // same dp, cp: the stages
  std::vector<int> dp_group(int rank) const;    // same pp, cp
  std::vector<int> dpcp_group(int rank) const;  // same pp: dense gradient reduction
  std::vector<int> ep_group(int rank) const;    // ep contiguous ranks of a stage
  std::vector<int> expert_replica_group(int rank) const;  // same pp and ep index

  // All groups of a kind, each once (for plan output and tests).
  std::vector<std::vector<int>> all_groups(const std::string& kind) const;
};

// Map a request onto a cluster, or throw InputError naming the constraint
// that failed and proposing a mapping that fits (e.g. "cp=8 does not fit
// inside an NVLink domain of 4 ranks; cp<=4 fits, e.g. pp=2 cp=4").
// n_experts (0: dense) is checked for n_experts % ep.
Mesh map_mesh(const ClusterShape& shape, const MeshRequest& req, int n_experts = 0);

// Human-readable summary and group listing (plan/topo), and JSON.
std::string mesh_summary_text(const Mesh& mesh, bool list_groups);
std::string mesh_json(const Mesh& mesh, bool list_groups);

}  // namespace trident
