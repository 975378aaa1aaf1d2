// `trident topo [CONFIG.toml] [--set k=v ...] [--format text|json]`: detect
// the topology under mpirun/srun, map the config's mesh onto it, and print on
// rank 0 where every rank goes and which groups it joins, so a job's
// placement can be checked in seconds before a long run. Writes no files.
#include <cstdio>
#include <iterator>
#include <sstream>
#include <vector>

#include "commands.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

const char* kGroupKinds[] = {"cp", "pp", "dp", "dpcp", "ep", "expert_replica"};

// The kinds listed: with cp_mode = "hybrid" also its two CP levels.
std::vector<const char*> group_kinds(const Mesh& m) {
  std::vector<const char*> kinds(std::begin(kGroupKinds), std::end(kGroupKinds));
  if (m.cp_mode == CpMode::hybrid) kinds.insert(kinds.begin() + 1, {"cp_ulysses", "cp_ring"});
  return kinds;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", ch);
      o += b;
    } else {
      o += ch;
    }
  }
  return o;
}

class TopoCommand : public Command {
 public:
  explicit TopoCommand(CLI::App* app) {
    app->add_option("config", config_path_, "Config file (TOML); defaults (pp=cp=ep=1) if none");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--format", format_, "Output format: text or json");
  }

  bool needs_mpi() const override { return true; }

  int run() override {
    if (format_ != "text" && format_ != "json")
      throw InputError("--format " + format_ + ": must be text or json");
    const int world_size = comm_world_size(), rank = comm_world_rank();
    Config cfg = load_config(config_path_, sets_);
    train::check_config(cfg, world_size);
    auto world = world_communicator(cfg.runtime.timeout_s);
    Topology topo = detect_topology(*world, cfg);
    std::unique_ptr<Communicators> comms;
    try {
      comms = build_communicators(*world, cfg, std::move(topo));
    } catch (const MeshError& e) {
      // Point at the config line of the request that did not fit.
      auto it = cfg.key_origin.find(e.key);
      throw InputError((it != cfg.key_origin.end() ? it->second : cfg.source) + ": " + e.what());
    }
    if (rank == 0) {
      const std::string out = format_ == "json" ? json(*comms, cfg) : text(*comms, cfg);
      std::fputs(out.c_str(), stdout);
      std::fflush(stdout);
    }
    comms->world->barrier();  // nobody finalises while rank 0 still prints
    return 0;
  }

 private:
  // Groups of a kind as world ranks (the mesh lists logical ranks).
  static std::vector<std::vector<int>> world_groups(const Communicators& c, const char* kind) {
    std::vector<int> world_of(c.topo.ranks.size());
    for (const auto& r : c.topo.ranks) world_of[r.logical] = r.rank;
    auto groups = c.mesh.all_groups(kind);
    for (auto& g : groups)
      for (int& m : g) m = world_of[m];
    return groups;
  }

  static std::string text(const Communicators& c, const Config& cfg) {
    const auto& t = c.topo;
    const auto& m = c.mesh;
    std::ostringstream o;
    o << "topology: source=" << t.source << " nodes=" << t.shape.nodes
      << " ranks_per_node=" << t.shape.devices_per_node
      << " nvlink_domain=" << t.shape.nvlink_domain << " cuda_devices=" << t.cuda_devices
      << " world=" << m.world << "\n";
    o << "mesh: pp=" << m.pp << " dp=" << m.dp << " cp=" << m.cp << " ep=" << m.ep
      << " n_experts=" << cfg.model.n_experts << " (config " << cfg.source << ")\n";
    if (m.cp_mode != CpMode::ring)
      o << "cp: cp_mode=" << config_name(m.cp_mode) << " = Ulysses " << m.cp_ulysses
        << " (all-to-all, inside an NVLink domain) x ring " << m.cp_ring() << "\n";
    o << "\n" << topology_table(c) << "\ngroups (world ranks):\n";
    for (const char* kind : group_kinds(m)) {
      char label[32];
      std::snprintf(label, sizeof label, "  %-15s", kind);
      o << label;
      for (const auto& g : world_groups(c, kind)) {
        o << " [";
        for (size_t i = 0; i < g.size(); ++i) o << (i ? " " : "") << g[i];
        o << "]";
      }
      o << "\n";
    }
    return o.str();
  }

  static std::string json(const Communicators& c, const Config& cfg) {
    const auto& t = c.topo;
    const auto& m = c.mesh;
    std::ostringstream o;
    o << "{\"source\": \"" << t.source << "\", \"nodes\": " << t.shape.nodes
      << ", \"ranks_per_node\": " << t.shape.devices_per_node
      << ", \"nvlink_domain\": " << t.shape.nvlink_domain
      << ", \"cuda_devices\": " << t.cuda_devices << ", \"world\": " << m.world
      << ", \"config\": \"" << json_escape(cfg.source) << "\""
      << ", \"pp\": " << m.pp << ", \"dp\": " << m.dp << ", \"cp\": " << m.cp
      << ", \"ep\": " << m.ep << ", \"cp_mode\": \"" << config_name(m.cp_mode)
      << "\", \"cp_ulysses\": " << m.cp_ulysses << ", \"cp_ring\": " << m.cp_ring()
      << ",\n \"ranks\": [";
    for (size_t i = 0; i < t.ranks.size(); ++i) {
      const RankInfo& r = t.ranks[i];
      const RankCoord k = m.coord(r.logical);
      o << (i ? ",\n  " : "\n  ") << "{\"rank\": " << r.rank << ", \"logical\": " << r.logical
        << ", \"node\": " << r.node << ", \"hostname\": \"" << json_escape(r.hostname)
        << "\", \"local_rank\": " << r.local_rank << ", \"device\": " << r.device
        << ", \"pp\": " << k.pp << ", \"dp\": " << k.dp << ", \"cp\": " << k.cp
        << ", \"ep\": " << k.ep << ", \"ep_group\": " << k.ep_group << "}";
    }
    o << "],\n \"groups\": {";
    bool first_kind = true;
    for (const char* kind : group_kinds(m)) {
      o << (first_kind ? "" : ", ") << "\"" << kind << "\": [";
      first_kind = false;
      bool first = true;
      for (const auto& g : world_groups(c, kind)) {
        o << (first ? "[" : ", [");
        first = false;
        for (size_t i = 0; i < g.size(); ++i) o << (i ? ", " : "") << g[i];
        o << "]";
      }
      o << "]";
    }
    o << "}}\n";
    return o.str();
  }

  std::string config_path_;
  std::vector<std::string> sets_;
  std::string format_ = "text";
};

}  // namespace

std::unique_ptr<Command> add_topo_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "topo", "Print the detected topology and rank mapping (under mpirun/srun)");
  return std::make_unique<TopoCommand>(app);
}
}  // namespace trident::cli
