// `trident bench ring`: ring attention over all ranks of the job (cp = world
// size), forward + backward, per layout and local sequence length: per-rank,
// per-case and per-step-kind tables (src/bench/ring.cpp says what each
// measures). The modes side by side (--cp-mode) are trident/bench/cp_modes.hpp,
// packed documents (--docs) trident/bench/ring_docs.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"

namespace trident::bench {

struct RingBenchOptions {
  std::vector<CpLayout> layouts;
  std::vector<int64_t> seq_per_rank;  // local tokens, even
  bool causal = false;
  bool baseline = false;   // also the one-rank reference (alone on rank 0, and on every rank)
  bool serialize = false;  // ranks take turns in their compute spans (a file lock)
  int heads = 2, kv_heads = 2, head_dim = 64, iters = 1;
  double timeout_s = 600;    // deadline of the compute lock (runtime.timeout_s)
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Runs every (seq, layout) case on all ranks of the job cfg describes (cp =
// world size; the ring on runtime.comm's backend, buffers on runtime.backend's
// device: bench::open_job); prints the tables and the verdict on rank 0,
// writes the file. Collective over MPI's world; cfg already checked. Returns
// the exit code: 1 when a spot-checked row is wrong.
int run_ring_bench(const Config& cfg, const RingBenchOptions& opt);

}  // namespace trident::bench
