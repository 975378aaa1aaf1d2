// Core sharing: the replay of a lowered schedule whose ranks share a node's
// cores, against makespans counted by hand.
#include <catch2/catch.hpp>

#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/simulator.hpp"
#include "trident/plan/core_sharing.hpp"

using namespace trident;
using namespace trident::plan;

namespace {

pp::Schedule lowered(const char* name, int pp, int m) {
  return pp::lower(pp::make_schedule(name, pp, m, 1));
}

CoreSharing one_node(int ranks, double cores) {
  return CoreSharing{std::vector<int>(size_t(ranks), 0), std::vector<double>(size_t(ranks), 1.0),
                     cores};
}

}  // namespace

TEST_CASE("with a core per rank, sharing replays the schedule simulator") {
  for (const char* name : {"afab", "1f1b", "zb-h1"}) {
    const pp::Schedule s = lowered(name, 4, 6);
    const pp::SimResult sim = pp::simulate(s, pp::SimCosts{1.0, 2.0, 0.5, 0.25});
    const std::vector<StageTimes> t(4, StageTimes{1.0, 2.0, 0.5});
    const SharedRun run = simulate_shared_cores(s, t, 0.25, one_node(4, 4));
    CHECK(run.makespan == Approx(sim.makespan));
    for (int r = 0; r < 4; ++r) CHECK(run.busy[size_t(r)] == Approx(sim.ranks[size_t(r)].busy));
  }
}

TEST_CASE("ranks that share one core take their total work") {
  // 2 stages of 1F1B with 4 micro-batches on one core: never idle, so the
  // makespan is all the work, 2 x 4 x (1 + 2), whatever the order
  const SharedRun run = simulate_shared_cores(
      lowered("1f1b", 2, 4), std::vector<StageTimes>(2, {1, 2, 0}), 0, one_node(2, 1));
  CHECK(run.makespan == Approx(24));
  // uneven stages (stage 1 three times stage 0) on two cores: stage 1 alone
  // sets the pace once the pipeline is full: F0 (1), then 4 x (F + B) of
  // stage 1 = 4 x 9 = 36, with stage 0's last B (2) after it
  const SharedRun uneven = simulate_shared_cores(
      lowered("1f1b", 2, 4), {StageTimes{1, 2, 0}, StageTimes{3, 6, 0}}, 0, one_node(2, 2));
  CHECK(uneven.makespan == Approx(1 + 36 + 2));
  // the same on one core: all the work, 4 x 3 + 4 x 9
  const SharedRun shared = simulate_shared_cores(
      lowered("1f1b", 2, 4), {StageTimes{1, 2, 0}, StageTimes{3, 6, 0}}, 0, one_node(2, 1));
  CHECK(shared.makespan == Approx(48));
}

TEST_CASE("a pipeline that runs one rank at a time loses nothing to sharing") {
  // one micro-batch through 4 stages: F0..F3 then B3..B0, one rank busy at a time
  const SharedRun run = simulate_shared_cores(
      lowered("1f1b", 4, 1), std::vector<StageTimes>(4, {1, 2, 0}), 0, one_node(4, 2));
  CHECK(run.makespan == Approx(12));
  // a group of two ranks per stage on a node of two cores: half speed
  CoreSharing pairs{{0, 0, 0, 0}, {2, 2, 2, 2}, 2};
  CHECK(
      simulate_shared_cores(lowered("1f1b", 4, 1), std::vector<StageTimes>(4, {1, 2, 0}), 0, pairs)
          .makespan == Approx(12));
  pairs.cores = 1;
  CHECK(
      simulate_shared_cores(lowered("1f1b", 4, 1), std::vector<StageTimes>(4, {1, 2, 0}), 0, pairs)
          .makespan == Approx(24));
}

TEST_CASE("waiting ranks take their share of the cores") {
  // one micro-batch through 4 stages, one rank working at a time and the
  // other three waiting (for their message, or done): each waiter counts as
  // half a runnable rank, so the node's demand is 1 + 3 x 0.5 = 2.5
  const pp::Schedule s = lowered("1f1b", 4, 1);
  const std::vector<StageTimes> t(4, {1, 2, 0});
  CoreSharing cs = one_node(4, 1);
  cs.waiting_share = 0.5;
  CHECK(simulate_shared_cores(s, t, 0, cs).makespan == Approx(12 / (1 / 2.5)));
  cs.cores = 2;  // speed 2 / 2.5
  CHECK(simulate_shared_cores(s, t, 0, cs).makespan == Approx(12 / 0.8));
  cs.cores = 3;  // demand 2.5 fits 3 cores: nobody slows down
  CHECK(simulate_shared_cores(s, t, 0, cs).makespan == Approx(12));
  // ranks on another node do not count against this node's cores
  CoreSharing apart{{0, 1, 2, 3}, {1, 1, 1, 1}, 1, 0.5};
  CHECK(simulate_shared_cores(s, t, 0, apart).makespan == Approx(12));
  cs.waiting_share = 1.5;
  CHECK_THROWS(simulate_shared_cores(s, t, 0, cs));
}

TEST_CASE("ranks taking turns on the cores lose the time-slice share") {
  // one stage standing for a dp group of 2 ranks on a node of one core, both
  // always with work: all the work, 2 x 4 x (1 + 2) = 24, at the rate the
  // core keeps while it switches between them
  CoreSharing cs{{0}, {2}, 1};
  cs.time_slice_efficiency = 0.8;
  CHECK(simulate_shared_cores(lowered("1f1b", 1, 4), std::vector<StageTimes>(1, {1, 2, 0}), 0, cs)
            .makespan == Approx(24 / 0.8));
  // one micro-batch through 4 stages on 2 cores: one rank has work at a
  // time, so nothing switches and nothing is lost
  CoreSharing four = one_node(4, 2);
  four.time_slice_efficiency = 0.8;
  CHECK(simulate_shared_cores(lowered("1f1b", 4, 1), std::vector<StageTimes>(4, {1, 2, 0}), 0, four)
            .makespan == Approx(12));
}
