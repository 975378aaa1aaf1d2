// `trident bench ring`: the flags of the ring attention benchmarks: the
// ring's own tables (src/bench/ring.cpp), the context-parallel modes side by
// side (--cp-mode, src/bench/cp_modes.cpp) and packed documents (--docs,
// src/bench/ring_docs.cpp). Each runs over all ranks of the job (cp = world
// size) that the config describes (bench::open_job): runtime.comm's backend,
// buffers on runtime.backend's device.
#include <sstream>

#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/bench/cp_modes.hpp"
#include "trident/bench/engine.hpp"
#include "trident/bench/ring.hpp"
#include "trident/bench/ring_docs.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/parallel/cp/ring_attention.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

class BenchRingCommand : public Command {
 public:
  explicit BenchRingCommand(CLI::App* app) {
    app->add_option("config", config_path_,
                    "Config file (TOML): runtime.backend (the buffers' device) and runtime.comm "
                    "(the ring's backend); none: on the host, over MPI");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--seq-per-rank", seq_per_rank_, "Local tokens per rank, comma-separated");
    app->add_option(
        "--layout", layout_,
        "zigzag, contiguous or both (default); with --docs also docs, all (default) or a "
        "comma-separated list");
    app->add_flag("--causal", causal_, "Causal mask (default: full attention)");
    app->add_option("--heads", heads_, "Query heads");
    app->add_option("--kv-heads", kv_heads_, "Key/value heads (default: = heads)");
    app->add_option("--head-dim", head_dim_, "Head dimension");
    app->add_option("--iters", iters_, "Timed forward+backward iterations per case");
    app->add_flag("--baseline", baseline_,
                  "Also time the whole sequence on one rank (one-rank reference): on rank 0 "
                  "alone, and on every rank at once");
    app->add_flag("--serialize-compute", serialize_,
                  "Ranks take turns in their compute spans (a file lock around each), so that "
                  "with more ranks than cores every span is timed on a free core: compute and "
                  "balance are then the work's own; wall and overlap are not meaningful");
    app->add_option("--threads", threads_, "BLAS threads per rank");
    timeout_opt_ = app->add_option("--timeout", timeout_s_,
                                   "Deadline of any single wait, seconds (runtime.timeout_s)");
    app->add_option("--output", output_, "Write the tables to this HDF5 file");
    app->add_option("--cp-mode", cp_mode_,
                    "ring, ulysses, hybrid, or a comma-separated list of them: with ulysses or "
                    "hybrid in it, the modes are timed side by side (time, bytes per rank, "
                    "share of communication hidden)");
    app->add_option("--ulysses", ulysses_, "hybrid: Ulysses (all-to-all) group size u");
    app->add_option("--docs", docs_,
                    "Packed documents against full causal at equal tokens: document lengths "
                    "from lognormal[:MEAN[:SIGMA]] (default mean seq/8, sigma 1) or fixed:LEN");
    app->add_option("--docs-seed", docs_seed_, "--docs: seed of the document lengths");
    app->add_option("--docs-seeds", docs_seeds_,
                    "--docs: run this many seeds from --docs-seed on (the causal ring once) and "
                    "summarise them per layout");
    app->add_flag("--per-rank", per_rank_,
                  "--docs: also list every rank's modelled tile work next to its compute");
    app->add_option("--window", window_, "--docs: sliding window of both rings (0: off)");
  }

  bool needs_mpi() const override { return true; }
  int run() override;

 private:
  std::vector<cp::Layout> parse_layouts() const;
  std::vector<cp::Layout> check_flags();
  std::vector<CpMode> modes() const;
  void check_docs_flags(const std::vector<CpMode>& modes) const;
  bench::RingDocsOptions docs_options() const;
  bench::CpModesOptions modes_options(const std::vector<CpMode>& modes) const;
  bench::RingBenchOptions ring_options() const;

