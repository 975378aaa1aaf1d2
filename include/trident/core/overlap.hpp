// Two streams of work on one rank, interleaved where one waits for its
// communication: DualPipeV's overlapped forward + backward pair, whose EP
// exchanges travel while the other micro-batch computes.
//
// run_pair(first, second) runs first() and second() on two threads that
// take turns: exactly one of them runs at any moment (a baton passed under a
// mutex), so what they touch needs no locking, and the order of every
// operation is fixed by the program alone, the same on every rank of a
// group that runs the same pair. Each lane computes what it would computing
// alone, bit for bit, as long as the two lanes write disjoint data (a
// forward and a backward of different chunks). first() starts. A lane gives
// the turn away only inside in_flight(), which a transport calls between
// posting an exchange and waiting for it (Transport, parallel/ep), so the
// exchange is in flight while the other lane computes; a lane that finishes
// gives the turn for good, and in_flight() in the lane left returns at once.
// Outside a pair in_flight() does nothing: the serial path is unchanged.
// Waiting for the turn has no deadline of its own: the other lane holds it
// only while it computes or waits in a Communicator call, whose deadline
// ends it (an exception ends the lane, which gives the turn back).
#pragma once
#include <cstdint>
#include <functional>

namespace trident::overlap {

struct PairStats {
  int64_t exchanges = 0;  // in_flight() calls inside the pair (both lanes)
  int64_t hidden = 0;     // of those, the ones during which the other lane ran
};

// Called with an exchange posted and not yet waited for. Outside a pair:
// false at once. Inside: hands the turn to the other lane if it has work
// left and returns when it is this lane's turn again; true if the other
// lane ran meanwhile.
bool in_flight();

// 0 outside a pair and in its first lane, 1 in its second: a transport
// offsets its message tags by it, so the two lanes' messages, in flight at
// the same time over one communicator, never match each other's.
int lane();

// What a lane's thread is told when in_flight() hands the turn to the other
// lane and when the turn comes back: a clock of this lane's own time
// (train::PhaseClock) stops in between, so that an overlapped pair's two
// phases are not both counted over the span they share. One per thread;
// set_turn_observer returns the one it replaces, to which an observer
// passes both calls on (clocks nest), and is restored with it.
class TurnObserver {
 public:
  virtual void turn_away() = 0;
  virtual void turn_back() = 0;

 protected:
  ~TurnObserver() = default;
};
TurnObserver* set_turn_observer(TurnObserver* observer);

// Runs both lanes to completion and returns what in_flight() saw. The
// second lane runs on a helper thread; enter_lane(), if given, runs first
// on it (the caller's thread-local settings: memory kind, current device).
// An exception in a lane ends that lane (the other then runs alone) and is
// rethrown here, the first lane's first.
PairStats run_pair(const std::function<void()>& first, const std::function<void()>& second,
                   const std::function<void()>& enter_lane = {});

}  // namespace trident::overlap
