// `trident eval CONFIG.toml --checkpoint CKPT [--set k=v ...]`: the loss and
// perplexity of a checkpoint on the validation data of CONFIG ([eval] and
// data.split), on any mesh: one process, or under mpirun/srun with the mesh
// of [parallel]. Each mode of the command is one method of EvalCommand, so a
// new output (another flag) adds a method and a branch in run().
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"
#include "trident/train/run.hpp"

namespace trident::cli {
namespace {

class EvalCommand : public Command {
 public:
  explicit EvalCommand(CLI::App* app) {
    app->add_option("config", config_, "Config file (TOML): the model, mesh and validation data")
        ->required();
    app->add_option("--checkpoint", checkpoint_, "Checkpoint file (HDF5) to evaluate")->required();
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)");
  }
  bool needs_mpi() const override { return true; }
  int run() override;

 private:
  // The validation loss of the checkpoint, printed by world rank 0.
  int validation_loss(const Config& cfg, Communicators& comms);

  std::string config_, checkpoint_;
  std::vector<std::string> sets_;
};

int EvalCommand::run() {
  const int world_size = comm_world_size();
  kernels::set_blas_threads(1);  // the ranks share the cores
  Config cfg = load_config(config_, sets_);
  train::check_config(cfg, world_size);
  if (cfg.data.task != DataTask::tokens)
    throw InputError(config_ +
                     ": trident eval measures the loss on validation token data: "
                     "data.task = \"tokens\" (got \"" +
                     config_name(cfg.data.task) + "\")");
  if (cfg.eval.uses_split() && data_split_shares(cfg.data.split)[1] <= 0)
    throw InputError(config_ +
                     ": trident eval needs validation data: a validation share in data.split "
                     "(e.g. \"98,2\") or eval.token_file / eval.prefix");
  auto job = world_communicator(cfg.runtime.timeout_s);
  Topology topo = detect_topology(*job, cfg);
  auto comms = build_communicators(*job, cfg, std::move(topo));
  return validation_loss(cfg, *comms);
}

int EvalCommand::validation_loss(const Config& cfg, Communicators& comms) {
  const train::EvalReport r = train::evaluate_checkpoint(cfg, comms, checkpoint_);
  if (comms.world->rank() == 0) {
    std::printf(
        "trident eval: %s (step %lld) on %d ranks (pp=%d dp=%d cp=%d ep=%d): validation loss "
        "%.6f, perplexity %.4f over %lld targets (%lld sequences of %d tokens)\n",
        checkpoint_.c_str(), static_cast<long long>(r.step), comms.world->size(), comms.mesh.pp,
        comms.mesh.dp, comms.mesh.cp, comms.mesh.ep, r.loss, r.perplexity,
        static_cast<long long>(r.targets), static_cast<long long>(r.sequences), cfg.data.seq_len);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

std::unique_ptr<Command> add_eval_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "eval", "Validation loss and perplexity of a checkpoint (one process or mpirun/srun)");
  return std::make_unique<EvalCommand>(app);
}

}  // namespace trident::cli
