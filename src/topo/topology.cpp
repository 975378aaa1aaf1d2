// Topology detection (nodes, devices, NVLink domains, or an override) and the
// communicators of each group kind, split from world in the mesh's order.
#include "trident/topo/topology.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/topo/devices.hpp"

namespace trident {

namespace {

constexpr const char* kTopologyEnv = "TRIDENT_TOPOLOGY";
constexpr const char* kDeviceEnv = "TRIDENT_DEVICE";
constexpr const char* kTopologyEnvForm = "\"nodes=N,devices_per_node=G[,nvlink_domain=D]\"";

bool parse_positive(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;
  out = std::atoi(s.c_str());
  return out > 0;
}

// TRIDENT_TOPOLOGY="nodes=2,devices_per_node=4,nvlink_domain=4".
TopologyOverride parse_topology_env(const std::string& text) {
  TopologyOverride o;
  const std::string where = std::string(kTopologyEnv) + "=\"" + text + "\": ";
  std::stringstream ss(text);
  std::string item;
  bool any = false;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw InputError(where + "'" + item + "' is not key=value; expected " + kTopologyEnvForm);
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    int v = 0;
    if (!parse_positive(val, v))
      throw InputError(where + key + " must be a positive integer, got '" + val + "'");
    if (key == "nodes")
      o.nodes = v;
    else if (key == "devices_per_node")
      o.devices_per_node = v;
    else if (key == "nvlink_domain")
      o.nvlink_domain = v;
    else
      throw InputError(where + "unknown key '" + key + "'; expected " + kTopologyEnvForm);
    any = true;
  }
  if (!any || o.nodes == 0 || o.devices_per_node == 0)
    throw InputError(where + "nodes and devices_per_node are required; expected " +
                     kTopologyEnvForm);
  return o;
}

// The override in force (env wins over the config table) and how to name it
// in messages; nullopt when detection applies.
std::optional<std::pair<TopologyOverride, std::string>> topology_override(const Config& cfg) {
  if (const char* env = std::getenv(kTopologyEnv); env && *env) {
    return std::make_pair(parse_topology_env(env), std::string(kTopologyEnv) + "=\"" + env + "\"");
  }
  if (cfg.topology) {
    return std::make_pair(*cfg.topology, cfg.source + ": [topology]");
  }
  return std::nullopt;
}

void check_override(const TopologyOverride& o, const std::string& where, int world) {
  if (o.nodes <= 0 || o.devices_per_node <= 0)
    throw InputError(
        where + ": nodes and devices_per_node must be >= 1 (got nodes=" + std::to_string(o.nodes) +
        ", devices_per_node=" + std::to_string(o.devices_per_node) + ")");
  const int domain = o.nvlink_domain > 0 ? o.nvlink_domain : o.devices_per_node;
  if (o.devices_per_node % domain != 0)
    throw InputError(where + ": nvlink_domain=" + std::to_string(domain) +
                     " must divide devices_per_node=" + std::to_string(o.devices_per_node));
  if (o.nodes * o.devices_per_node != world)
    throw InputError(where + ": nodes=" + std::to_string(o.nodes) +
                     " x devices_per_node=" + std::to_string(o.devices_per_node) + " = " +
                     std::to_string(o.nodes * o.devices_per_node) + " ranks, but the job has " +
                     std::to_string(world) + " ranks");
}

std::string host_label() {
  if (const char* s = std::getenv("SLURMD_NODENAME"); s && *s) return s;
  char h[256] = {0};
  if (gethostname(h, sizeof h - 1) != 0) return "unknown";
  return h;
}

// This rank's device: TRIDENT_DEVICE, else local rank modulo the visible
// devices, else -1 (CPU).
int pick_device(int local_rank, int cuda_devices) {
  if (const char* s = std::getenv(kDeviceEnv); s && *s) {
    int d = -1;
    if (std::string(s) == "0") return 0;
    if (!parse_positive(s, d))
      throw InputError(std::string(kDeviceEnv) + "=\"" + s +
                       "\": must be a device index (integer >= 0)");
    if (cuda_devices > 0 && d >= cuda_devices)
      throw InputError(std::string(kDeviceEnv) + "=" + s + ": only " +
                       std::to_string(cuda_devices) + " CUDA devices are visible");
    return d;
  }
  return cuda_devices > 0 ? local_rank % cuda_devices : -1;
}

// What each rank tells the others during detection (fixed size: one allgather).
struct RankRecord {
  int node_key = 0;  // smallest world rank on the same shared-memory node
  int local_rank = 0, local_size = 1;
  int device = -1, cuda_devices = 0;
  int device_forced = 0;  // TRIDENT_DEVICE was set on that rank
  int nvml = 0, active_links = 0, island = 0;
  char host[96] = {0};
  char fabric[48] = {0};
};

void copy_label(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(cap - 1, s.size()));
}

