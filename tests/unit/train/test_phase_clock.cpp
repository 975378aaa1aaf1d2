// train::PhaseClock (issue 46): a phase's seconds leave the communication
// waits out, and in the two lanes of an overlapped pair (DualPipeV's F+B
// slot, core/overlap.hpp) each lane's clock counts only the time it has the
// turn, so the two phases together never exceed the pair's span.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "trident/core/clock.hpp"
#include "trident/core/overlap.hpp"
#include "trident/train/rank_stats.hpp"

using namespace trident;
using namespace trident::train;

namespace {

void busy_for(double s) {  // sleeps: the clocks are wall clocks
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

// A wait of s seconds as the Communicator accounts it.
void wait_for(CommCounters& counters, double s) {
  const double t0 = now_s();
  busy_for(s);
  counters.wait_s[int(CommKind::ep)] += now_s() - t0;
}

}  // namespace

TEST_CASE("a phase clock leaves the waits inside it out", "[train][rank_stats]") {
  CommCounters counters;
  double phase = 0;
  const double t0 = now_s();
  {
    PhaseClock clock(phase, counters);
    busy_for(0.02);
    wait_for(counters, 0.03);
    busy_for(0.02);
  }
  const double span = now_s() - t0;
  const double waited = counters.wait_s[int(CommKind::ep)];
  CHECK(phase >= 0.04);
  CHECK(phase <= span - waited + 1e-9);
  CHECK(phase == Approx(span - waited).margin(0.005));
}

TEST_CASE("an overlapped pair's two phase clocks count its span once", "[train][rank_stats]") {
  // Lane F computes, waits on its exchange, hands the turn over (in_flight),
  // and computes again; lane B the same with other lengths. One lane runs at
  // a time, so F's and B's compute and all the waits add up to the span.
  CommCounters counters;
  double forward = 0, backward = 0;
  const double t0 = now_s();
  overlap::run_pair(
      [&] {
        PhaseClock clock(forward, counters);
        busy_for(0.03);
        wait_for(counters, 0.01);
        overlap::in_flight();
        busy_for(0.03);
      },
      [&] {
        PhaseClock clock(backward, counters);
        busy_for(0.04);
        wait_for(counters, 0.02);
        overlap::in_flight();
        busy_for(0.02);
      });
  const double span = now_s() - t0;
  const double waited = counters.wait_s[int(CommKind::ep)];
  INFO("forward " << forward << " s, backward " << backward << " s, waits " << waited << " s, span "
                  << span << " s");
  CHECK(forward >= 0.06);
  CHECK(backward >= 0.06);
  // Counted over the span both lanes share, the two would add up to about
  // 1.3 x the span (0.19 s of 0.15 s, with 0.03 s of waits besides).
  // (The rest of the span is the hand-overs between the lanes' threads,
  // milliseconds on a loaded machine: no lower bound is asserted.)
  CHECK(forward + backward + waited <= span + 1e-9);
}

TEST_CASE("phase clocks nest, and outside a pair nothing pauses them", "[train][rank_stats]") {
  CommCounters counters;
  double outer = 0, inner = 0;
  {
    PhaseClock a(outer, counters);
    {
      PhaseClock b(inner, counters);
      busy_for(0.01);
      CHECK_FALSE(overlap::in_flight());  // outside a pair: returns at once
    }
    busy_for(0.01);
  }
  CHECK(inner >= 0.01);
  CHECK(outer >= inner + 0.01);
  // the observer is restored: a clock made now starts from none
  CHECK(overlap::set_turn_observer(nullptr) == nullptr);
}
