// train::run: the training job on this process's ranks, after the command
// line has been parsed, the config checked and the mesh mapped.
//
// Resumes when asked (--resume [CKPT]) or after a Slurm requeue
// (SLURM_RESTART_COUNT > 0), creates the run file only once every input is
// valid, runs the steps with a progress line on world rank 0, writes the run
// file every step, checkpoints every output.checkpoint_every steps, at the end
// and when SIGUSR1/SIGTERM arrives on any rank (all ranks agree at the next
// step boundary, write the checkpoint and return 0), and ends with a summary
// of where the ranks' time went. Collective over comms.world.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "trident/core/config.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

struct RunRequest {
  std::string config_path;   // for the banner
  bool resume = false;       // --resume given
  std::string resume_from;   // its checkpoint; empty: the latest in output.checkpoint_dir
  std::string command_line;  // recorded in the run file
  // The planner's prediction of this mesh (JSON, `trident run --machine`),
  // recorded as the root attribute "prediction"; empty: none.
  std::string prediction_json;
};

// Device tensors that reach an MPI group of c travel through host copies on
// ctx's device (the "staged" MPI backend; a device backend, NCCL, moves them
// itself and ignores this). make_trainer and the benchmarks call it.
void stage_device_buffers(Communicators& c, const kernels::Ctx& ctx, double timeout_s);

// The groups of c as a Trainer takes them (this rank's pp and dp coordinates
// and its local rank with them): make_trainer's, and the tests'.
TrainComms train_comms(const Communicators& c);

// The Trainer of this rank, its communicators set up for its device (device
// tensors reaching MPI go through host copies; device communication follows
// the Trainer's compute stream).
std::unique_ptr<Trainer> make_trainer(const Config& cfg, Communicators& comms);
// Loads `checkpoint` on every rank; the ranks agree on the outcome. Returns
// the checkpoint's steps done; InputError "--checkpoint: why" on every rank.
int64_t load_checkpoint_everywhere(Trainer& trainer, const std::string& checkpoint);

// cfg: checked (train::check_config) against comms' world. Returns the exit
// code (0); errors are exceptions (InputError: exit 2, before the run file).
int run(const Config& cfg, Communicators& comms, const RunRequest& request);

// `trident eval`: a checkpoint loaded into this mesh, its loss on eval.steps
// global batches of the validation data (the validation share of data.split
// or eval.token_file / eval.prefix). The same on every rank and on every mesh
// (the mean over the same targets). Collective over comms.world; InputError
// for a checkpoint of another model or damaged, or missing validation data.
struct EvalReport {
  int64_t step = 0;  // the checkpoint's steps done
  double loss = 0, perplexity = 0;
  int64_t targets = 0, sequences = 0;
};
EvalReport evaluate_checkpoint(const Config& cfg, Communicators& comms,
                               const std::string& checkpoint);

}  // namespace trident::train
