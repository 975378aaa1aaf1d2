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
// config. bf16 runs the CPU bf16 path TRIDENT_CPU_BF16 chooses (auto: native
// on AVX512-BF16, else staged); bf16_staged and bf16_native run that path,
// chosen before each of the variant's steps (kernels::set_cpu_bf16_path), so
// that staged and native alternate in one process. The table names each
// variant's path. The config must be one rank's (parallel.pp, cp, ep = 1 and
// a topology of one device, if any): else one line, InputError.
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
  // each variant: fp32, bf16 (TRIDENT_CPU_BF16's path), bf16_staged, bf16_native
  std::vector<std::string> precisions{"fp32", "bf16"};
  int steps = 4;             // timed steps per variant
  int threads = 1;           // BLAS threads
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// cfg: loaded; checked here for one rank. Throws InputError naming the flag
// or key for a bad value (before measuring); prints the table and the
// verdict; returns the exit code.
int run_step_bench(const Config& cfg, const StepBenchOptions& opt);

}  // namespace trident::bench
