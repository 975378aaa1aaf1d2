// `trident bench moe`: the flags of the MoE dispatch/combine benchmark
// (src/bench/moe.cpp measures; trident/bench/moe.hpp says what).
#include "commands.hpp"
#include "trident/bench/moe.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

class BenchMoeCommand : public Command {
 public:
  explicit BenchMoeCommand(CLI::App* app) {
    app->add_option("config", config_path_,
                    "Config file (TOML): runtime.backend (the buffers' device) and runtime.comm "
                    "(the ep group's backend; ep = every rank); none: on the host, over MPI");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--hidden", o_.hidden, "Hidden size d (floats per token row)");
    app->add_option("--tokens", o_.tokens, "Tokens per rank");
    app->add_option("--experts", o_.experts, "Experts (a multiple of the number of ranks)");
    app->add_option("--top-k", o_.top_k, "Experts per token");
    app->add_option("--ffn", o_.ffn, "Expert SwiGLU hidden size; 0: identity experts (no compute)");
    app->add_option("--iters", o_.iters, "Timed iterations per routing");
    app->add_option("--warmup", o_.warmup, "Untimed iterations per routing");
    app->add_option(
           "--transport", o_.transport,
           "Token exchange: alltoallv, shm, or all (both; shm where the ranks share a node)")
        ->check(CLI::IsMember({"alltoallv", "shm", "all"}));
    app->add_option("--output", o_.output, "Write the tables to this HDF5 file");
  }
  bool needs_mpi() const override { return true; }

  int run() override {
    Config cfg = load_config(config_path_, sets_);
    train::check_config(cfg, comm_world_size());
    o_.command_line = command_line();
    return bench::run_moe_bench(cfg, o_);
  }

 private:
  std::string config_path_;
  std::vector<std::string> sets_;
  bench::MoeBenchOptions o_;
};

}  // namespace

std::unique_ptr<Command> add_bench_moe(CLI::App& parent) {
  auto* app = parent.add_subcommand("moe", "MoE dispatch/combine vs raw all-to-all-v (mpirun)");
  return std::make_unique<BenchMoeCommand>(app);
}
}  // namespace trident::cli
