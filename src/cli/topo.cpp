// `trident topo`: placeholder until its issue lands; owned by that issue.
#include "commands.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {
class Pending : public Command {
 public:
  bool needs_mpi() const override { return true; }
  int run() override { throw Error("'trident topo' is not implemented yet"); }
};
}  // namespace

std::unique_ptr<Command> add_topo_command(CLI::App& parent) {
  parent.add_subcommand("topo", "Print the detected topology and rank mapping (under mpirun/srun)");
  return std::make_unique<Pending>();
}
}  // namespace trident::cli
