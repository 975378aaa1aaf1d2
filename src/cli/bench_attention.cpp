// `trident bench attention`: placeholder until its issue lands; owned by that issue.
#include "commands.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {
class Pending : public Command {
 public:
  bool needs_mpi() const override { return false; }
  int run() override { throw Error("'trident bench attention' is not implemented yet"); }
};
}  // namespace

std::unique_ptr<Command> add_bench_attention(CLI::App& parent) {
  parent.add_subcommand("attention", "CPU attention kernel GFLOP/s next to sgemm (one rank)");
  return std::make_unique<Pending>();
}
}  // namespace trident::cli
