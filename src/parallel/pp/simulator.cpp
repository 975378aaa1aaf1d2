// Dry-run simulator: replays a lowered schedule rank by rank with per-action
// costs, reports deadlocks by naming the waiting actions, and draws the
// timeline the way the pipeline papers do.
#include "trident/parallel/pp/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "trident/core/error.hpp"

namespace trident::pp {

double SimCosts::cost(const Schedule& s, Op op) const {
  switch (op) {
    case Op::F:
      return t_f;
    case Op::B:
      return s.split_backward ? t_b : t_b + t_w;
    case Op::W:
      return t_w;
    default:
      return 0;
  }
}

std::vector<double> stage_work_of_layout(const std::vector<int>& layers) {
  double sum = 0;
  for (int n : layers) sum += n;
  std::vector<double> w;
  for (int n : layers) w.push_back(sum > 0 ? n * double(layers.size()) / sum : 1.0);
  return w;
}

double SimResult::mean_bubble() const {
  double sum = 0;
  for (const auto& r : ranks) sum += r.bubble_fraction;
  return ranks.empty() ? 0 : sum / ranks.size();
}

int SimResult::max_peak_inflight() const {
  int m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_inflight);
  return m;
}

std::vector<int> peak_inflight(const Schedule& s) {
  std::vector<int> peaks(s.pp, 0);
  const Op last_backward = s.split_backward ? Op::W : Op::B;
  for (int r = 0; r < s.pp; ++r) {
    int live = 0;
    for (const Action& a : s.ranks[r]) {
      if (a.op == Op::F) peaks[r] = std::max(peaks[r], ++live);
      if (a.op == last_backward) --live;
    }
  }
  return peaks;
}

namespace {

// The send a receive waits for (same micro-batch, neighbouring stage).
Action matching_send(const Action& recv) {
  if (recv.op == Op::RECV_F) return {recv.stage - 1, Op::SEND_F, recv.microbatch};
  return {recv.stage + 1, Op::SEND_B, recv.microbatch};
}

// The time an overlapped slot takes off each action of row (SimCosts::e_f,
// e_b), at each action's stage work.
std::vector<double> hidden_by_pairs(const Schedule& s, const std::vector<Action>& row,
                                    const SimCosts& c, const std::vector<double>& work) {
  std::vector<double> hidden(row.size(), 0.0);
  if (!c.overlap_pairs || (c.e_f <= 0 && c.e_b <= 0)) return hidden;
  auto scale = [&](const Action& a) { return work.empty() ? 1.0 : work[size_t(a.stage)]; };
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i].op != Op::F || !row[i].overlapped) continue;
    size_t j = i + 1;
    while (j < row.size() && !is_compute(row[j].op)) ++j;
    if (j == row.size() || row[j].op != Op::B ||
        s.chunk_of(row[j].stage) == s.chunk_of(row[i].stage))
      continue;
    const double wf = scale(row[i]), wb = scale(row[j]);
    const double ef = std::min(c.e_f, c.t_f) * wf, eb = std::min(c.e_b, c.cost(s, Op::B)) * wb;
    const double compute_f = c.t_f * wf - ef, compute_b = c.cost(s, Op::B) * wb - eb;
    hidden[i] = std::min(ef, compute_b);
    hidden[j] = std::min(eb, compute_f);
  }
  return hidden;
}

// Where simulate() keeps the arrival time of a send's data, by (sending
// stage, direction, micro-batch); < 0: not sent.
size_t arrival_slot(const Action& send, int M) {
  return (static_cast<size_t>(send.stage) * 2 + (send.op == Op::SEND_B ? 1 : 0)) * M +
         send.microbatch;
}

// Runs rank r's actions from position next on, until a receive whose data
// has not been sent; records their events. True when it moved.
bool simulate_rank(const Schedule& s, int r, const SimCosts& costs,
                   const std::vector<double>& stage_work, const std::vector<double>& hidden,
                   std::vector<double>& arrival, SimRank& rr, size_t& next, double& clock) {
  const auto& row = s.ranks[r];
  const int M = s.microbatches;
  bool progress = false;
  while (next < row.size()) {
    const Action& a = row[next];
    double begin = clock, end = clock;
    if (is_compute(a.op)) {
      end = begin + costs.cost(s, a.op) * (stage_work.empty() ? 1.0 : stage_work[size_t(a.stage)]) -
            hidden[next];
      rr.busy += end - begin;
    } else if (a.op == Op::SEND_F || a.op == Op::SEND_B) {
      arrival[arrival_slot(a, M)] = begin + costs.latency;
    } else {
      const double t = arrival[arrival_slot(matching_send(a), M)];
      if (t < 0) break;  // blocked until the peer sends
      end = std::max(begin, t);
    }
    rr.events.push_back({a, begin, end});
    clock = end;
    ++next;
    progress = true;
  }
  return progress;
}

// Names the waiting actions when some rank did not reach the end of its row.
void throw_on_deadlock(const Schedule& s, const std::vector<size_t>& next) {
  std::string waits;
  for (int r = 0; r < s.pp; ++r) {
    if (next[r] >= s.ranks[r].size()) continue;
    const Action& a = s.ranks[r][next[r]];
    const Action send = matching_send(a);
    const int peer = s.rank_of(send.stage);
    const std::string peer_at =
        next[peer] < s.ranks[peer].size() ? s.ranks[peer][next[peer]].str() : "the end";
    waits += std::string(waits.empty() ? "" : "; ") + "rank " + std::to_string(r) + " waits at " +
             a.str() + " for " + send.str() + " on rank " + std::to_string(peer) +
             ", which is blocked at " + peer_at;
  }
  if (!waits.empty())
    throw InputError((s.name.empty() ? "" : s.name + ": ") + "deadlock: " + waits);
}

