// Clock synchronisation: the offset of each host's CLOCK_MONOTONIC to world
// rank 0's host, measured by ping-pong between host leaders and set in
// core's clock.
#include <memory>

#include "trident/comm/comm.hpp"

namespace trident {

namespace {

// Each leader pings the reference (leaders' rank 0 = world rank 0) a few
// times and keeps the exchange with the shortest round trip (least
// queueing), taking the reference's reading as taken half-way through it.
double measure_offset(Communicator& leaders) {
  constexpr int kRounds = 8;
  constexpr int kTag = 7301;
  double best_rtt = 1e30, offset = 0.0;
  for (int r = 1; r < leaders.size(); ++r) {
    for (int k = 0; k < kRounds; ++k) {
      if (leaders.rank() == 0) {
        char ping = 0;
        Request rq = leaders.irecv(&ping, 1, r, kTag);
        leaders.wait(rq);
        const double t = monotonic_s();
        Request sq = leaders.isend(&t, sizeof t, r, kTag);
        leaders.wait(sq);
      } else if (leaders.rank() == r) {
        char ping = 1;
        double t_ref = 0;
        const double t0 = monotonic_s();
        Request sq = leaders.isend(&ping, 1, 0, kTag);
        Request rq = leaders.irecv(&t_ref, sizeof t_ref, 0, kTag);
        leaders.wait(sq);
        leaders.wait(rq);
        const double t1 = monotonic_s();
        if (t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          offset = t_ref - 0.5 * (t0 + t1);
        }
      }
    }
  }
  leaders.barrier();
  return offset;
}

}  // namespace

void sync_clock(Communicator& world) {
  // Ranks that share a host share the clock, so only the offset between hosts
  // is measured: each host's leader (its lowest rank) against world rank 0,
  // and the leader hands it to the ranks of its host. On one host no offset
  // is measured at all and the readings of all ranks are exactly comparable.
  Communicator& control = world.host();
  auto host = control.split_node(CommKind::world, "clock sync (host)");
  const bool leader = host->rank() == 0;
  auto leaders =
      control.split(leader ? 0 : -1, control.rank(), CommKind::world, "clock sync (hosts)");
  double offset = leader ? measure_offset(*leaders) : 0.0;
  host->broadcast(&offset, sizeof offset, 0);
  set_host_clock_offset(offset);
}

}  // namespace trident
