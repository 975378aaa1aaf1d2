// `trident bench attention`: GFLOP/s of the CPU flash-attention kernel,
// forward and forward+backward, next to OpenBLAS sgemm measured just before
// each row in the same process (the practical ceiling, and a guard against a
// machine whose load changes during the run). One process, no MPI.
//
// Every row's forward output is spot-checked against the fp64 definition on
// a few query rows; rows off by more than 1e-4 are counted in #wrong and make
// the exit code 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace trident::bench {

struct AttentionBenchOptions {
  std::vector<int64_t> seqs, head_dims;  // one row per (mask, head_dim, seq)
  std::vector<bool> causal;              // the masks: false full, true causal
  int heads = 1, threads = 1, reps = 1;
  int64_t sgemm_n = 2048;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Throws InputError naming the flag for a bad value; prints the table and the
// verdict; returns the exit code.
int run_attention_bench(const AttentionBenchOptions& opt);

}  // namespace trident::bench
