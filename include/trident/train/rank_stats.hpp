// Which rank is slow: every rank's step times in windows of
// output.rank_stats_every steps (/ranks/steps), and the root straggler
// named by rank 0 (share/trident/faults.md).
//
// Each rank sums its steps into a window: compute seconds by phase with the
// communication waits inside them left out (a ring-attention or expert
// exchange wait is the peer's time, not this rank's), wait seconds by kind,
// and the pipeline peer it waited on longest. At a window's end each rank
// sends its window (kFields doubles) to rank 0 on a communicator of its own
// and does not wait; rank 0 takes them in at the end of the next step, when
// every rank has passed that step's collectives so the messages are there:
// the table adds no synchronisation to the step.
//
// Rank 0 scores each rank by its compute per step (the median over the
// window's steps, so that one step that lost the core does not count)
// against the median of the other ranks of its pipeline stage (they run the
// same layers, so the pipeline's bubbles and uneven stages never enter a
// score), or against its own earlier windows when it is its stage's only
// rank. A rank over runtime.straggler_threshold and more than a noise
// floor (5 ms per step) over that median, in two windows in a row, is the
// straggler: one warning line and a `straggler` row in /events, with the
// seconds the others waited on it. Ranks that waited on it have more wait,
// not more compute (time inside test() is a wait too), so they are never
// named.
#pragma once
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/core/overlap.hpp"
#include "trident/io/run_file.hpp"

namespace trident::train {

// Compute phases of /ranks/steps, in this order.
enum class Phase : int { forward, backward, weight, optimizer, data, checkpoint };
constexpr int kNumPhases = 6;
const char* phase_name(Phase p);

// One rank's seconds in one step, or summed over a window.
struct StepTimes {
  std::array<double, kNumPhases> phase{};    // compute, waits inside left out
  std::array<double, kNumCommKinds> wait{};  // cp, pp, ep, dp
  int peer = -1;                             // world rank of the longest pipeline receive's sender
  double peer_wait_s = 0;                    // that receive's seconds
  double step_s = 0;                         // this rank's wall time of the step
  void add(const StepTimes& o);
};

// Adds to `into` the seconds from construction to stop() (or destruction)
// minus the communication waits of that interval (every kind) in counters.
// In a lane of an overlapped pair (core/overlap.hpp) it stops while the
// other lane has the turn, so that neither that lane's compute nor its
// waits enter this one's phase: a DualPipeV slot's forward and backward
// together count the slot's span once.
class PhaseClock final : public overlap::TurnObserver {
 public:
  PhaseClock(double& into, const CommCounters& counters);
  ~PhaseClock() { stop(); }
  void stop();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  void turn_away() override;
  void turn_back() override;
  // A test hook (TRIDENT_TEST_SLOW_RANK / TRIDENT_TEST_SLOW_FACTOR, read by
  // RankStats): every phase of this process takes `factor` times as long,
  // the excess idle (a sleep), as a slower device keeps its rank waiting.
  static void set_test_slowdown(double factor);

 private:
  double& into_;
  const CommCounters& counters_;
  double t0_, waited0_;
  bool running_ = true, paused_ = false;
  overlap::TurnObserver* outer_;  // the thread's observer before this clock
};

class RankStats {
 public:
  // Collective over world (splits the table's own communicator) when
  // output.rank_stats_every > 0. hosts: /topology/ranks' host of each rank.
  RankStats(const Config& cfg, Communicator& world, int pp_rank, std::vector<std::string> hosts);
  ~RankStats();
  bool enabled() const { return every_ > 0; }

  // After step `step`'s row: adds its times; takes in the previous window
  // (rank 0: its rows into /ranks/steps, the scores, the verdict), then, at
  // a window's end, sends this one. Collective over world (the table's write).
  void after_step(int64_t step, const StepTimes& t, RunFile& file);
  // A checkpoint save's blocking seconds, counted in the current window.
  void add_checkpoint_s(double s) { window_.phase[int(Phase::checkpoint)] += s; }
  // Rank 0: 1 + the straggler named at the last window taken in (0: none);
  // every rank passes what the ranks agreed on (max) to record(), which
  // writes the /events row (collective when nonzero).
  int verdict() const { return verdict_; }
  void record(int agreed, RunFile& file);
  // The end of the run: the last partial window taken in and judged.
  // Collective over world.
  void finish(RunFile& file);

 public:
  static constexpr int kFields = 17;  // doubles of a window's record

 private:
  void send_window(int64_t last_step);
  void take_in(RunFile& file);
  // Rank 0: the scores of a window's records, and the straggler named.
  void judge(const std::vector<double>& all, int64_t first, int64_t last);
  // Rank q's scores (scores_) from the compute per step c of every rank;
  // returns the compute it is compared with.
  double score(const std::vector<double>& all, const std::vector<double>& c,
               const std::vector<double>& on, int q);
  void name_straggler(const std::vector<double>& all, int q, int64_t first, int64_t last);

  int every_ = 0;
  double threshold_ = 1.3;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0, size_ = 1, pp_rank_ = 0;
  std::vector<std::string> hosts_;
  StepTimes window_;
  std::vector<double> step_compute_;  // the window's compute of each step
  int64_t window_first_ = -1;
  int window_steps_ = 0;
  // The window in flight: this rank's record, rank 0's receive buffer.
  std::vector<double> sent_, received_;
  std::vector<Request> requests_;
  int64_t pending_first_ = -1, pending_last_ = -1;
  // Rank 0: windows in a row over the threshold, and recent compute per step.
  std::vector<int> over_;
  std::vector<std::deque<double>> history_;
  // per rank: waited_on_s, score, score_best, score_self (RankStepRow)
  std::vector<std::array<double, 4>> scores_;
  int64_t prev_first_ = 0;  // the previous window's first step
  int verdict_ = 0;
  RunEvent event_{0, "straggler", -1, 0, 0, ""};  // rank 0's is written
};

}  // namespace trident::train
