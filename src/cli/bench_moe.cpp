// `trident bench moe`: the flags of the MoE dispatch/combine benchmark
// (src/bench/moe.cpp measures; trident/bench/moe.hpp says what).
#include "commands.hpp"
#include "trident/bench/moe.hpp"

namespace trident::cli {
namespace {

class BenchMoeCommand : public Command {
 public:
  explicit BenchMoeCommand(CLI::App* app) {
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
    o_.command_line = command_line();
    return bench::run_moe_bench(o_);
  }

 private:
  bench::MoeBenchOptions o_;
};

}  // namespace

std::unique_ptr<Command> add_bench_moe(CLI::App& parent) {
  auto* app = parent.add_subcommand("moe", "MoE dispatch/combine vs raw all-to-all-v (mpirun)");
  return std::make_unique<BenchMoeCommand>(app);
}
}  // namespace trident::cli
