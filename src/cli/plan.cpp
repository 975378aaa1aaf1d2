// `trident plan`: load and validate a config for a cluster shape given on the
// command line, map the mesh, and print where everything goes, without
// launching anything (no MPI), so that a 1024-node job can be checked on a
// laptop before it waits in a queue.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/topo/mesh.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

class PlanCommand : public Command {
 public:
  explicit PlanCommand(CLI::App* app) {
    app->add_option("config", config_path_, "Config file (TOML)")->required();
    app->add_option("--nodes", nodes_, "Number of nodes")->required();
    app->add_option("--devices-per-node", devices_, "Ranks (devices) per node")->required();
    app->add_option("--nvlink-domain", nvlink_, "Ranks per NVLink domain (default: a whole node)");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--format", format_, "Output format: text or json");
    app->add_flag("--groups", list_groups_, "List every group, even on huge meshes");
  }

  bool needs_mpi() const override { return false; }

  int run() override {
    if (format_ != "text" && format_ != "json")
      throw InputError("--format " + format_ + ": must be text or json");
    if (nodes_ < 1) throw InputError("--nodes " + std::to_string(nodes_) + ": must be >= 1");
    if (devices_ < 1)
      throw InputError("--devices-per-node " + std::to_string(devices_) + ": must be >= 1");
    if (static_cast<long long>(nodes_) * devices_ > (1LL << 30))
      throw InputError("--nodes " + std::to_string(nodes_) + " --devices-per-node " +
                       std::to_string(devices_) + ": more than 2^30 ranks");
    const int nvlink = nvlink_ == 0 ? devices_ : nvlink_;
    if (nvlink < 1 || devices_ % nvlink != 0)
      throw InputError("--nvlink-domain " + std::to_string(nvlink_) +
                       ": must divide --devices-per-node " + std::to_string(devices_));

    Config cfg = load_config(config_path_, sets_);
    // The flags describe the cluster being planned for; they replace the
    // config's [topology], which describes where the config was tried.
    cfg.topology = TopologyOverride{nodes_, devices_, nvlink};
    for (const char* k : {"topology.nodes", "topology.devices_per_node", "topology.nvlink_domain"})
      cfg.key_origin.erase(k);
    const ClusterShape shape{nodes_, devices_, nvlink};
    train::check_config(cfg, shape.world());

    Mesh mesh;
    try {
      mesh =
          map_mesh(shape, {cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep}, cfg.model.n_experts);
    } catch (const MeshError& e) {
      // Point at the line of the config key whose request did not fit.
      auto it = cfg.key_origin.find(e.key);
      const std::string where = it != cfg.key_origin.end() ? it->second : cfg.source;
      std::string msg = e.what();
      // A --set origin already says "parallel.cp=8"; do not say it twice.
      if (where.rfind("--set ", 0) == 0 && msg.rfind(e.key + "=", 0) == 0)
        msg = msg.substr(msg.find(": ") + 2);
      throw InputError(where + ": " + msg);
    }

    const auto& p = cfg.parallel;
    const auto& d = cfg.data;
    const int chunks = p.pp * p.vpp;
    const long long global_batch = 1LL * d.micro_batch_size * d.num_microbatches * mesh.dp;
    const double bubble = p.schedule == PipelineSchedule::interleaved
                              ? double(p.pp - 1) / (p.vpp * d.num_microbatches)
                              : double(p.pp - 1) / d.num_microbatches;
    if (format_ == "json") {
      std::ostringstream o;
      std::string mesh_text = mesh_json(mesh, list_groups_);
      o << "{\"config\": \"" << escape(cfg.source) << "\", \"model_hash\": \"" << model_hash(cfg)
        << "\", \"schedule\": \"" << config_name(p.schedule) << "\", \"vpp\": " << p.vpp
        << ", \"num_microbatches\": " << d.num_microbatches
        << ", \"layers_per_chunk\": " << cfg.model.n_layers / chunks
        << ", \"global_batch\": " << global_batch << ", \"seq_len\": " << d.seq_len
        << ", \"tokens_per_cp_rank\": " << d.seq_len / p.cp << ", \"bubble_fraction\": " << bubble
        << ", \"experts_per_rank\": " << (cfg.model.n_experts > 0 ? cfg.model.n_experts / p.ep : 0)
        << ", \"mesh\": " << mesh_text << "}\n";
      std::cout << o.str();
    } else {
      std::cout << "plan for " << cfg.source << " (model " << model_hash(cfg) << ")\n"
                << mesh_summary_text(mesh, list_groups_) << "pipeline: schedule "
                << config_name(p.schedule) << ", " << chunks << " model chunks (vpp=" << p.vpp
                << ") of " << cfg.model.n_layers / chunks << " layers, " << d.num_microbatches
                << " micro-batches, bubble " << fixed(100 * bubble) << "% ((p-1)/"
                << (p.schedule == PipelineSchedule::interleaved ? "(v*m)" : "m") << ")\n"
                << "data: global batch " << global_batch << " sequences of " << d.seq_len
                << " tokens, " << d.seq_len / p.cp << " tokens per CP rank ("
                << config_name(p.cp_layout) << ")\n";
      if (cfg.model.n_experts > 0)
        std::cout << "experts: " << cfg.model.n_experts << " per MoE layer, "
                  << cfg.model.n_experts / p.ep << " per rank, top_k " << cfg.model.top_k << "\n";
    }
    return 0;
  }

 private:
  static std::string escape(const std::string& s) {
    std::string o;
    for (char ch : s) {
      if (ch == '"' || ch == '\\') o += '\\';
      if (static_cast<unsigned char>(ch) >= 0x20) o += ch;
    }
    return o;
  }
  static std::string fixed(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }

  std::string config_path_;
  int nodes_ = 0, devices_ = 0, nvlink_ = 0;
  std::vector<std::string> sets_;
  std::string format_ = "text";
  bool list_groups_ = false;
};

}  // namespace

std::unique_ptr<Command> add_plan_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "plan", "Map a config onto a cluster shape without launching (validates the config)");
  return std::make_unique<PlanCommand>(app);
}

}  // namespace trident::cli
