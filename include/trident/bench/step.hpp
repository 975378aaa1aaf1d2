// `trident bench step`: the training step of a config's model on one rank, in
// each precision asked for (train.precision fp32 and bf16), by the CPU time of
// the process and by wall time per step, as GFLOP/s of the model's FLOPs
// (model/flops.hpp, the planner's count) and as a ratio to the first
// precision's step. One process, no MPI.
//
// The variants are built side by side (one Trainer each, from the same
// config and seed) and alternate step by step after one untimed step each, so
// that a change of the host's load touches them alike; each still runs steps
// 0, 1, ... N in order, so its losses are those of `trident run` on the same
// config. bf16 runs whatever the CPU's bf16 path is in this process (native on
// AVX512-BF16, else staged; TRIDENT_CPU_BF16 picks it for the whole process:
// the path is a process setting of the kernels, so staged and native are two
// runs), named in the table.
//
// Checked: every step's loss and gradient norm are finite and its update
// applied (the trainer's guard); a step that is not counts in #wrong and
// makes the exit code 1. The loss of the last step is reported beside the
// first variant's; how close bf16 must be is train_bf16_native's test, not
// this benchmark's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/config.hpp"

namespace trident::bench {

struct StepBenchOptions {
  std::vector<std::string> precisions{"fp32", "bf16"};  // train.precision of each variant
  int steps = 4;                                        // timed steps per variant
  int threads = 1;                                      // BLAS threads
  std::string output;                                   // HDF5 file, "" none
  std::string command_line;                             // recorded in the file
};

// cfg: loaded; checked here for one rank. Throws InputError naming the flag
// or key for a bad value (before measuring); prints the table and the
// verdict; returns the exit code.
int run_step_bench(const Config& cfg, const StepBenchOptions& opt);

}  // namespace trident::bench
