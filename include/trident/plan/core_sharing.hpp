// Core sharing: the makespan of a lowered pipeline schedule when the ranks of
// a node outnumber its cores (a CPU machine running several ranks per core).
//
// A rank that waits gives its core up (trident's waits back off to sleeping),
// so the cores of a node are shared by the ranks that have work at that
// moment: each runs at full speed while they fit the cores, else at
// cores x time_slice_efficiency / runnable ranks of its node, where a
// rank that waits (for a message, or done and waiting for the others) still
// counts as `waiting_share` of a runnable rank: its waits poll between short
// sleeps, and each wake-up takes the core from a rank with work. A pipeline
// whose ranks are all busy is then bound by its total work over the cores,
// while a bubble costs only where fewer ranks than cores have work. Each
// schedule rank stands for the `weight` identical ranks (its dp x cp group on
// that node) that run the same actions at the same time.
#pragma once
#include <vector>

#include "trident/parallel/pp/schedule.hpp"

namespace trident::plan {

// Seconds of one micro-batch's actions on one virtual stage, at the rate of a
// rank alone (a non-split B costs b + w, as in the schedule simulator).
struct StageTimes {
  double f = 0, b = 0, w = 0;
};

struct CoreSharing {
  std::vector<int> node;       // node of each schedule rank (ranks on one node share cores)
  std::vector<double> weight;  // ranks of that node each schedule rank stands for
  double cores = 1;            // cores per node
  double waiting_share = 0;    // share of a core a waiting rank takes (0 to 1)
  // Share of their rate the cores keep while more ranks than cores take turns
  // on them (0 to 1; 1 when the ranks with work fit the cores).
  double time_slice_efficiency = 1;
};

struct SharedRun {
  double makespan = 0;
  std::vector<double> busy;  // per schedule rank: its actions' cost at the rate alone
};

// Replays the lowered schedule in time order. stage_times[s]: costs of
// virtual stage s; latency: from a SEND to its data being receivable.
// Throws trident::Error if the schedule cannot finish (simulate() names
// deadlocks first; callers run it before).
SharedRun simulate_shared_cores(const pp::Schedule& lowered,
                                const std::vector<StageTimes>& stage_times, double latency,
                                const CoreSharing& sharing);

}  // namespace trident::plan
