// `trident bench ring`: placeholder until its issue lands; owned by that issue.
#include "commands.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {
class Pending : public Command {
 public:
  bool needs_mpi() const override { return true; }
  int run() override { throw Error("'trident bench ring' is not implemented yet"); }
};
}  // namespace

std::unique_ptr<Command> add_bench_ring(CLI::App& parent) {
  parent.add_subcommand("ring", "Ring attention balance and overlap per rank (mpirun)");
  return std::make_unique<Pending>();
}
}  // namespace trident::cli
