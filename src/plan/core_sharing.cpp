// Core sharing: a time-ordered replay of a lowered schedule in which the
// ranks of a node that have work share its cores (see core_sharing.hpp).
#include "trident/plan/core_sharing.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trident/core/error.hpp"

namespace trident::plan {
namespace {

using pp::Action;
using pp::Op;

constexpr double kFinished = 1e-9;  // work left below this share of an action's cost is done

// Slot of a message: (sending stage, direction, micro-batch), for a send or
// for the receive that waits for it.
size_t message_slot(const pp::Schedule& s, const Action& a) {
  const bool backward = a.op == Op::SEND_B || a.op == Op::RECV_B;
  const bool send = a.op == Op::SEND_F || a.op == Op::SEND_B;
  const int sender = send ? a.stage : (backward ? a.stage + 1 : a.stage - 1);
  return (size_t(sender) * 2 + (backward ? 1 : 0)) * size_t(s.microbatches) + size_t(a.microbatch);
}

double action_cost(const pp::Schedule& s, const StageTimes& t, Op op) {
  switch (op) {
    case Op::F:
      return t.f;
    case Op::B:
      return s.split_backward ? t.b : t.b + t.w;
    case Op::W:
      return t.w;
    default:
      return 0;
  }
}

struct RankState {
  size_t next = 0;   // index of the action it is at
  double left = -1;  // work left of a started compute action, seconds alone; < 0: not started
};

// Runs every send and every receive whose data is in at time t; starts the
// compute action a rank arrives at.
void pass_instant_actions(const pp::Schedule& s, const std::vector<StageTimes>& times,
                          double latency, double t, std::vector<double>& arrival,
                          std::vector<RankState>& st) {
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < st.size(); ++r) {
      const auto& row = s.ranks[r];
      while (st[r].next < row.size()) {
        const Action& a = row[st[r].next];
        if (pp::is_compute(a.op)) {
          if (st[r].left < 0) st[r].left = action_cost(s, times.at(size_t(a.stage)), a.op);
          break;
        }
        double& at = arrival[message_slot(s, a)];
        if (a.op == Op::SEND_F || a.op == Op::SEND_B) {
          at = t + latency;
        } else if (at < 0 || at > t) {
          break;  // its data is not in yet
        }
        ++st[r].next;
        moved = true;
      }
    }
  }
}

// Each node's demand for cores: a working rank's weight, a waiting rank's
// share of it; empty when every rank has finished its actions.
std::vector<double> node_demand(const pp::Schedule& s, const std::vector<RankState>& st,
                                const CoreSharing& cs, size_t nodes) {
  std::vector<double> demand(nodes, 0.0);
  bool finished = true;
  for (size_t r = 0; r < st.size(); ++r) {
    const bool done = st[r].next >= s.ranks[r].size();
    finished = finished && done;
    const bool working = !done && st[r].left >= 0;
    demand[size_t(cs.node[r])] += cs.weight[r] * (working ? 1.0 : cs.waiting_share);
  }
  if (finished) demand.clear();
  return demand;
}

// Time to the next event: a computation ending at its shared speed, or a
// message arriving for a rank that waits on it.
double next_event(const pp::Schedule& s, const std::vector<RankState>& st,
                  const std::vector<double>& arrival, const std::vector<double>& speed, double t) {
  double dt = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < st.size(); ++r) {
    if (st[r].next >= s.ranks[r].size()) continue;
    if (st[r].left >= 0) {
      dt = std::min(dt, st[r].left / speed[r]);
    } else {
      const double at = arrival[message_slot(s, s.ranks[r][st[r].next])];
      if (at > t) dt = std::min(dt, at - t);
    }
  }
  return dt;
}

// Every computing rank works dt at its speed; those that finish move on.
void advance(const pp::Schedule& s, const std::vector<StageTimes>& times,
             const std::vector<double>& speed, double dt, std::vector<RankState>& st,
             SharedRun& out) {
  for (size_t r = 0; r < st.size(); ++r) {
    if (st[r].next >= s.ranks[r].size() || st[r].left < 0) continue;
    const Action& a = s.ranks[r][st[r].next];
    const double cost = action_cost(s, times.at(size_t(a.stage)), a.op);
    st[r].left -= dt * speed[r];
    if (st[r].left > kFinished * cost) continue;
    out.busy[r] += cost;
    st[r].left = -1;
    ++st[r].next;
  }
}

}  // namespace

SharedRun simulate_shared_cores(const pp::Schedule& s, const std::vector<StageTimes>& times,
                                double latency, const CoreSharing& cs) {
  const size_t R = size_t(s.pp);
  TRIDENT_CHECK(cs.node.size() == R && cs.weight.size() == R && cs.cores > 0 &&
                    cs.waiting_share >= 0 && cs.waiting_share <= 1 &&
                    cs.time_slice_efficiency > 0 && cs.time_slice_efficiency <= 1,
                "core sharing: one node and weight per schedule rank, cores > 0, waiting share "
                "from 0 to 1, time-slice efficiency in (0, 1]");
  std::vector<double> arrival(size_t(s.num_stages()) * 2 * size_t(s.microbatches), -1.0);
  std::vector<RankState> st(R);
  const size_t nodes = size_t(*std::max_element(cs.node.begin(), cs.node.end())) + 1;
  SharedRun out;
  out.busy.assign(R, 0.0);
  double t = 0;
  std::vector<double> speed(R);
  for (;;) {
    pass_instant_actions(s, times, latency, t, arrival, st);
    const std::vector<double> demand = node_demand(s, st, cs, nodes);
    if (demand.empty()) break;
    for (size_t r = 0; r < R; ++r) {
      const double d = demand[size_t(cs.node[r])];
      speed[r] = d <= cs.cores ? 1.0 : cs.cores * cs.time_slice_efficiency / d;
    }
    const double dt = next_event(s, st, arrival, speed, t);
    TRIDENT_CHECK(std::isfinite(dt), "core sharing: the schedule cannot finish (deadlock)");
    advance(s, times, speed, dt, st, out);
    t += dt;
  }
  out.makespan = t;
  return out;
}

}  // namespace trident::plan
