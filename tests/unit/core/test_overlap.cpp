// core/overlap: two lanes take turns only inside in_flight(), in one fixed
// order; each lane's exception comes back to the caller.
#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "trident/core/overlap.hpp"

using namespace trident;

TEST_CASE("the lanes alternate at in_flight and a finished lane gives the turn for good",
          "[core][overlap]") {
  std::string order;
  int lanes[2] = {-1, -1};
  const overlap::PairStats stats = overlap::run_pair(
      [&] {
        lanes[0] = overlap::lane();
        order += "a1 ";
        CHECK(overlap::in_flight());  // b ran meanwhile
        order += "a2 ";
        CHECK(overlap::in_flight());
        order += "a3 ";
      },
      [&] {
        lanes[1] = overlap::lane();
        order += "b1 ";
        CHECK(overlap::in_flight());
        order += "b2 ";
      });
  // a1, a's exchange in flight while b1 runs; b's while a2 runs; a's second
  // while b2 runs; then b is done and a finishes alone.
  CHECK(order == "a1 b1 a2 b2 a3 ");
  CHECK(lanes[0] == 0);
  CHECK(lanes[1] == 1);
  CHECK(stats.exchanges == 3);
  CHECK(stats.hidden == 3);
  CHECK(overlap::lane() == 0);
  CHECK_FALSE(overlap::in_flight());  // outside a pair: nothing happens
}

TEST_CASE("a lane alone returns from in_flight at once", "[core][overlap]") {
  std::string order;
  const auto stats = overlap::run_pair([&] { order += "a "; },
                                       [&] {
                                         CHECK_FALSE(overlap::in_flight());
                                         order += "b ";
                                       });
  CHECK(order == "a b ");
  CHECK(stats.exchanges == 1);
  CHECK(stats.hidden == 0);
}

TEST_CASE("an exception in a lane reaches the caller after the other lane ends",
          "[core][overlap]") {
  bool other_done = false;
  auto enter_ran = std::thread::id();
  CHECK_THROWS_WITH(overlap::run_pair(
                        [&] {
                          overlap::in_flight();
                          throw std::runtime_error("lane 0 failed");
                        },
                        [&] {
                          overlap::in_flight();
                          other_done = true;
                        },
                        [&] { enter_ran = std::this_thread::get_id(); }),
                    "lane 0 failed");
  CHECK(other_done);
  CHECK(enter_ran != std::thread::id());
  CHECK(enter_ran != std::this_thread::get_id());  // the second lane's own thread
}
