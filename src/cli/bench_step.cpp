// `trident bench step`: the flags of the training step benchmark
// (src/bench/step.cpp measures; trident/bench/step.hpp says what).
#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/bench/step.hpp"
#include "trident/core/config.hpp"

namespace trident::cli {
namespace {

class BenchStepCommand : public Command {
 public:
  explicit BenchStepCommand(CLI::App* app) {
    app->add_option("config", config_path_, "Config file (TOML) of a one-rank model")->required();
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--precision", precisions_,
                    "Variants, comma-separated: fp32, bf16 (TRIDENT_CPU_BF16's CPU path), "
                    "bf16_staged, bf16_native (that CPU path, alternating in one process)");
    app->add_option("--steps", o_.steps, "Timed steps per variant (after one untimed step)");
    app->add_option("--threads", o_.threads, "BLAS threads");
    app->add_option("--output", o_.output, "Write the table to this HDF5 file");
  }

  bool needs_mpi() const override { return false; }

  int run() override {
    const Config cfg = load_config(config_path_, sets_);
    o_.precisions = split_list("--precision", precisions_);
    o_.command_line = command_line();
    return bench::run_step_bench(cfg, o_);
  }

 private:
  std::string config_path_, precisions_ = "fp32,bf16";
  std::vector<std::string> sets_;
  bench::StepBenchOptions o_;
};

}  // namespace

std::unique_ptr<Command> add_bench_step(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "step",
      "Training step of a one-rank model in fp32 and bf16 (staged, native), alternating "
      "(one process)");
  return std::make_unique<BenchStepCommand>(app);
}
}  // namespace trident::cli
