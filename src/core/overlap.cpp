// The two lanes of an overlapped pair: a baton (whose turn it is) under one
// mutex; a lane waits on the condition variable until the baton is its own.
#include "trident/core/overlap.hpp"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

namespace trident::overlap {
namespace {

struct Pair {
  std::mutex mutex;
  std::condition_variable turn_changed;
  int turn = 0;                   // the lane that may run
  bool done[2] = {false, false};  // a lane has returned (or thrown)
  PairStats stats;
  std::exception_ptr error[2];

  void wait_for_turn(std::unique_lock<std::mutex>& lock, int me) {
    turn_changed.wait(lock, [&] { return turn == me; });
  }
};

// The pair and lane this thread runs, if any.
thread_local Pair* t_pair = nullptr;
thread_local int t_lane = 0;
thread_local TurnObserver* t_observer = nullptr;

// Runs one lane's work once it has the turn, then gives the turn for good.
void run_lane(Pair& pair, int me, const std::function<void()>& work) {
  t_pair = &pair;
  t_lane = me;
  {
    std::unique_lock<std::mutex> lock(pair.mutex);
    pair.wait_for_turn(lock, me);
  }
  try {
    work();
  } catch (...) {
    pair.error[me] = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(pair.mutex);
    pair.done[me] = true;
    pair.turn = 1 - me;
  }
  pair.turn_changed.notify_all();
  t_pair = nullptr;
  t_lane = 0;
}

}  // namespace

bool in_flight() {
  Pair* pair = t_pair;
  if (!pair) return false;
  const int me = t_lane, other = 1 - me;
  std::unique_lock<std::mutex> lock(pair->mutex);
  ++pair->stats.exchanges;
  if (pair->done[other]) return false;
  // The other lane runs until its own next exchange or its end.
  ++pair->stats.hidden;
  if (t_observer) t_observer->turn_away();
  pair->turn = other;
  lock.unlock();
  pair->turn_changed.notify_all();
  lock.lock();
  pair->wait_for_turn(lock, me);
  if (t_observer) t_observer->turn_back();
  return true;
}

TurnObserver* set_turn_observer(TurnObserver* observer) {
  TurnObserver* before = t_observer;
  t_observer = observer;
  return before;
}

int lane() { return t_pair ? t_lane : 0; }

PairStats run_pair(const std::function<void()>& first, const std::function<void()>& second,
                   const std::function<void()>& enter_lane) {
  Pair pair;
  std::thread helper([&] {
    run_lane(pair, 1, [&] {
      if (enter_lane) enter_lane();
      second();
    });
  });
  run_lane(pair, 0, first);
  helper.join();
  for (const auto& e : pair.error)
    if (e) std::rethrow_exception(e);
  return pair.stats;
}

}  // namespace trident::overlap
