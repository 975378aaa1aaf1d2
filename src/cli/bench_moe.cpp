// `trident bench moe`: placeholder until its issue lands; owned by that issue.
#include "commands.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {
class Pending : public Command {
 public:
  bool needs_mpi() const override { return true; }
  int run() override { throw Error("'trident bench moe' is not implemented yet"); }
};
}  // namespace

std::unique_ptr<Command> add_bench_moe(CLI::App& parent) {
  parent.add_subcommand("moe", "MoE dispatch/combine vs raw all-to-all-v (mpirun)");
  return std::make_unique<Pending>();
}
}  // namespace trident::cli
