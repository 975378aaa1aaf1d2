// Saving and restoring a Trainer through io/checkpoint.hpp, and the signals
// that ask a run to stop at the next step boundary.
//
// Each tensor is written by one owner (dense parameters and router biases by
// dp x cp rank 0 of their stage, experts by replica rank 0), and read back by
// every rank that holds it, so a checkpoint restores into any mesh of the same
// model. The data position is the step: samples are keyed by it. With a
// sharded optimizer (train.optimizer_sharding = "dp") the moment shards are
// gathered before the write and a load keeps this rank's shard, so a
// checkpoint does not depend on the sharding either.
#pragma once
#include <string>
#include <vector>

#include "trident/io/checkpoint.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

// Collective. steps_done: steps completed (the resumed run starts there).
std::string save_checkpoint(Trainer& t, int64_t steps_done);

// Every rank reads its tensors; returns the step to continue from. InputError
// if the checkpoint belongs to another model (model hash) or is damaged.
int64_t load_checkpoint(Trainer& t, const std::string& path);
// The shard files (names in the index's directory) that load_checkpoint
// reads on this rank from the sharded checkpoint index_path, sorted; none
// for a single file (the local tier's restore fetches only these to a node).
std::vector<std::string> checkpoint_shards_read(Trainer& t, const std::string& index_path);

// SIGUSR1 / SIGTERM set a flag (nothing else happens in the handler).
void install_stop_signals();
// The signal number received so far on this rank (0: none).
int stop_signal_received();
// Test hook: behave as if `sig` had arrived.
void raise_stop_flag(int sig);

}  // namespace trident::train
