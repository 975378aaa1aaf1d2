// `trident plan`: load and validate a config for a cluster shape given on the
// command line, map the mesh, and print where everything goes, without
// launching anything (no MPI), so that a 1024-node job can be checked on a
// laptop before it waits in a queue. With a machine profile it predicts the
// mesh's step time and memory (--machine), or searches every legal mesh for
// the fastest (--search); --calibrate (under mpirun) measures the machine it
// runs on and writes its profile.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/model/data.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/plan/calibrate.hpp"
#include "trident/plan/packed_attention.hpp"
#include "trident/plan/search.hpp"
#include "trident/topo/mesh.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

std::string escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) o += ch;
  }
  return o;
}

std::string fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// map_mesh, with a refusal pointing at the line of the config key at fault.
Mesh map_config_mesh(const Config& cfg, const ClusterShape& shape) {
  try {
    return map_mesh(shape,
                    {cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep, cfg.parallel.cp_mode,
                     cfg.parallel.cp_ulysses},
                    cfg.model.n_experts);
  } catch (const MeshError& e) {
    auto it = cfg.key_origin.find(e.key);
    const std::string where = it != cfg.key_origin.end() ? it->second : cfg.source;
    std::string msg = e.what();
    // A --set origin already says "parallel.cp=8"; do not say it twice.
    if (where.rfind("--set ", 0) == 0 && msg.rfind(e.key + "=", 0) == 0)
      msg = msg.substr(msg.find(": ") + 2);
    throw InputError(where + ": " + msg);
  }
}

// The mapping of the config's own mesh: groups, pipeline, data, experts.
std::string mapping_text(const Config& cfg, const Mesh& mesh, bool list_groups) {
  const auto& p = cfg.parallel;
  const auto& d = cfg.data;
  const int chunks = p.pp * p.vpp;
  const long long global_batch = 1LL * d.micro_batch_size * d.num_microbatches * mesh.dp;
  const bool inter = p.schedule == PipelineSchedule::interleaved;
  const double bubble = double(p.pp - 1) / ((inter ? p.vpp : 1) * d.num_microbatches);
  std::ostringstream o;
  o << "plan for " << cfg.source << " (model " << model_hash(cfg) << ")\n"
    << mesh_summary_text(mesh, list_groups) << "pipeline: schedule " << config_name(p.schedule)
    << ", " << chunks << " model chunks (vpp=" << p.vpp << ") of " << cfg.model.n_layers / chunks
    << " layers, " << d.num_microbatches << " micro-batches, bubble " << fixed(100 * bubble)
    << "% ((p-1)/" << (inter ? "(v*m)" : "m") << ")\n"
    << "data: global batch " << global_batch << " sequences of " << d.seq_len << " tokens, "
    << d.seq_len / p.cp << " tokens per CP rank (" << config_name(p.cp_layout) << ")\n";
  if (mesh.cp_ulysses > 1)
    o << "attention: the all-to-all gives each CP rank " << d.seq_len / mesh.cp_ring()
      << " tokens of " << cfg.model.n_heads / mesh.cp_ulysses << " query head(s)"
      << (mesh.cp_ring() > 1 ? ", which the ring over " + std::to_string(mesh.cp_ring()) +
                                   " groups attends to the whole sequence"
                             : ", the whole sequence")
      << "\n";
  if (cfg.model.n_experts > 0)
    o << "experts: " << cfg.model.n_experts << " per MoE layer, " << cfg.model.n_experts / p.ep
      << " per rank, top_k " << cfg.model.top_k << "\n";
  return o.str();
}

// The same facts as one JSON object, without its closing brace (a prediction may follow).
std::string mapping_json_open(const Config& cfg, const Mesh& mesh, bool list_groups) {
  const auto& p = cfg.parallel;
  const auto& d = cfg.data;
  const int chunks = p.pp * p.vpp;
  const long long global_batch = 1LL * d.micro_batch_size * d.num_microbatches * mesh.dp;
  const double bubble = p.schedule == PipelineSchedule::interleaved
                            ? double(p.pp - 1) / (p.vpp * d.num_microbatches)
                            : double(p.pp - 1) / d.num_microbatches;
  std::ostringstream o;
  o << "{\"config\": \"" << escape(cfg.source) << "\", \"model_hash\": \"" << model_hash(cfg)
    << "\", \"schedule\": \"" << config_name(p.schedule) << "\", \"vpp\": " << p.vpp
    << ", \"num_microbatches\": " << d.num_microbatches
    << ", \"layers_per_chunk\": " << cfg.model.n_layers / chunks
    << ", \"global_batch\": " << global_batch << ", \"seq_len\": " << d.seq_len
    << ", \"tokens_per_cp_rank\": " << d.seq_len / p.cp << ", \"bubble_fraction\": " << bubble
    << ", \"experts_per_rank\": " << (cfg.model.n_experts > 0 ? cfg.model.n_experts / p.ep : 0)
    << ", \"mesh\": " << mesh_json(mesh, list_groups);
  return o.str();
}

