// Dry-run simulator of a lowered schedule: finds deadlocks before anything
// runs, and predicts makespan, bubble and activation memory per rank.
//
// Model: each rank runs its list in order. F, B, W take their cost; a SEND
// takes no time and its data arrives `latency` later; a RECV waits until its
// data has arrived. A rank that waits on a RECV whose SEND its peer has not
// reached, while every other rank is also waiting, is a deadlock; the error
// names each waiting action and the send it waits for.
#pragma once
#include <string>
#include <vector>

#include "trident/parallel/pp/schedule.hpp"

namespace trident::pp {

// Costs in any time unit (the CLI uses abstract units; bench uses ms).
struct SimCosts {
  double t_f = 1;      // forward of one micro-batch through one chunk
  double t_b = 2;      // input gradient (B of a split schedule)
  double t_w = 1;      // weight gradient (W); a non-split B costs t_b + t_w
  double latency = 0;  // from a SEND to its data being receivable
  // The EP exchange time inside t_f and inside t_b (exposed when an action
  // runs alone). In an overlapped F+B slot whose B is on another chunk (as
  // the executor runs it, ExecOptions::overlap_pairs) each lane's exchange
  // is in flight while the other lane computes: the F costs min(e_f, the
  // B's compute) less and the B min(e_b, the F's compute) less, the compute
  // being an action's cost less its exchange.
  double e_f = 0, e_b = 0;
  bool overlap_pairs = true;
  double cost(const Schedule& s, Op op) const;
};

// stage_work of a layout (layers per virtual stage): each entry over the mean.
std::vector<double> stage_work_of_layout(const std::vector<int>& layers);

struct SimEvent {
  Action action;
  double t_begin = 0, t_end = 0;  // a RECV spans its wait
};

struct SimRank {
  double busy = 0;             // time in F, B, W
  double end = 0;              // when its last action ended
  double bubble_fraction = 0;  // 1 - busy / makespan (makespan over all ranks)
  int peak_inflight = 0;       // most micro-batch chunks between F and their last backward
  std::vector<SimEvent> events;
};

struct SimResult {
  double makespan = 0;
  std::vector<SimRank> ranks;
  double mean_bubble() const;
  int max_peak_inflight() const;
};

// Validates (see validate()) and simulates. Throws InputError for an
// incomplete or inconsistent schedule and for a deadlock, one line naming the
// waiting actions ("deadlock: rank 0 waits at 0RECV_B0 for 1SEND_B0 on rank 1,
// which is blocked; rank 1 waits at ...").
SimResult simulate(const Schedule& lowered, const SimCosts& costs);
// The same with per-virtual-stage work: stage s's actions cost stage_work[s]
// times the above (an uneven parallel.pp_layout: stage_work_of_layout);
// empty: 1 each.
SimResult simulate(const Schedule& lowered, const SimCosts& costs,
                   const std::vector<double>& stage_work);

// Peak in-flight activations per rank from the action order alone: (chunk,
// micro-batch) pairs whose F has run and whose last backward (W when split,
// else B) has not.
std::vector<int> peak_inflight(const Schedule& s);

// Report: makespan, per-rank busy time, bubble and peak in-flight activations.
std::string format_report(const Schedule& s, const SimResult& r, const SimCosts& costs);

// ASCII timeline in the style of the pipeline papers' figures: one row per
// rank, one cell per time unit (cell k shows what runs at time k + 0.5), each
// compute cell labelled with its op and micro-batch (and chunk letter a, b,
// ... when vpp > 1); '.' is idle, communication is not drawn.
std::string format_timeline(const Schedule& s, const SimResult& r);

}  // namespace trident::pp
