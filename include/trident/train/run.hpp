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
#include <string>

#include "trident/core/config.hpp"
#include "trident/topo/topology.hpp"

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

// cfg: checked (train::check_config) against comms' world. Returns the exit
// code (0); errors are exceptions (InputError: exit 2, before the run file).
int run(const Config& cfg, Communicators& comms, const RunRequest& request);

}  // namespace trident::train