// data.packing = "documents": the documents' length histogram from the data
// files into cfg (what prices packed attention), and a line saying what it
// gives on the config's mesh. Data that cannot be read leaves the histogram
// empty (attention priced causal) and says so: the plan of a config whose
// files live on the cluster is still worth having.
std::string read_document_lengths(Config& cfg) {
  if (cfg.data.packing != Packing::documents || cfg.data.task != DataTask::tokens) return "";
  try {
    cfg.doc_lengths_log2 = model::make_data_source(cfg, 1)->document_lengths_log2();
  } catch (const InputError& e) {
    return std::string("attention: packed documents priced as one causal sequence (") + e.what() +
           ")\n";
  }
  int64_t docs = 0;
  for (int64_t n : cfg.doc_lengths_log2) docs += n;
  const auto& d = cfg.data;
  const int ring = cp::ulysses_size(cfg.parallel) > 1
                       ? cfg.parallel.cp / cp::ulysses_size(cfg.parallel)
                       : cfg.parallel.cp;
  const double S = double(d.seq_len), causal = S * (S + 1) / 2;
  const double pairs =
      plan::packed_pairs_per_sequence(cfg.doc_lengths_log2, d.seq_len, cfg.model.window);
  const double imb = plan::packed_layout_imbalance(cfg.doc_lengths_log2, d.seq_len, ring,
                                                   cfg.parallel.cp_layout, cfg.model.window);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "attention: packed documents (%lld in the data): %.4g pairs per sequence, %.1f%% "
                "of causal; busiest of %d ring rank(s) %.3fx the mean (%s)\n",
                static_cast<long long>(docs), pairs, 100 * pairs / causal, ring, imb,
                config_name(cfg.parallel.cp_layout).c_str());
  return buf;
}

class PlanCommand : public Command {
 public:
  explicit PlanCommand(CLI::App* app) {
    app->add_option("config", config_path_, "Config file (TOML)")->required();
    nodes_opt_ =
        app->add_option("--nodes", nodes_, "Number of nodes (required unless --calibrate)");
    devices_opt_ = app->add_option("--devices-per-node", devices_,
                                   "Ranks (devices) per node (required unless --calibrate)");
    app->add_option("--nvlink-domain", nvlink_, "Ranks per NVLink domain (default: a whole node)");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--format", format_, "Output format: text or json");
    app->add_flag("--groups", list_groups_, "List every group, even on huge meshes");
    app->add_option("--machine", machine_path_,
                    "Machine profile (TOML): predict the mesh's step time and memory");
    app->add_option("--memory-gb", memory_gb_,
                    "Memory per device, GB (default: the profile's); larger meshes are refused");
    app->add_flag("--search", search_, "Search every legal mesh for the fastest (needs --machine)");
    app->add_option("--top", top_k_, "With --search: how many meshes to list (default 5)");
    app->add_option("--global-batch", global_batch_,
                    "With --search: sequences per step (default: the config's on its own mesh)");
    app->add_flag("--calibrate", calibrate_,
                  "Measure this machine (under mpirun, as many ranks per node as a run) and "
                  "write the profile to --out");
    app->add_option("--out", out_path_, "With --calibrate: the machine profile to write");
  }

  bool needs_mpi() const override { return calibrate_; }

  int run() override {
    if (calibrate_) return run_calibrate();
    const ClusterShape shape = checked_shape();
    Config cfg = load_config(config_path_, sets_);
    // The flags describe the cluster being planned for; they replace the
    // config's [topology], which describes where the config was tried.
    cfg.topology = TopologyOverride{nodes_, devices_, shape.nvlink_domain};
    for (const char* k : {"topology.nodes", "topology.devices_per_node", "topology.nvlink_domain"})
      cfg.key_origin.erase(k);
    const std::string packed = read_document_lengths(cfg);
    std::optional<plan::MachineProfile> machine;
    if (!machine_path_.empty()) machine = plan::load_machine(machine_path_);
    if (search_) return run_search(cfg, shape, *machine);
    train::check_config(cfg, shape.world());
    const Mesh mesh = map_config_mesh(cfg, shape);
    std::optional<plan::Prediction> pred;
    if (machine) {
      pred = plan::predict(cfg, plan::mesh_plan_of(cfg, shape.world()), shape, *machine);
      plan::add_policy_effects(cfg, shape, *machine, memory_limit(*machine), *pred);
    }
    if (format_ == "json") {
      std::cout << mapping_json_open(cfg, mesh, list_groups_)
                << (pred ? ", \"prediction\": " + plan::prediction_json(*pred) : "") << "}\n";
    } else {
      std::cout << mapping_text(cfg, mesh, list_groups_) << packed
                << (pred ? plan::prediction_text(*pred, memory_limit(*machine)) : "");
    }
    if (pred) refuse_if_too_large(*pred, memory_limit(*machine));
    return 0;
  }