// Ranks per NVLink domain from the probes: without NVML, the node (the usual
// NVSwitch box, and the only sensible choice on CPU); a device without active
// links is its own domain; a multi-node NVLink fabric is capped at the node
// because the mesh places cp inside a node as well. The smallest over ranks
// wins, rounded down to a divisor of the ranks per node.
int nvlink_domain_of(const std::vector<RankRecord>& recs, int ranks_per_node) {
  int domain = ranks_per_node;
  for (const auto& r : recs) {
    if (!r.nvml) continue;
    int d = ranks_per_node;
    if (r.fabric[0]) {
      d = int(std::count_if(recs.begin(), recs.end(), [&](const RankRecord& o) {
        return std::strcmp(o.fabric, r.fabric) == 0;
      }));
    } else if (r.active_links == 0) {
      d = 1;
    } else if (r.island > 0) {
      d = r.island;  // e.g. two 4-GPU NVLink islands in an 8-GPU node without NVSwitch
    }
    domain = std::min(domain, d);
  }
  domain = std::max(1, std::min(domain, ranks_per_node));
  while (ranks_per_node % domain != 0) --domain;
  return domain;
}

// What this rank knows about itself: its node (by the node's smallest world
// rank), local rank, device and, without an override, its NVLink links.
RankRecord describe_rank(Communicator& world, Communicator& local, bool probe_links) {
  RankRecord me;
  me.local_rank = local.rank();
  me.local_size = local.size();
  me.cuda_devices = cuda_device_count();
  me.device = pick_device(me.local_rank, me.cuda_devices);  // may throw: before any collective
  me.device_forced = std::getenv(kDeviceEnv) && *std::getenv(kDeviceEnv);
  {
    int neg = -world.rank();  // min over the node as max of the negation
    local.allreduce_max(&neg, 1);
    me.node_key = -neg;
  }
  if (probe_links && me.device >= 0 && me.device < std::max(1, me.cuda_devices)) {
    const NvlinkProbe nv = probe_nvlink(me.device);
    me.nvml = nv.nvml;
    me.active_links = nv.active_links;
    me.island = nv.island;
    copy_label(me.fabric, sizeof me.fabric, nv.fabric);
  }
  copy_label(me.host, sizeof me.host, host_label());
  return me;
}

// The ranks placed on the override's virtual nodes, in launch order.
void place_on_override(Topology& t, const TopologyOverride& o,
                       const std::vector<RankRecord>& recs) {
  t.source = "override";
  t.shape.nodes = o.nodes;
  t.shape.devices_per_node = o.devices_per_node;
  t.shape.nvlink_domain = o.nvlink_domain > 0 ? o.nvlink_domain : o.devices_per_node;
  for (size_t r = 0; r < recs.size(); ++r) {
    RankInfo& ri = t.ranks[r];
    ri.rank = int(r);
    ri.node = int(r) / o.devices_per_node;
    ri.local_rank = int(r) % o.devices_per_node;
    // The virtual node's device: as detection would pick it on a node of
    // that many ranks (TRIDENT_DEVICE still wins on each rank).
    ri.device = recs[r].device;
    if (!recs[r].device_forced && recs[r].cuda_devices > 0)
      ri.device = ri.local_rank % recs[r].cuda_devices;
    ri.hostname = std::string(recs[r].host) + "/v" + std::to_string(ri.node);
  }
}

