// `trident bench ring --cp-mode ...`: the three context-parallel modes side by
// side on the same sequence (see src/bench/cp_modes.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"

namespace trident::bench {

struct CpModesOptions {
  std::vector<CpMode> modes;
  int ulysses = 2;  // hybrid's Ulysses group size
  std::vector<CpLayout> layouts;
  std::vector<int64_t> seq_per_rank;
  bool causal = false;
  int heads = 2, kv_heads = 2, head_dim = 64, iters = 1;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Runs every (seq, layout, mode) case on all ranks of the job cfg describes
// (cp = world size; bench::open_job: the modes on runtime.comm's backend,
// buffers on runtime.backend's device), prints the table on rank 0, writes
// it to opt.output. Collective over MPI's world; cfg already checked; a mode
// the heads or cp do not allow is an InputError before any rank
// communicates. Returns the exit code: 1 when a spot-checked row is wrong.
int run_cp_modes(const Config& cfg, const CpModesOptions& opt);

}  // namespace trident::bench
