// `trident eval CONFIG.toml --checkpoint CKPT [--tokens FILE --logits-out OUT.h5]
// [--set k=v ...]`, on any mesh: one process, or under mpirun/srun with the
// mesh of [parallel].
//   without --tokens: the loss and perplexity of the checkpoint on the
//     validation data of CONFIG ([eval] and data.split);
//   with --tokens FILE --logits-out OUT.h5: the logits and per-token losses
//     of the sequences of FILE, written by world rank 0 into OUT.h5
//     (train/eval_logits.hpp). The run config's [model] must match the
//     checkpoint's, except for the RoPE keys (context extension).
// Each mode of the command is one method of EvalCommand, so a new output
// (another flag) adds a method and a branch in run().
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"
#include "trident/train/eval_logits.hpp"
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
    app->add_option("--tokens", tokens_,
                    "Flat token file (data.token_dtype): consecutive sequences of data.seq_len "
                    "tokens, each followed by its next token; needs --logits-out");
    app->add_option("--logits-out", logits_out_,
                    "HDF5 file for the logits and per-token losses of --tokens");
  }
  bool needs_mpi() const override { return true; }
  int run() override;

 private:
  // The validation loss of the checkpoint, printed by world rank 0.
  int validation_loss(const Config& cfg, Communicators& comms);
  // The logits of --tokens: cfg's data replaced by the file, read in order.
  static void use_token_file(Config& cfg, const std::string& tokens);

  std::string config_, checkpoint_, tokens_, logits_out_;
  std::vector<std::string> sets_;
};

void EvalCommand::use_token_file(Config& cfg, const std::string& tokens) {
  cfg.data.task = DataTask::tokens;
  cfg.data.format = DataFormat::flat;
  cfg.data.token_file = tokens;
  cfg.data.prefix.clear();
  cfg.data.blend.clear();
  cfg.data.split = DataConfig{}.split;
  cfg.data.packing = Packing::none;
  cfg.data.eod_token = -1;
  cfg.eval = EvalConfig{};
}

int EvalCommand::run() {
  if (tokens_.empty() != logits_out_.empty())
    throw InputError(tokens_.empty() ? "--logits-out needs --tokens FILE (the sequences)"
                                     : "--tokens needs --logits-out OUT.h5 (where the logits go)");
  const bool logits = !tokens_.empty();
  const int world_size = comm_world_size();
  kernels::set_blas_threads(1);  // the ranks share the cores
  Config cfg = load_config(config_, sets_);
  if (logits) use_token_file(cfg, tokens_);
  train::check_config(cfg, world_size);
  if (!logits && cfg.data.task != DataTask::tokens)
    throw InputError(config_ +
                     ": trident eval measures the loss on validation token data: "
                     "data.task = \"tokens\" (got \"" +
                     config_name(cfg.data.task) + "\"), or give --tokens and --logits-out");
  if (!logits && cfg.eval.uses_split() && data_split_shares(cfg.data.split)[1] <= 0)
    throw InputError(config_ +
                     ": trident eval needs validation data: a validation share in data.split "
                     "(e.g. \"98,2\") or eval.token_file / eval.prefix");
  auto job = world_communicator(cfg.runtime.timeout_s);
  Topology topo = detect_topology(*job, cfg);
  auto comms = build_communicators(*job, cfg, std::move(topo));
  if (logits) return train::eval_logits(cfg, *comms, checkpoint_, logits_out_);
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
      "eval",
      "Validation loss and perplexity of a checkpoint, or with --tokens/--logits-out the "
      "logits of given sequences (one process or mpirun/srun)");
  return std::make_unique<EvalCommand>(app);
}

}  // namespace trident::cli
