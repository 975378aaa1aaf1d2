// `trident bench schedule`: the pipeline executor under mpirun (-np PP) with
// synthetic stage work of given durations; per schedule the measured bubble
// next to the simulator's prediction (zero latency, and the hop latency
// measured in this run) and the closed form, the peak in-flight activations
// and the executor's overhead per action; verified boundary data (#wrong).
// src/bench/schedule.cpp says how each figure is measured.
#pragma once
#include <cstdint>
#include <string>

#include "trident/core/config.hpp"

namespace trident::bench {

struct ScheduleBenchOptions {
  std::string schedule =
      "all";               // all | afab (gpipe) | 1f1b | interleaved | zb-h1 | zb-v | dualpipev
  int pp = 0, m = 0;       // pipeline ranks (= world size), micro-batches
  int vpp = 2;             // the interleaved schedule's chunks per rank
  bool vpp_given = false;  // --vpp was on the command line
  double tf_ms = 0, tb_ms = 0, tw_ms = 0;  // a rank's share of the model per micro-batch
  int steps = 6;          // bubbles averaged over 6 steps: 2 left a run-to-run spread of +-0.7 pp
  int64_t bytes = 65536;  // of each activation / gradient message
  bool spin = false;      // spin instead of sleeping
  double timeout_s = 60;
  double recv_poll_ms = 0;   // a receive's yielding poll before the sleeping backoff
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Collective over MPI's world, on the job cfg describes (bench::open_job:
// the messages on runtime.comm's backend, the boundary buffers on
// runtime.backend's device; cfg already checked); throws InputError naming
// the flag for a bad value before any rank communicates. Prints the tables
// and the verdict on rank 0; returns the exit code (1: a boundary value
// arrived wrong).
int run_schedule_bench(const Config& cfg, const ScheduleBenchOptions& opt);

}  // namespace trident::bench
