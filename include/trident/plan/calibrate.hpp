// Calibration: short benchmarks on the machine a job runs on, turned into a
// machine profile (see machine.hpp). Run by `trident plan CONFIG --calibrate
// --out FILE` under mpirun/srun with as many ranks per node as a run uses.
//
// Benchmarks (each repeated for about `seconds` and timed by its median):
//  - GEMM rate: the config's largest FFN product [T, d] x [d, f] (T tokens of
//    one micro-batch), on one rank alone while the others sleep, and on every
//    rank at once; their ratio tells how many ranks of a node the cores
//    actually run at once (cores_per_node);
//  - attention rate: causal forward and backward of one micro-batch's
//    sequence with the config's heads, FLOPs counted as the cost model does;
//  - memory-bound rate: residual adds over one micro-batch's hidden states;
//  - point to point: ping-pong between world ranks 0 and 1 (same node: the
//    nvlink and node classes) and between rank 0 and the first rank of
//    another node when there is one (network class; else copied from node).
#pragma once
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/plan/machine.hpp"

namespace trident::plan {

struct CalibrationOptions {
  double seconds = 0.3;  // per benchmark and phase
};

// Collective over world. node_of[r]: the node of world rank r. Every rank
// returns the same profile.
MachineProfile calibrate_machine(Communicator& world, const std::vector<int>& node_of,
                                 const Config& cfg, const CalibrationOptions& opt);

}  // namespace trident::plan