// Each rank's end, the makespan, the bubbles and the peak in-flight counts.
void finish_result(const Schedule& s, const std::vector<double>& clock, SimResult& res) {
  for (int r = 0; r < s.pp; ++r) {
    res.ranks[r].end = clock[r];
    res.makespan = std::max(res.makespan, clock[r]);
  }
  const auto peaks = peak_inflight(s);
  for (int r = 0; r < s.pp; ++r) {
    auto& rr = res.ranks[r];
    rr.bubble_fraction = res.makespan > 0 ? 1.0 - rr.busy / res.makespan : 0.0;
    rr.peak_inflight = peaks[r];
  }
}

}  // namespace

SimResult simulate(const Schedule& s, const SimCosts& costs) { return simulate(s, costs, {}); }

SimResult simulate(const Schedule& s, const SimCosts& costs,
                   const std::vector<double>& stage_work) {
  TRIDENT_CHECK(stage_work.empty() || int(stage_work.size()) == s.num_stages(),
                "simulate: stage work for " + std::to_string(stage_work.size()) + " of " +
                    std::to_string(s.num_stages()) + " virtual stages");
  validate(s);
  const int S = s.num_stages(), M = s.microbatches;
  std::vector<double> arrival(static_cast<size_t>(S) * 2 * M, -1.0);

  SimResult res;
  res.ranks.resize(s.pp);
  std::vector<size_t> next(s.pp, 0);
  std::vector<double> clock(s.pp, 0.0);
  std::vector<std::vector<double>> hidden;
  for (int r = 0; r < s.pp; ++r)
    hidden.push_back(hidden_by_pairs(s, s.ranks[r], costs, stage_work));
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s.pp; ++r)
      if (simulate_rank(s, r, costs, stage_work, hidden[size_t(r)], arrival, res.ranks[r], next[r],
                        clock[r]))
        progress = true;
  }
  throw_on_deadlock(s, next);
  finish_result(s, clock, res);
  return res;
}

std::string format_report(const Schedule& s, const SimResult& r, const SimCosts& c) {
  std::ostringstream o;
  char line[256];
  std::snprintf(
      line, sizeof line,
      "schedule %s: pp=%d vpp=%d microbatches=%d%s; costs tF=%g tB=%g tW=%g latency=%g%s\n",
      s.name.c_str(), s.pp, s.vpp, s.microbatches, s.split_backward ? " (B/W split)" : "", c.t_f,
      c.t_b, c.t_w, c.latency, s.split_backward ? "" : " (B runs tB+tW)");
  o << line;
  if (c.e_f > 0 || c.e_b > 0) {
    std::snprintf(
        line, sizeof line, "exchange inside tF %g, inside tB %g; overlapped F+B slots %s\n", c.e_f,
        c.e_b, c.overlap_pairs ? "hide it behind the other micro-batch's compute" : "run serially");
    o << line;
  }
  std::snprintf(line, sizeof line, "makespan %g, mean bubble %.4f, no deadlock\n", r.makespan,
                r.mean_bubble());
  o << line;
  o << "rank      busy      end   bubble  peak_inflight\n";
  for (int k = 0; k < s.pp; ++k) {
    const auto& rr = r.ranks[k];
    std::snprintf(line, sizeof line, "%4d %9g %8g %8.4f %14d\n", k, rr.busy, rr.end,
                  rr.bubble_fraction, rr.peak_inflight);
    o << line;
  }
  return o.str();
}

std::string format_timeline(const Schedule& s, const SimResult& r) {
  auto label = [&](const Action& a) {
    std::string l = std::string(op_name(a.op)) + std::to_string(a.microbatch);
    if (s.vpp > 1) l += static_cast<char>('a' + s.chunk_of(a.stage) % 26);
    return l;
  };
  size_t width = 1;
  for (const auto& rr : r.ranks)
    for (const auto& e : rr.events)
      if (is_compute(e.action.op)) width = std::max(width, label(e.action).size());
  const int cells = static_cast<int>(std::ceil(r.makespan - 1e-9));
  std::ostringstream o;
  for (int k = 0; k < s.pp; ++k) {
    std::string row = "rank " + std::to_string(k) + " |";
    size_t e = 0;
    const auto& ev = r.ranks[k].events;
    for (int cell = 0; cell < cells; ++cell) {
      const double t = cell + 0.5;
      while (e < ev.size() && (ev[e].t_end <= t || !is_compute(ev[e].action.op))) ++e;
      std::string text = ".";
      if (e < ev.size() && ev[e].t_begin <= t) text = label(ev[e].action);
      text.resize(width, ' ');
      row += text + (cell + 1 < cells ? " " : "|");
    }
    o << row << "\n";
  }
  o << "F/B/W + micro-batch" << (s.vpp > 1 ? " + chunk letter (a = chunk 0)" : "")
    << "; one cell per time unit; '.' idle\n";
  return o.str();
}

}  // namespace trident::pp
