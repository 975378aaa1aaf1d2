// `trident bench ring --docs DIST`: the ring with packed documents against
// the full causal ring at the same tokens (see src/bench/ring_docs.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"

namespace trident::bench {

struct RingDocsOptions {
  std::string dist;   // "lognormal[:MEAN[:SIGMA]]" or "fixed:LEN" (document lengths)
  uint64_t seed = 1;  // of the document lengths: seeds seed .. seed + seeds - 1
  int seeds = 1;
  bool per_rank = false;  // also a table of every rank's modelled tile work and time
  int64_t window = 0;     // model.window for both rings (0: off)
  std::vector<CpLayout> layouts;
  std::vector<int64_t> seq_per_rank;
  int heads = 2, kv_heads = 2, head_dim = 64, iters = 1;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Document lengths filling seq exactly, drawn from dist with seed (the last
// one cut to fit). Throws InputError naming --docs when dist is malformed.
std::vector<int64_t> document_lengths(const std::string& dist, int64_t seq, uint64_t seed);

// Runs every (seq, layout) case on all ranks of the job cfg describes (cp =
// world size; bench::open_job: the ring on runtime.comm's backend, buffers on
// runtime.backend's device): the causal ring once and the packed ring for
// every seed, forward+backward; prints the tables on rank 0 (with several seeds a summary per
// layout: median, min and max of the speedup and the imbalances) and writes them to opt.output.
// Collective over MPI's world; cfg already checked. Returns the exit code: 1 when a spot-checked
// row is wrong.
int run_ring_docs(const Config& cfg, const RingDocsOptions& opt);

}  // namespace trident::bench
