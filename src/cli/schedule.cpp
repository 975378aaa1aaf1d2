// `trident schedule`: placeholder until its issue lands; owned by that issue.
#include "commands.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {
class Pending : public Command {
 public:
  bool needs_mpi() const override { return false; }
  int run() override { throw Error("'trident schedule' is not implemented yet"); }
};
}  // namespace

std::unique_ptr<Command> add_schedule_command(CLI::App& parent) {
  parent.add_subcommand("schedule", "Generate, export, import and simulate pipeline schedules");
  return std::make_unique<Pending>();
}
}  // namespace trident::cli