  std::string config_path_;
  std::vector<std::string> sets_;
  CLI::Option* timeout_opt_ = nullptr;
  std::string seq_per_rank_ = "1024,2048";
  std::string layout_;  // "": both, or all with --docs
  bool causal_ = false;
  bool baseline_ = false;
  bool serialize_ = false;
  int heads_ = 2;
  int kv_heads_ = 0;
  int head_dim_ = 64;
  int iters_ = 1;
  int threads_ = 1;
  double timeout_s_ = 600;
  std::string output_;
  std::string cp_mode_ = "ring";
  int ulysses_ = 2;
  std::string docs_;
  uint64_t docs_seed_ = 1;
  int docs_seeds_ = 1;
  bool per_rank_ = false;
  int64_t window_ = 0;
  std::vector<cp::Layout> layouts_;  // check_flags()'s
};

// --layout's comma-separated list (with --docs).
std::vector<cp::Layout> layout_list(const std::string& which) {
  std::vector<cp::Layout> layouts;
  std::stringstream list(which);
  for (std::string name; std::getline(list, name, ',');) {
    if (name != "zigzag" && name != "contiguous" && name != "docs")
      throw InputError("--layout " + which + ": '" + name + "' is not zigzag, contiguous or docs");
    layouts.push_back(cp::parse_layout(name));
  }
  return layouts;
}

// --layout's layouts: --docs compares all three unless told otherwise;
// "docs" needs documents to lay out.
std::vector<cp::Layout> BenchRingCommand::parse_layouts() const {
  const std::string which = layout_.empty() ? (docs_.empty() ? "both" : "all") : layout_;
  if (which == "both") return {cp::Layout::contiguous, cp::Layout::zigzag};
  if (which == "all" && !docs_.empty())
    return {cp::Layout::contiguous, cp::Layout::zigzag, cp::Layout::docs};
  if (which == "zigzag" || which == "contiguous" || (which == "docs" && !docs_.empty()))
    return {cp::parse_layout(which)};
  if (docs_.empty() || which.find(',') == std::string::npos)
    throw InputError("--layout " + which +
                     ": must be zigzag, contiguous or both (with --docs also docs, all, or a "
                     "comma-separated list of them)");
  return layout_list(which);
}

std::vector<cp::Layout> BenchRingCommand::check_flags() {
  std::vector<cp::Layout> layouts = parse_layouts();
  if (kv_heads_ == 0) kv_heads_ = heads_;
  if (heads_ < 1 || kv_heads_ < 1 || heads_ % kv_heads_ != 0)
    throw InputError("--heads " + std::to_string(heads_) + " --kv-heads " +
                     std::to_string(kv_heads_) + ": heads must be a positive multiple of kv-heads");
  if (head_dim_ < 1) throw InputError("--head-dim " + std::to_string(head_dim_) + ": must be >= 1");
  if (iters_ < 1) throw InputError("--iters " + std::to_string(iters_) + ": must be >= 1");
  if (threads_ < 1) throw InputError("--threads " + std::to_string(threads_) + ": must be >= 1");
  if (!(timeout_s_ > 0)) throw InputError("--timeout: must be > 0");
  for (int64_t t : parse_positive_list("--seq-per-rank", seq_per_rank_))
    if (t % 2 != 0)
      throw InputError("--seq-per-rank " + seq_per_rank_ + ": " + std::to_string(t) +
                       " is odd (a zig-zag rank holds two equal chunks)");
  return layouts;
}

// The --docs flags, before any rank starts.
void BenchRingCommand::check_docs_flags(const std::vector<CpMode>& modes) const {
  if (!docs_.empty() && (modes != std::vector<CpMode>{CpMode::ring} || baseline_ || serialize_))
    throw InputError(
        "--docs: runs the ring alone, without --cp-mode, --baseline and "
        "--serialize-compute");
  if (window_ < 0) throw InputError("--window " + std::to_string(window_) + ": must be >= 0");
  if (window_ > 0 && docs_.empty()) throw InputError("--window: only with --docs");
  if (docs_seeds_ < 1)
    throw InputError("--docs-seeds " + std::to_string(docs_seeds_) + ": must be >= 1");
  if ((docs_seeds_ > 1 || per_rank_) && docs_.empty())
    throw InputError(std::string(per_rank_ ? "--per-rank" : "--docs-seeds") + ": only with --docs");
  if (!docs_.empty())  // the lengths' syntax
    bench::document_lengths(docs_, 1, docs_seed_);
}

