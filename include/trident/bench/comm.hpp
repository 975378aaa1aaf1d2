// `trident bench comm`: the collectives and a send/recv ring through
// trident::Communicator, nccl-tests style: a table of cases (one per
// operation, element type and reduction), a doubling size sweep, every size
// checked element by element against the known result (#wrong), algbw and
// busbw. The buffers are Tensors on the run's device (runtime.backend: host
// memory on the CPU, device memory on CUDA), the groups on runtime.comm's
// backend, as `trident run` makes them: MPI, MPI staging device buffers
// through the host, or NCCL. Operations with an in-place form (the
// all-reduces) are measured out of place and in place.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "trident/core/config.hpp"

namespace trident::bench {

struct CommBenchOptions {
  // world (every rank as one group), cp, pp, dp, dpcp, ep: every group of that kind at once
  std::string group = "world";
  std::string ops = "allreduce,allgather,alltoall,sendrecv";
  std::string dtypes = "float";    // the all-reduce's element types (nccl-tests' -d)
  std::string reduce_ops = "sum";  // the all-reduce's reductions (nccl-tests' -o)
  std::string min_bytes = "8", max_bytes = "16M";
  int iters = 20, warmup = 5;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Throws InputError (one line naming the flag) for a bad option; collective
// otherwise. Prints the tables and the verdict on rank 0; returns the exit
// code (1 when any element differs from the expected result).
int run_comm_bench(const Config& cfg, const CommBenchOptions& opt);

}  // namespace trident::bench
