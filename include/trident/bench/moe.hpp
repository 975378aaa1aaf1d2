// `trident bench moe`: MoE dispatch and combine through TokenDispatcher (ep =
// all ranks), with each transport (alltoallv, shm), against a plain MPI
// all-to-all-v of the same bytes in the same run, for balanced and skewed
// routing, the time split into count exchange, permute, transfer, expert
// compute and combine; a verified pass first (#wrong: combined elements and
// the ep counters' bytes). src/bench/moe.cpp says how.
#pragma once
#include <string>

namespace trident::bench {

struct MoeBenchOptions {
  long long hidden = 1024, tokens = 4096, experts = 8, top_k = 2;
  long long ffn = 0;              // expert SwiGLU hidden size; 0: identity experts
  std::string transport = "all";  // alltoallv, shm, or all
  int iters = 5, warmup = 1;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Collective over MPI's world; throws InputError naming the flag for a bad
// value. Prints the tables and the verdict on rank 0; returns the exit code.
int run_moe_bench(const MoeBenchOptions& opt);

}  // namespace trident::bench
