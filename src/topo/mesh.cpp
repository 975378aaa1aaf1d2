// Mesh mapping: which logical rank is which (pp, dp, cp, ep) coordinate, the
// placement rules of DESIGN.md ("Mesh"), the groups of each kind, and the
// plan/topo summaries. No MPI: `trident plan` maps huge clusters with it.
#include "trident/topo/mesh.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace trident {
namespace {

std::string str(long long v) { return std::to_string(v); }

std::vector<int> iota_from(int start, int count, int stride = 1) {
  std::vector<int> v(count);
  for (int i = 0; i < count; ++i) v[i] = start + i * stride;
  return v;
}

const std::vector<std::string> kKinds = {"cp", "dp", "pp", "dpcp", "ep", "expert_replica"};

// Beyond this many ranks the summary lists only the first groups of each kind
// (a 1024 x 8 cluster has 8192 of some kinds) unless asked for all.
constexpr int kListAllUpTo = 64;
constexpr int kFirstGroups = 4;

std::string join(const std::vector<int>& v, const char* sep = " ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

// A group as text: all members when short, else its arithmetic progression
// ("0-2047", "0,8,...,2040"); every group of a mesh is one.
std::string group_text(const std::vector<int>& g) {
  const size_t n = g.size();
  if (n <= 8) return join(g);
  const int stride = g[1] - g[0];
  bool arithmetic = true;
  for (size_t i = 1; i < n && arithmetic; ++i) arithmetic = g[i] - g[i - 1] == stride;
  if (!arithmetic) return join(g);
  if (stride == 1) return std::to_string(g.front()) + "-" + std::to_string(g.back());
  return std::to_string(g[0]) + "," + std::to_string(g[1]) + ",...," + std::to_string(g.back());
}

// "a-b" or "a" for a contiguous range.
std::string span(int a, int b) { return a == b ? str(a) : str(a) + "-" + str(b); }

}  // namespace

std::vector<int> divisors(long long n) {
  std::vector<int> out;
  for (long long d = 1; d * d <= n; ++d) {
    if (n % d) continue;
    out.push_back(int(d));
    if (d != n / d) out.push_back(int(n / d));
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

MeshCheck check_shape(const ClusterShape& shape) {
  const int dpn = shape.devices_per_node, nvl = shape.nvlink_domain;
  if (shape.nodes < 1)
    return {"topology.nodes", "needs at least 1 node (got " + str(shape.nodes) + ")"};
  if (dpn < 1)
    return {"topology.devices_per_node", "needs at least 1 device per node (got " + str(dpn) + ")"};
  if (nvl < 1 || dpn % nvl != 0)
    return {"topology.nvlink_domain", "the NVLink domain (" + str(nvl) +
                                          " ranks) must divide the devices per node (" + str(dpn) +
                                          ")"};
  return {};
}

MeshCheck check_sizes(long long world, const MeshRequest& req) {
  if (req.pp < 1) return {"parallel.pp", "must be >= 1"};
  if (req.cp < 1) return {"parallel.cp", "must be >= 1"};
  if (req.ep < 1) return {"parallel.ep", "must be >= 1"};
  if (world % req.cp != 0) return {"parallel.cp", "must divide the world size " + str(world)};
  if ((world / req.cp) % req.pp != 0)
    return {"parallel.pp", "pp*cp = " + str(static_cast<long long>(req.pp) * req.cp) +
                               " must divide the world size " + str(world)};
  return {};
}

// CP groups are aligned runs of cp ranks and NVLink domains aligned runs of
// nvl ranks, so every CP group lies inside one domain exactly when cp | nvl.
// Hybrid asks for that of its Ulysses groups only (aligned runs of u).
MeshCheck check_cp_domain(int nvl, const MeshRequest& req) {
  if (req.cp_mode != CpMode::hybrid) {
    if (nvl % req.cp == 0) return {};
    return {"parallel.cp", "a CP group must lie inside one NVLink domain of " + str(nvl) +
                               " ranks (cp must divide " + str(nvl) + ")"};
  }
  const int u = req.cp_ulysses;
  if (u < 2 || u >= req.cp || req.cp % u != 0)
    return {"parallel.cp_ulysses", "hybrid needs 1 < cp_ulysses < cp=" + str(req.cp) +
                                       " dividing cp (got " + str(u) + ")"};
  if (nvl % u != 0)
    return {"parallel.cp_ulysses",
            "a Ulysses (all-to-all) group must lie inside one NVLink domain of " + str(nvl) +
                " ranks (cp_ulysses must divide " + str(nvl) +
                "); only the ring of cp/cp_ulysses groups may cross domains"};
  return {};
}

// A pipeline stage (dp*cp ranks) is inside one node or whole nodes.
MeshCheck check_stage_nodes(const ClusterShape& shape, const MeshRequest& req, long long stage) {
  const int dpn = shape.devices_per_node;
  if (shape.nodes <= 1) return {};
  if (req.pp >= shape.nodes && dpn % stage != 0)
    return {"parallel.pp",
            "a pipeline stage (" + str(stage) + " ranks) must not straddle nodes of " + str(dpn) +
                " devices (with pp >= nodes, world/pp must divide " + str(dpn) + ")"};
  if (req.pp < shape.nodes && stage % dpn != 0)
    return {"parallel.pp", "with pp < nodes (" + str(shape.nodes) +
                               ") each pipeline stage must be whole nodes (pp must divide " +
                               str(shape.nodes) + ")"};
  return {};
}

// A stage is inside a node (stage | dpn) or whole nodes (dpn | stage); EP
// groups are aligned runs of ep inside it, so they stay in a node exactly
// when ep | dpn in the second case.
MeshCheck check_ep(int dpn, const MeshRequest& req, long long stage, int n_experts) {
  if (n_experts > 0 && n_experts % req.ep != 0)
    return {"parallel.ep", "must divide model.n_experts=" + str(n_experts)};
  if (stage % req.ep != 0)
    return {"parallel.ep",
            "must divide dp*cp = " + str(stage) + " (the ranks of one pipeline stage)"};
  if (stage % dpn == 0 && dpn % req.ep != 0)
    return {"parallel.ep", "an EP group must lie inside one node of " + str(dpn) +
                               " devices (ep must divide " + str(dpn) + ")"};
  return {};
}

}  // namespace

MeshCheck check_mesh(const ClusterShape& shape, const MeshRequest& req, int n_experts) {
  if (MeshCheck c = check_shape(shape); !c.ok()) return c;
  const long long world = static_cast<long long>(shape.nodes) * shape.devices_per_node;
  if (MeshCheck c = check_sizes(world, req); !c.ok()) return c;
  if (MeshCheck c = check_cp_domain(shape.nvlink_domain, req); !c.ok()) return c;
  const long long stage = world / req.pp;  // ranks per stage = dp*cp
  if (MeshCheck c = check_stage_nodes(shape, req, stage); !c.ok()) return c;
  return check_ep(shape.devices_per_node, req, stage, n_experts);
}

MeshRequest nearest_fitting_request(const ClusterShape& shape, const MeshRequest& req,
                                    int n_experts) {
  MeshRequest best{1, 1, 1};
  double best_cost = 1e300;
  const int world = shape.world();
  auto dist = [](int a, int b) { return std::abs(std::log2(static_cast<double>(a) / b)); };
  for (int pp : divisors(world)) {
    for (int cp : divisors(world / pp)) {
      for (int ep : divisors(world / pp)) {
        MeshRequest r{pp, cp, ep, req.cp_mode, req.cp_ulysses};
        if (!check_mesh(shape, r, n_experts).ok()) continue;
        // Few changed sizes first, then small changes, then the larger mesh.
        const int changed = (pp != req.pp) + (cp != req.cp) + (ep != req.ep);
        const double cost = changed * 100.0 + dist(pp, req.pp) + dist(cp, req.cp) +
                            dist(ep, req.ep) - 1e-3 * std::log2(double(pp) * cp * ep);
        if (cost < best_cost) {
          best_cost = cost;
          best = r;
        }
      }
    }
  }
  return best;
}

Mesh map_mesh(const ClusterShape& shape, const MeshRequest& req, int n_experts) {
  const MeshCheck c = check_mesh(shape, req, n_experts);
  if (!c.ok()) {
    std::string msg;
    const std::string shape_text =
        str(shape.nodes) + (shape.nodes == 1 ? " node x " : " nodes x ") +
        str(shape.devices_per_node) + " devices (NVLink domain " + str(shape.nvlink_domain) + ")";
    if (c.key.rfind("topology.", 0) == 0) {
      msg = c.key + ": " + c.rule;
    } else {
      const int val = c.key == "parallel.pp"           ? req.pp
                      : c.key == "parallel.cp"         ? req.cp
                      : c.key == "parallel.cp_ulysses" ? req.cp_ulysses
                                                       : req.ep;
      const MeshRequest f = nearest_fitting_request(shape, req, n_experts);
      msg = c.key + "=" + str(val) + ": " + c.rule + "; on " + shape_text +
            " a mapping that fits is pp=" + str(f.pp) + " cp=" + str(f.cp) + " ep=" + str(f.ep) +
            " (dp=" + str(shape.world() / (f.pp * f.cp)) + ")";
    }
    throw MeshError(c.key, msg);
  }
  Mesh m;
  m.shape = shape;
  m.world = shape.world();
  m.pp = req.pp;
  m.cp = req.cp;
  m.ep = req.ep;
  m.dp = m.world / (req.pp * req.cp);
  m.cp_mode = req.cp_mode;
  m.cp_ulysses = req.cp_mode == CpMode::hybrid    ? req.cp_ulysses
                 : req.cp_mode == CpMode::ulysses ? req.cp
                                                  : 1;
  return m;
}

RankCoord Mesh::coord(int rank) const {
  RankCoord c;
  c.rank = rank;
  c.node = rank / shape.devices_per_node;
  c.local_rank = rank % shape.devices_per_node;
  c.cp = rank % cp;
  c.dp = (rank / cp) % dp;
  c.pp = rank / (cp * dp);
  const int in_stage = rank % (cp * dp);
  c.ep = in_stage % ep;
  c.ep_group = in_stage / ep;
  return c;
}

std::vector<int> Mesh::cp_group(int rank) const { return iota_from(rank - rank % cp, cp); }

std::vector<int> Mesh::cp_ulysses_group(int rank) const {
  return iota_from(rank - rank % cp_ulysses, cp_ulysses);
}

std::vector<int> Mesh::cp_ring_group(int rank) const {
  const int start = rank - rank % cp;
  return iota_from(start + (rank - start) % cp_ulysses, cp_ring(), cp_ulysses);
}

std::vector<int> Mesh::pp_group(int rank) const { return iota_from(rank % (cp * dp), pp, cp * dp); }

std::vector<int> Mesh::dp_group(int rank) const {
  const RankCoord c = coord(rank);
  return iota_from(rank_of(c.pp, 0, c.cp), dp, cp);
}

std::vector<int> Mesh::dpcp_group(int rank) const {
  const int s = stage_size();
  return iota_from(rank - rank % s, s);
}

std::vector<int> Mesh::ep_group(int rank) const { return iota_from(rank - rank % ep, ep); }

std::vector<int> Mesh::expert_replica_group(int rank) const {
  const int s = stage_size();
  const int stage_start = rank - rank % s;
  return iota_from(stage_start + (rank - stage_start) % ep, s / ep, ep);
}

int Mesh::group_count(const std::string& kind) const {
  if (kind == "cp") return world / cp;
  if (kind == "pp") return world / pp;
  if (kind == "dp") return world / dp;
  if (kind == "dpcp") return pp;
  if (kind == "ep") return world / ep;
  if (kind == "expert_replica") return pp * ep;
  if (kind == "cp_ulysses") return world / cp_ulysses;
  if (kind == "cp_ring") return world / cp_ring();
  throw InputError("group kind '" + kind +
                   "': must be one of cp, dp, pp, dpcp, ep, expert_replica, cp_ulysses, cp_ring");
}

namespace {

// The first member of group g of a kind (groups numbered by their first member).
int group_leader(const Mesh& m, const std::string& kind, int g) {
  const int s = m.stage_size();
  if (kind == "cp") return g * m.cp;
  if (kind == "pp") return g;  // the ranks of stage 0
  if (kind == "dp") return (g / m.cp) * s + g % m.cp;
  if (kind == "dpcp") return g * s;
  if (kind == "ep") return g * m.ep;
  if (kind == "cp_ulysses") return g * m.cp_ulysses;
  if (kind == "cp_ring") return (g / m.cp_ulysses) * m.cp + g % m.cp_ulysses;
  return (g / m.ep) * s + g % m.ep;  // expert_replica
}

std::vector<int> group_of(const Mesh& m, const std::string& kind, int rank) {
  if (kind == "cp") return m.cp_group(rank);
  if (kind == "pp") return m.pp_group(rank);
  if (kind == "dp") return m.dp_group(rank);
  if (kind == "dpcp") return m.dpcp_group(rank);
  if (kind == "ep") return m.ep_group(rank);
  if (kind == "cp_ulysses") return m.cp_ulysses_group(rank);
  if (kind == "cp_ring") return m.cp_ring_group(rank);
  return m.expert_replica_group(rank);
}

// The first `limit` groups of a kind (all of them if limit < 0).
std::vector<std::vector<int>> first_groups(const Mesh& m, const std::string& kind, int limit) {
  const int total = m.group_count(kind);  // also rejects an unknown kind
  const int n = limit < 0 ? total : std::min(total, limit);
  std::vector<std::vector<int>> out;
  out.reserve(n);
  for (int g = 0; g < n; ++g) out.push_back(group_of(m, kind, group_leader(m, kind, g)));
  return out;
}

std::vector<std::vector<int>> listed_groups(const Mesh& m, const std::string& kind, bool all) {
  return first_groups(m, kind, all ? -1 : kFirstGroups);
}

}  // namespace

std::vector<std::vector<int>> Mesh::all_groups(const std::string& kind) const {
  return first_groups(*this, kind, -1);
}

namespace {

// The kinds a summary lists: the hybrid's two CP levels after the CP groups.
std::vector<std::string> kinds_of(const Mesh& m) {
  std::vector<std::string> kinds = kKinds;
  if (m.cp_mode == CpMode::hybrid) kinds.insert(kinds.begin() + 1, {"cp_ulysses", "cp_ring"});
  return kinds;
}

std::string kind_title(const Mesh& m, const std::string& kind) {
  if (kind == "cp" && m.cp_mode == CpMode::ulysses)
    return "CP groups (Ulysses all-to-all; each inside one NVLink domain)";
  if (kind == "cp" && m.cp_mode == CpMode::hybrid)
    return "CP groups (hybrid: Ulysses " + str(m.cp_ulysses) + " x ring " + str(m.cp_ring()) + ")";
  if (kind == "cp_ulysses")
    return "  CP level 1: Ulysses all-to-all groups (each inside one NVLink domain)";
  if (kind == "cp_ring")
    return "  CP level 2: rings over the Ulysses groups (zig-zag; may cross domains and nodes)";
  if (kind == "cp") return "CP groups (ring attention; each inside one NVLink domain)";
  if (kind == "dp") return "DP groups (same stage and cp index)";
  if (kind == "pp") return "PP groups (one rank per stage, stage order)";
  if (kind == "dpcp") return "dense-gradient reduction groups (dp*cp ranks of a stage)";
  if (kind == "ep") return "EP groups (all-to-all; each inside one node)";
  return "expert-gradient reduction groups (replicas of the same experts)";
}

}  // namespace

std::string mesh_summary_text(const Mesh& m, bool list_groups) {
  const bool all = list_groups || m.world <= kListAllUpTo;
  std::ostringstream o;
  o << "cluster: " << m.shape.nodes << (m.shape.nodes == 1 ? " node x " : " nodes x ")
    << m.shape.devices_per_node << " devices = " << m.world << " ranks, NVLink domain "
    << m.shape.nvlink_domain << " ranks\n";
  o << "mesh:    pp=" << m.pp << " dp=" << m.dp << " cp=" << m.cp << " ep=" << m.ep
    << "  (world = pp*dp*cp = " << m.pp << "*" << m.dp << "*" << m.cp << "; "
    << m.stage_size() / m.ep << " EP groups per stage)\n";
  if (m.cp_mode != CpMode::ring)
    o << "cp:      cp_mode=" << config_name(m.cp_mode) << " = Ulysses " << m.cp_ulysses
      << " (all-to-all of heads) x ring " << m.cp_ring() << " (K/V blocks)\n";
  o << "stages:\n";
  const int s = m.stage_size();
  const int stages_shown = all ? m.pp : std::min(m.pp, 2 * kFirstGroups);
  for (int i = 0; i < stages_shown; ++i) {
    const int a = i * s, b = (i + 1) * s - 1;
    o << "  stage " << i << ": ranks " << span(a, b) << " on node"
      << (m.node_of(a) == m.node_of(b) ? " " : "s ") << span(m.node_of(a), m.node_of(b)) << "\n";
  }
  if (stages_shown < m.pp)
    o << "  ... " << (m.pp - stages_shown) << " more stages (--groups lists all)\n";
  for (const auto& kind : kinds_of(m)) {
    const int n = m.group_count(kind);
    const auto groups = listed_groups(m, kind, all);
    o << kind_title(m, kind) << ": " << n << " of " << groups.front().size() << " ranks\n ";
    for (const auto& g : groups) {
      o << " [" << group_text(g) << "]";
      if (kind == "cp" || kind == "ep" || kind == "cp_ulysses") {
        o << "@node" << m.node_of(g.front());
      } else if (kind == "cp_ring") {
        o << "@node" << span(m.node_of(g.front()), m.node_of(g.back()));
      }
    }
    if (static_cast<int>(groups.size()) < n)
      o << " ... " << (n - groups.size()) << " more (--groups lists all)";
    o << "\n";
  }
  return o.str();
}

std::string mesh_json(const Mesh& m, bool list_groups) {
  const bool all = list_groups || m.world <= kListAllUpTo;
  std::ostringstream o;
  o << "{\"world\": " << m.world << ", \"nodes\": " << m.shape.nodes
    << ", \"devices_per_node\": " << m.shape.devices_per_node
    << ", \"nvlink_domain\": " << m.shape.nvlink_domain << ", \"pp\": " << m.pp
    << ", \"dp\": " << m.dp << ", \"cp\": " << m.cp << ", \"ep\": " << m.ep << ", \"cp_mode\": \""
    << config_name(m.cp_mode) << "\", \"cp_ulysses\": " << m.cp_ulysses
    << ", \"cp_ring\": " << m.cp_ring();
  const int s = m.stage_size();
  const int stages_shown = all ? m.pp : std::min(m.pp, 2 * kFirstGroups);
  o << ", \"stages\": [";
  for (int i = 0; i < stages_shown; ++i) {
    const int a = i * s, b = (i + 1) * s - 1;
    o << (i ? ", " : "") << "{\"stage\": " << i << ", \"first_rank\": " << a
      << ", \"last_rank\": " << b << ", \"first_node\": " << m.node_of(a)
      << ", \"last_node\": " << m.node_of(b) << "}";
  }
  o << "], \"stages_complete\": " << (stages_shown == m.pp ? "true" : "false");
  o << ", \"groups\": {";
  const auto kinds = kinds_of(m);
  for (size_t k = 0; k < kinds.size(); ++k) {
    const auto groups = listed_groups(m, kinds[k], all);
    o << (k ? ", " : "") << "\"" << kinds[k] << "\": {\"count\": " << m.group_count(kinds[k])
      << ", \"complete\": "
      << (static_cast<int>(groups.size()) == m.group_count(kinds[k]) ? "true" : "false")
      << ", \"list\": [";
    for (size_t i = 0; i < groups.size(); ++i)
      o << (i ? ", " : "") << "[" << join(groups[i], ", ") << "]";
    o << "]}";
  }
  o << "}}";
  return o.str();
}

}  // namespace trident
