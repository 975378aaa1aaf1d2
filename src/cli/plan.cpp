// `trident plan`: placeholder until its issue lands; owned by that issue.
#include "commands.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {
class Pending : public Command {
 public:
  bool needs_mpi() const override { return false; }
  int run() override { throw Error("'trident plan' is not implemented yet"); }
};
}  // namespace

std::unique_ptr<Command> add_plan_command(CLI::App& parent) {
  parent.add_subcommand("plan", "Map a config onto a cluster shape without launching");
  return std::make_unique<Pending>();
}
}  // namespace trident::cli