 private:
  ClusterShape checked_shape() const {
    for (const CLI::Option* o : {nodes_opt_, devices_opt_})
      if (o->count() == 0) throw InputError(o->get_name() + ": required (the cluster to plan for)");
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
    check_search_flags();
    return {nodes_, devices_, nvlink};
  }

  void check_search_flags() const {
    if (search_ && machine_path_.empty()) throw InputError("--search: needs --machine FILE");
    if (memory_gb_ < 0) throw InputError("--memory-gb " + fixed(memory_gb_) + ": must be > 0");
    if (top_k_ < 1) throw InputError("--top " + std::to_string(top_k_) + ": must be >= 1");
    if (global_batch_ < 0)
      throw InputError("--global-batch " + std::to_string(global_batch_) + ": must be >= 1");
  }

  double memory_limit(const plan::MachineProfile& m) const {
    return memory_gb_ > 0 ? memory_gb_ * 1e9 : m.memory_bytes;
  }

  void refuse_if_too_large(const plan::Prediction& p, double limit) const {
    if (limit <= 0 || p.memory.total() <= limit) return;
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs %.3f GB on pipeline rank %d, more than the %.3f GB",
                  p.memory.total() / 1e9, p.memory_pp_rank, limit / 1e9);
    throw InputError(std::string(memory_gb_ > 0 ? "--memory-gb" : "--machine " + machine_path_) +
                     ": the mesh " + p.plan.str() + " " + buf + " of a device");
  }

  int run_search(const Config& cfg, const ClusterShape& shape, const plan::MachineProfile& m) {
    const plan::SearchOptions opt{top_k_, memory_limit(m), global_batch_};
    const plan::SearchResult r = plan::search(cfg, shape, m, opt);
    std::cout << (format_ == "json" ? plan::search_json(r)
                                    : plan::search_text(r, opt.memory_limit_bytes));
    return 0;
  }

  // Every rank measures; rank 0 writes the profile (temporary name, then
  // renamed, so a failed run leaves no half-written file).
  int run_calibrate() {
    if (out_path_.empty()) throw InputError("--calibrate: needs --out FILE");
    Config cfg = load_config(config_path_, sets_);
    cfg.topology.reset();  // measure the machine the job runs on, not the one the config names
    kernels::set_blas_threads(1);  // as trident run: the ranks already share the cores
    auto job = world_communicator(cfg.runtime.timeout_s);
    Communicator& world = *job;
    const Topology topo = detect_topology(world, cfg);
    std::vector<int> node_of;
    for (const RankInfo& r : topo.ranks) node_of.push_back(r.node);
    const plan::MachineProfile m = plan::calibrate_machine(world, node_of, cfg, {});
    if (world.rank() != 0) return 0;
    const std::string tmp = out_path_ + ".tmp";
    {
      std::ofstream out(tmp);
      out << plan::machine_to_toml(m);
      if (!out) throw InputError("--out " + out_path_ + ": cannot write the machine profile");
    }
    if (std::rename(tmp.c_str(), out_path_.c_str()) != 0)
      throw InputError("--out " + out_path_ + ": cannot write the machine profile");
    std::cout << "wrote " << out_path_ << "\n" << plan::machine_to_toml(m);
    return 0;
  }

  CLI::Option *nodes_opt_ = nullptr, *devices_opt_ = nullptr;
  std::string config_path_;
  int nodes_ = 1, devices_ = 1, nvlink_ = 0;
  std::vector<std::string> sets_;
  std::string format_ = "text";
  bool list_groups_ = false;
  std::string machine_path_;
  double memory_gb_ = 0;
  bool search_ = false;
  int top_k_ = 5;
  long long global_batch_ = 0;
  bool calibrate_ = false;
  std::string out_path_;
};

}  // namespace

std::unique_ptr<Command> add_plan_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "plan", "Map a config onto a cluster shape without launching; predict and search meshes");
  return std::make_unique<PlanCommand>(app);
}

}  // namespace trident::cli
