// `trident bench moe`: MoE dispatch and combine through TokenDispatcher (ep =
// all ranks), with each transport (alltoallv, shm), against a plain
// all-to-all-v of the same bytes on the same group in the same run, for
// balanced and skewed routing, the time split into count exchange, permute,
// transfer, expert compute and combine; a verified pass first (#wrong: combined elements and
// the ep counters' bytes). src/bench/moe.cpp says how.
#pragma once
#include <string>

#include "trident/core/config.hpp"

namespace trident::bench {

struct MoeBenchOptions {
  long long hidden = 1024, tokens = 4096, experts = 8, top_k = 2;
  long long ffn = 0;              // expert SwiGLU hidden size; 0: identity experts
  std::string transport = "all";  // alltoallv, shm, or all
  int iters = 5, warmup = 1;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Collective over MPI's world, on the job cfg describes (bench::open_job:
// ep = every rank on runtime.comm's backend, the buffers on runtime.backend's
// device, where shm is not offered: its windows are host memory; cfg
// already checked); throws InputError naming the flag for a bad value
// before any rank communicates. Prints the tables and the verdict on rank 0;
// returns the exit code (1: a wrong element or byte count).
int run_moe_bench(const Config& cfg, const MoeBenchOptions& opt);

}  // namespace trident::bench