// The ranks placed on the nodes they were detected on.
void place_as_detected(Topology& t, const std::vector<RankRecord>& recs) {
  t.source = "detected";
  // Nodes numbered by their smallest world rank: the same on every rank,
  // and launch order for the usual block placement.
  std::vector<int> keys;
  for (const auto& r : recs) keys.push_back(r.node_key);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::map<int, int> node_of_key;
  for (size_t i = 0; i < keys.size(); ++i) node_of_key[keys[i]] = int(i);
  const int rpn = recs[0].local_size;
  for (size_t r = 0; r < recs.size(); ++r) {
    if (recs[r].local_size != rpn)
      throw InputError("uneven ranks per node: " + std::string(recs[0].host) + " has " +
                       std::to_string(rpn) + ", " + recs[r].host + " has " +
                       std::to_string(recs[r].local_size) +
                       "; launch the same number of ranks on every node, or set " + kTopologyEnv +
                       "=" + kTopologyEnvForm);
    RankInfo& ri = t.ranks[r];
    ri.rank = int(r);
    ri.node = node_of_key[recs[r].node_key];
    ri.local_rank = recs[r].local_rank;
    ri.device = recs[r].device;
    ri.hostname = recs[r].host;
  }
  t.shape.nodes = int(keys.size());
  t.shape.devices_per_node = rpn;
  t.shape.nvlink_domain = nvlink_domain_of(recs, rpn);
}

// Logical order: node-major, then local rank.
void number_logical(Topology& t) {
  const int n = int(t.ranks.size());
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const RankInfo &x = t.ranks[size_t(a)], &y = t.ranks[size_t(b)];
    return x.node != y.node ? x.node < y.node : x.local_rank < y.local_rank;
  });
  for (int l = 0; l < n; ++l) t.ranks[size_t(order[size_t(l)])].logical = l;
}

// The rank's device, chosen once from the topology (TRIDENT_DEVICE, else
// local rank % visible devices) and made current before any device group or
// allocation: NCCL makes its communicators on the current device, and the
// trainer computes on it (train::training_device). A rank that cannot have
// the device runtime.backend asks for fails every rank with its line.
Device bind_rank_device(Communicator& world, Backend backend, int topology_device) {
  Device d = Device::cpu();
  std::string error;
  try {
    d = kernels::select_device(backend, topology_device);
  } catch (const InputError& e) {
    error = e.what();
  }
  const CheckOutcome agreed = agree_on_check(world.host(), error.empty(), error);
  if (!agreed.all_passed)
    throw InputError("rank " + std::to_string(agreed.rank) + ": " + agreed.message);
  kernels::make_current(d);
  return d;
}

}  // namespace

Topology detect_topology(Communicator& world, const Config& cfg) {
  const int wsize = world.size();
  // Input errors first, before any communication, so that every rank raises
  // the same one and nobody waits in a collective.
  const auto ov = topology_override(cfg);
  if (ov) check_override(ov->first, ov->second, wsize);

  auto local_group = world.host().split_node(CommKind::world, "node-local");
  const RankRecord me = describe_rank(world, *local_group, !ov);
  std::vector<RankRecord> recs(static_cast<size_t>(wsize));
  world.host().allgather(&me, recs.data(), sizeof(RankRecord));

  Topology t;
  t.cuda_devices = me.cuda_devices;
  t.ranks.resize(size_t(wsize));
  if (ov)
    place_on_override(t, ov->first, recs);
  else
    place_as_detected(t, recs);
  number_logical(t);
  return t;
}

