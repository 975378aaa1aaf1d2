// `trident bench comm`: the flags of the communication benchmark
// (src/bench/comm.cpp measures; trident/bench/comm.hpp says what).
#include "commands.hpp"
#include "trident/bench/comm.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

class BenchCommCommand : public Command {
 public:
  explicit BenchCommCommand(CLI::App* app) {
    app->add_option("config", config_path_,
                    "Config file (TOML): --group's mesh, runtime.backend (the buffers' device) "
                    "and runtime.comm (the groups' backend); none: world only, on the host");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--group", o_.group,
                    "Communicator to measure: world, cp, pp, dp, dpcp, ep (all groups at once)");
    app->add_option("--ops", o_.ops,
                    "Comma-separated: allreduce,allgather,alltoall,sendrecv (default), "
                    "allreduce_ordered,reduce_scatter_ordered (rank-ordered float sums)");
    app->add_option("--dtypes", o_.dtypes,
                    "allreduce's element types, comma-separated: float (default), double, int32, "
                    "int64");
    app->add_option("--reduce-ops", o_.reduce_ops,
                    "allreduce's reductions, comma-separated: sum (default), max, min");
    app->add_option("--min-bytes", o_.min_bytes, "Smallest size (e.g. 8, 64K)");
    app->add_option("--max-bytes", o_.max_bytes, "Largest size (e.g. 16M)");
    app->add_option("--iters", o_.iters, "Timed iterations per size");
    app->add_option("--warmup", o_.warmup, "Untimed iterations per size");
    app->add_option("--output", o_.output, "Write the tables to this HDF5 file");
  }

  bool needs_mpi() const override { return true; }

  int run() override {
    Config cfg = load_config(config_path_, sets_);
    train::check_config(cfg, comm_world_size());
    o_.command_line = command_line();
    return bench::run_comm_bench(cfg, o_);
  }

 private:
  std::string config_path_;
  std::vector<std::string> sets_;
  bench::CommBenchOptions o_;
};

}  // namespace

std::unique_ptr<Command> add_bench_comm(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "comm", "Collective and point-to-point bandwidth per communicator (mpirun)");
  return std::make_unique<BenchCommCommand>(app);
}
}  // namespace trident::cli
