// Calibration: short benchmarks on the machine a job runs on, turned into a
// machine profile (see machine.hpp). Run by `trident plan CONFIG --calibrate
// --out FILE` under mpirun/srun with as many ranks per node as a run uses.
//
// Benchmarks (each repeated for about `seconds`):
//  - GEMM rate and core sharing: the config's largest FFN product, x [T, d]
//    by a weight [f, d] as the model stores it (T tokens of one micro-batch), in rounds of rank 0
//    alone (the others sleep) and every rank of node 0 at once, medians over the rounds.
//    cores_per_node is the node's physical cores (the distinct cores of the
//    affinity mask); when the ranks outnumber them, the ratio of the rates
//    gives time_slice_efficiency, and rounds with as many ranks working as
//    there are cores, the others once asleep and once waiting for a message,
//    give wait_core_share;
//  - attention rate: causal forward and backward of one micro-batch's
//    sequence with the config's heads, FLOPs counted as the cost model does;
//  - memory-bound rate: residual adds over one micro-batch's hidden states;
//  - the model: one micro-batch's forward and backward on one rank at two
//    micro-batch sizes (efficiency and a fixed cost per layer), and the
//    update per parameter;
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