bench::RingDocsOptions BenchRingCommand::docs_options() const {
  bench::RingDocsOptions o;
  o.dist = docs_;
  o.seed = docs_seed_;
  o.seeds = docs_seeds_;
  o.per_rank = per_rank_;
  o.window = window_;
  o.layouts = layouts_;
  o.seq_per_rank = parse_positive_list("--seq-per-rank", seq_per_rank_);
  o.heads = heads_, o.kv_heads = kv_heads_, o.head_dim = head_dim_, o.iters = iters_;
  o.output = output_;
  o.command_line = command_line();
  return o;
}

bench::CpModesOptions BenchRingCommand::modes_options(const std::vector<CpMode>& modes) const {
  bench::CpModesOptions o;
  o.modes = modes;
  o.ulysses = ulysses_;
  o.layouts = layouts_;
  o.seq_per_rank = parse_positive_list("--seq-per-rank", seq_per_rank_);
  o.causal = causal_;
  o.heads = heads_, o.kv_heads = kv_heads_, o.head_dim = head_dim_, o.iters = iters_;
  o.output = output_;
  o.command_line = command_line();
  return o;
}

bench::RingBenchOptions BenchRingCommand::ring_options() const {
  bench::RingBenchOptions o;
  o.layouts = layouts_;
  o.seq_per_rank = parse_positive_list("--seq-per-rank", seq_per_rank_);
  o.causal = causal_, o.baseline = baseline_, o.serialize = serialize_;
  o.heads = heads_, o.kv_heads = kv_heads_, o.head_dim = head_dim_, o.iters = iters_;
  o.timeout_s = timeout_s_;
  o.output = output_;
  o.command_line = command_line();
  return o;
}

std::vector<CpMode> BenchRingCommand::modes() const {
  std::vector<CpMode> modes;
  for (const std::string& name : split_list("--cp-mode", cp_mode_)) {
    const auto m = parse_config_name<CpMode>(name);
    if (!m)
      throw InputError("--cp-mode " + cp_mode_ + ": '" + name +
                       "' is not one of ring, ulysses, hybrid");
    modes.push_back(*m);
  }
  if (modes.empty()) throw InputError("--cp-mode: names no mode");
  return modes;
}

int BenchRingCommand::run() {
  layouts_ = check_flags();
  const std::vector<CpMode> cp_modes = modes();
  kernels::set_blas_threads(threads_);
  check_docs_flags(cp_modes);
  const bool side_by_side = cp_modes != std::vector<CpMode>{CpMode::ring};
  if (side_by_side && (baseline_ || serialize_))
    throw InputError("--cp-mode " + cp_mode_ +
                     ": --baseline and --serialize-compute belong to the ring's own tables");
  Config cfg = load_config(config_path_, sets_);
  if (timeout_opt_->count()) cfg.runtime.timeout_s = timeout_s_;
  timeout_s_ = cfg.runtime.timeout_s;
  train::check_config(cfg, comm_world_size());
  if (!docs_.empty()) return bench::run_ring_docs(cfg, docs_options());
  if (side_by_side) return bench::run_cp_modes(cfg, modes_options(cp_modes));
  return bench::run_ring_bench(cfg, ring_options());
}

}  // namespace

std::unique_ptr<Command> add_bench_ring(CLI::App& parent) {
  auto* app = parent.add_subcommand("ring", "Ring attention balance and overlap per rank (mpirun)");
  return std::make_unique<BenchRingCommand>(app);
}
}  // namespace trident::cli