std::unique_ptr<Communicators> build_communicators(Communicator& world, const Config& cfg,
                                                   Topology topo) {
  const int wsize = world.size(), wrank = world.rank();
  TRIDENT_CHECK(int(topo.ranks.size()) == wsize && topo.shape.world() == wsize,
                "topology of " + std::to_string(topo.ranks.size()) + " ranks used on a world of " +
                    std::to_string(wsize));
  auto c = std::make_unique<Communicators>();
  const double timeout = cfg.runtime.timeout_s > 0 ? cfg.runtime.timeout_s : 300.0;
  c->mesh = map_mesh(topo.shape,
                     MeshRequest{cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep,
                                 cfg.parallel.cp_mode, cfg.parallel.cp_ulysses},
                     cfg.model.n_experts);
  c->topo = std::move(topo);
  c->world_rank = wrank;
  std::vector<int> world_of_logical(wsize);
  for (const auto& r : c->topo.ranks) world_of_logical[r.logical] = r.rank;
  const int logical = c->topo.ranks[wrank].logical;
  c->me = c->mesh.coord(logical);

  // runtime.comm is this layer's key to apply; an unusable choice is an input
  // error on every rank before any group exists.
  c->comm_backend = agree_comm_backend(world, cfg.runtime.comm, cfg.runtime.backend);
  // World stays on the host backend (control traffic, files); the mesh's
  // groups are made on the chosen one.
  c->world = comm_group(world, CommBackend::mpi, 0, wrank, CommKind::world, "world", timeout);
  c->device = bind_rank_device(world, cfg.runtime.backend, c->topo.ranks[size_t(wrank)].device);

  auto split = [&](const std::vector<int>& group, CommKind kind, const char* name) {
    const auto pos = std::find(group.begin(), group.end(), logical);
    TRIDENT_CHECK(pos != group.end(), std::string("rank missing from its own ") + name + " group");
    // Groups of one kind are disjoint, so the smallest member names the group.
    const int color = *std::min_element(group.begin(), group.end());
    auto comm =
        comm_group(world, c->comm_backend, color, int(pos - group.begin()), kind, name, timeout);
    for (int i = 0; i < comm->size(); ++i)
      TRIDENT_CHECK(i < int(group.size()) && comm->world_rank_of(i) == world_of_logical[group[i]],
                    std::string(name) + " communicator does not match the mesh's group");
    return comm;
  };
  c->cp = split(c->mesh.cp_group(logical), CommKind::cp, "cp");
  c->pp = split(c->mesh.pp_group(logical), CommKind::pp, "pp");
  c->dp = split(c->mesh.dp_group(logical), CommKind::dp, "dp");
  c->dpcp = split(c->mesh.dpcp_group(logical), CommKind::dp, "dpcp");
  c->ep = split(c->mesh.ep_group(logical), CommKind::ep, "ep");
  c->expert_replica = split(c->mesh.expert_replica_group(logical), CommKind::dp, "expert_replica");
  // The common clock is measured at start-up, once per process: every rank
  // builds its communicators the same number of times, so all agree to skip.
  static bool clock_synced = false;
  if (!clock_synced) {
    sync_clock(world);
    clock_synced = true;
  }
  return c;
}

std::string topology_table(const Communicators& c) {
  const auto& ranks = c.topo.ranks;
  size_t host_w = 8;
  for (const auto& r : ranks) host_w = std::max(host_w, r.hostname.size());
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%5s %7s %5s  %-*s %6s %6s %4s %4s %4s %4s %8s\n", "rank",
                "logical", "node", int(host_w), "hostname", "local", "device", "pp", "dp", "cp",
                "ep", "ep_group");
  out += line;
  for (const auto& r : ranks) {
    const RankCoord k = c.mesh.coord(r.logical);
    std::snprintf(line, sizeof line, "%5d %7d %5d  %-*s %6d %6d %4d %4d %4d %4d %8d\n", r.rank,
                  r.logical, r.node, int(host_w), r.hostname.c_str(), r.local_rank, r.device, k.pp,
                  k.dp, k.cp, k.ep, k.ep_group);
    out += line;
  }
  return out;
}

}  // namespace trident
