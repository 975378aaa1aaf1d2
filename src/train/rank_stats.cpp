// Per-rank step times and the root straggler (see train/rank_stats.hpp).
#include "trident/train/rank_stats.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "trident/core/clock.hpp"

namespace trident::train {
namespace {

// Positions in a window's record (RankStats::kFields doubles).
constexpr int kStage = 0, kPhase0 = 1, kWait0 = kPhase0 + kNumPhases, kPeer = kWait0 + 4,
              kPeerWait = kPeer + 1, kStepS = kPeerWait + 1, kFirst = kStepS + 1,
              kSteps = kFirst + 1, kMedian = kSteps + 1;
static_assert(kMedian + 1 == RankStats::kFields);
// Earlier windows a rank alone in its stage is compared with.
constexpr size_t kHistory = 5;
// The noise floor: a rank is slow only when its compute per step exceeds
// its reference by at least this much, besides the ratio. Below it the
// measurement is the operating system's: a time slice of a rank sharing
// its cores with others is a few milliseconds (faults.md).
constexpr double kMinExcessS = 0.005;

double all_waits(const CommCounters& counters) {
  double w = 0;
  for (double x : counters.wait_s) w += x;
  return w;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A step's compute: every phase but the checkpoint's (a save's staging is
// the owner's share of the state, not the same work on every rank).
double step_compute(const StepTimes& t) {
  double c = 0;
  for (int p = 0; p < int(Phase::checkpoint); ++p) c += t.phase[size_t(p)];
  return c;
}

double collective_wait(const double* rec) {
  return rec[kWait0 + int(CommKind::cp)] + rec[kWait0 + int(CommKind::ep)] +
         rec[kWait0 + int(CommKind::dp)];
}

}  // namespace

const char* phase_name(Phase p) {
  static const char* const names[kNumPhases] = {"forward",   "backward", "weight",
                                                "optimizer", "data",     "checkpoint"};
  return names[int(p)];
}

void StepTimes::add(const StepTimes& o) {
  for (int p = 0; p < kNumPhases; ++p) phase[size_t(p)] += o.phase[size_t(p)];
  for (int k = 0; k < kNumCommKinds; ++k) wait[size_t(k)] += o.wait[size_t(k)];
  if (o.peer_wait_s > peer_wait_s) {
    peer = o.peer;
    peer_wait_s = o.peer_wait_s;
  }
  step_s += o.step_s;
}

PhaseClock::PhaseClock(double& into, const CommCounters& counters)
    : into_(into),
      counters_(counters),
      t0_(now_s()),
      waited0_(all_waits(counters)),
      outer_(overlap::set_turn_observer(this)) {}

void PhaseClock::turn_away() {
  if (running_ && !paused_) into_ += (now_s() - t0_) - (all_waits(counters_) - waited0_);
  paused_ = true;
  if (outer_) outer_->turn_away();
}

void PhaseClock::turn_back() {
  t0_ = now_s();
  waited0_ = all_waits(counters_);
  paused_ = false;
  if (outer_) outer_->turn_back();
}

namespace {
double g_slowdown = 1.0;  // PhaseClock::set_test_slowdown
}  // namespace

void PhaseClock::set_test_slowdown(double factor) { g_slowdown = factor; }

void PhaseClock::stop() {
  if (!running_) return;
  const double before = into_;
  if (!paused_) into_ += (now_s() - t0_) - (all_waits(counters_) - waited0_);
  if (g_slowdown > 1) {  // the test hook: the phase takes `factor` times as long
    const double t0 = now_s();
    std::this_thread::sleep_for(
        std::chrono::duration<double>((g_slowdown - 1) * std::max(0.0, into_ - before)));
    into_ += now_s() - t0;
  }
  running_ = false;
  overlap::set_turn_observer(outer_);
}

RankStats::RankStats(const Config& cfg, Communicator& world, int pp_rank,
                     std::vector<std::string> hosts)
    : every_(cfg.output.rank_stats_every),
      threshold_(cfg.runtime.straggler_threshold),
      rank_(world.rank()),
      size_(world.size()),
      pp_rank_(pp_rank),
      hosts_(std::move(hosts)) {
  const char* slow = std::getenv("TRIDENT_TEST_SLOW_RANK");
  if (slow && std::atoi(slow) == rank_) {
    const char* factor = std::getenv("TRIDENT_TEST_SLOW_FACTOR");
    PhaseClock::set_test_slowdown(factor ? std::atof(factor) : 2.0);
  }
  if (every_ <= 0) return;
  // Its own communicator: the records never meet another exchange's tags.
  comm_ = world.host().split(0, rank_, CommKind::world, "rank_stats");
  if (rank_ != 0) return;
  over_.assign(size_t(size_), 0);
  history_.resize(size_t(size_));
}

RankStats::~RankStats() = default;

void RankStats::after_step(int64_t step, const StepTimes& t, RunFile& file) {
  if (every_ <= 0) return;
  if (window_steps_ == 0) window_first_ = step;
  window_.add(t);
  step_compute_.push_back(step_compute(t));
  ++window_steps_;
  take_in(file);
  if (window_steps_ == every_) send_window(step);
}

void RankStats::send_window(int64_t last_step) {
  sent_.assign(kFields, 0.0);
  sent_[kStage] = pp_rank_;
  for (int p = 0; p < kNumPhases; ++p) sent_[size_t(kPhase0 + p)] = window_.phase[size_t(p)];
  for (int k = 0; k < 4; ++k) sent_[size_t(kWait0 + k)] = window_.wait[size_t(k)];
  sent_[kPeer] = window_.peer;
  sent_[kPeerWait] = window_.peer_wait_s;
  sent_[kStepS] = window_.step_s;
  sent_[kFirst] = double(window_first_);
  sent_[kSteps] = window_steps_;
  sent_[kMedian] = median(step_compute_);
  pending_first_ = window_first_;
  pending_last_ = last_step;
  constexpr size_t bytes = kFields * sizeof(double);
  if (rank_ == 0) {
    received_.assign(size_t(size_) * kFields, 0.0);
    std::copy(sent_.begin(), sent_.end(), received_.begin());
    for (int q = 1; q < size_; ++q)
      requests_.push_back(comm_->irecv(&received_[size_t(q) * kFields], bytes, q, 0));
  } else {
    requests_.push_back(comm_->isend(sent_.data(), bytes, 0, 0));
  }
  window_ = StepTimes{};
  step_compute_.clear();
  window_steps_ = 0;
}

void RankStats::take_in(RunFile& file) {
  if (pending_first_ < 0) return;
  comm_->wait_all(requests_);
  requests_.clear();
  std::vector<RankStepRow> rows;
  if (rank_ == 0) {
    judge(received_, pending_first_, pending_last_);
    rows.resize(size_t(size_));
    for (int q = 0; q < size_; ++q) {
      const double* rec = &received_[size_t(q) * kFields];
      RankStepRow& row = rows[size_t(q)];
      row.step = int64_t(rec[kFirst]);
      row.steps = int32_t(rec[kSteps]);
      row.rank = q;
      std::snprintf(row.host, sizeof row.host, "%s", hosts_.at(size_t(q)).c_str());
      row.stage = int32_t(rec[kStage]);
      std::copy(rec + kPhase0, rec + kPhase0 + kNumPhases, row.compute_s);
      std::copy(rec + kWait0, rec + kWait0 + 4, row.wait_s);
      row.peer = int32_t(rec[kPeer]);
      row.peer_wait_s = rec[kPeerWait];
      row.step_s = rec[kStepS];
      row.waited_on_s = scores_[size_t(q)][0];
      row.score = scores_[size_t(q)][1];
      row.score_best = scores_[size_t(q)][2];
      row.score_self = scores_[size_t(q)][3];
    }
  }
  file.append_rank_steps(rows);
  pending_first_ = pending_last_ = -1;
}

namespace {

// Other ranks' waits put on the rank they waited for: a pipeline receive's
// on its sender; within a stage, the collective waits (cp, ep, dp) beyond
// those of the stage's rank that waited least, on that rank (it arrived last).
std::vector<double> waited_on(const std::vector<double>& all, int size) {
  auto rec = [&](int q) { return &all[size_t(q) * RankStats::kFields]; };
  std::vector<double> on(size_t(size), 0.0);
  for (int q = 0; q < size; ++q) {
    const int peer = int(rec(q)[kPeer]);
    if (peer >= 0 && peer < size) on[size_t(peer)] += rec(q)[kPeerWait];
  }
  for (int q = 0; q < size; ++q) {
    int last = q;  // the stage's rank with the least collective wait
    for (int o = 0; o < size; ++o)
      if (rec(o)[kStage] == rec(q)[kStage] && collective_wait(rec(o)) < collective_wait(rec(last)))
        last = o;
    if (last != q) on[size_t(last)] += collective_wait(rec(q)) - collective_wait(rec(last));
  }
  return on;
}

// The phase where rank q's compute exceeds its stage's other ranks' median
// most (its largest phase when it is alone in its stage).
Phase excess_phase(const std::vector<double>& all, int size, int q) {
  auto rec = [&](int r) { return &all[size_t(r) * RankStats::kFields]; };
  Phase best = Phase::forward;
  double most = -1e300;
  for (int p = 0; p < int(Phase::checkpoint); ++p) {
    std::vector<double> others;
    for (int o = 0; o < size; ++o)
      if (o != q && rec(o)[kStage] == rec(q)[kStage])
        others.push_back(rec(o)[kPhase0 + p] / std::max(1.0, rec(o)[kSteps]));
    const double x = rec(q)[kPhase0 + p] / std::max(1.0, rec(q)[kSteps]) - median(others);
    if (x > most) {
      most = x;
      best = Phase(p);
    }
  }
  return best;
}

// x / ref, 0 without a reference.
double ratio(double x, double ref) { return ref > 0 ? x / ref : 0; }

}  // namespace

double RankStats::score(const std::vector<double>& all, const std::vector<double>& c,
                        const std::vector<double>& on, int q) {
  std::vector<double> stage;  // the compute of its stage's other ranks
  for (int o = 0; o < size_; ++o)
    if (o != q && all[size_t(o) * kFields + kStage] == all[size_t(q) * kFields + kStage])
      stage.push_back(c[size_t(o)]);
  auto& h = history_[size_t(q)];
  const double self = median(std::vector<double>(h.begin(), h.end()));
  const double ref = stage.empty() ? self : median(stage);
  const double best = stage.empty() ? c[size_t(q)] : *std::min_element(stage.begin(), stage.end());
  scores_[size_t(q)] = {on[size_t(q)], ratio(c[size_t(q)], ref),
                        ratio(c[size_t(q)], std::min(best, c[size_t(q)])),
                        ratio(c[size_t(q)], self)};
  h.push_back(c[size_t(q)]);
  if (h.size() > kHistory) h.pop_front();
  return ref;
}

void RankStats::judge(const std::vector<double>& all, int64_t first, int64_t last) {
  std::vector<double> c(static_cast<size_t>(size_));  // compute per step: the window's median
  for (int q = 0; q < size_; ++q) c[size_t(q)] = all[size_t(q) * kFields + kMedian];
  const std::vector<double> on = waited_on(all, size_);
  scores_.assign(size_t(size_), {});
  int named = -1;
  for (int q = 0; q < size_; ++q) {
    const double ref = score(all, c, on, q), s = scores_[size_t(q)][1];
    // slower than its peers by the ratio and by more than the noise floor.
    // Not also "the one its stage waited on": a window's waits on a machine
    // whose cores the ranks share are mostly the scheduler's, and a rank at
    // half speed was waited on less than another of its stage in some
    // windows (faults.md); its victims compute normally, so they score 1
    const bool slow = s > threshold_ && c[size_t(q)] - ref >= kMinExcessS;
    over_[size_t(q)] = slow ? over_[size_t(q)] + 1 : 0;
    // named once, at its second window in a row
    if (over_[size_t(q)] == 2 && (named < 0 || s > scores_[size_t(named)][1])) named = q;
  }
  if (named >= 0) name_straggler(all, named, prev_first_, last);
  prev_first_ = first;
}

void RankStats::name_straggler(const std::vector<double>& all, int q, int64_t first, int64_t last) {
  const auto& s = scores_[size_t(q)];
  bool alone = true;  // the only rank of its stage: compared with its earlier windows
  for (int o = 0; o < size_; ++o)
    if (o != q && all[size_t(o) * kFields + kStage] == all[size_t(q) * kFields + kStage])
      alone = false;
  const char* phase = phase_name(excess_phase(all, size_, q));
  const std::string& host = hosts_.at(size_t(q));
  std::fprintf(stderr,
               "trident: warning: straggler: rank %d (host %s) computed %.2fx the median of %s "
               "in steps %lld-%lld (runtime.straggler_threshold = %g, two windows of "
               "output.rank_stats_every = %d in a row), most of the excess in %s; the other "
               "ranks waited %.3f s on it\n",
               q, host.c_str(), s[1], alone ? "its earlier windows" : "its stage's other ranks",
               static_cast<long long>(first), static_cast<long long>(last), threshold_, every_,
               phase, s[0]);
  std::fflush(stderr);
  char detail[96];
  std::snprintf(detail, sizeof detail, "host %s, %s, waited on %.3f s", host.c_str(), phase, s[0]);
  event_ = RunEvent{last, "straggler", q, s[1], threshold_, detail};
  verdict_ = q + 1;
}

void RankStats::record(int agreed, RunFile& file) {
  verdict_ = 0;
  if (agreed <= 0) return;
  file.append_event(event_);  // rank 0's row is written
}

void RankStats::finish(RunFile& file) {
  if (every_ <= 0) return;
  take_in(file);
  if (window_steps_ > 0) {
    send_window(window_first_ + window_steps_ - 1);
    take_in(file);
  }
  int agreed = verdict_;
  comm_->broadcast(&agreed, sizeof agreed, 0);
  record(agreed, file);
}

}  // namespace trident::train
