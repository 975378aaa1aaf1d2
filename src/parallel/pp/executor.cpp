// Pipeline executor: walks one rank's lowered action list, moving activations
// and gradients between virtual stages (over pp, or in memory when the
// neighbour stage is on the same rank), and times every action.
#include "trident/parallel/pp/executor.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "trident/core/allocator.hpp"
#include "trident/core/error.hpp"
#include "trident/core/overlap.hpp"
#include "trident/kernels/backend.hpp"

namespace trident::pp {

int message_tag(const Schedule& s, int sending_stage, int microbatch, bool backward) {
  return (microbatch * s.num_stages() + sending_stage) * 2 + (backward ? 1 : 0);
}

namespace {

// A boundary buffer from the stage's allocator. Not zero-filled (every float
// is written by the receive or the stage before it is read); reset() drops
// the executor's handle (the stage may still hold the storage).
struct Buffer {
  Tensor t;
  void allocate(Allocator& alloc, int64_t n) {
    MemKindScope kind(MemKind::communication);
    t = Tensor::empty({n}, alloc);
  }
  void reset() { t = Tensor(); }
  void* data() const { return t.data_ptr(); }
  size_t bytes() const { return t.bytes(); }
};

// Sends whose buffers may stay alive before they are tested outside a wait.
constexpr size_t kMaxPendingSends = 8;

struct PendingSend {
  Request req;
  Buffer* buffer;  // freed once the send has completed
};

// A RECV: poll with yields for up to poll_s (ExecOptions::recv_poll_s), then
// hand the request to the Communicator's wait (deadline, backoff,
// accounting). between_polls() runs while the data is not there yet (it
// reaps finished sends); with poll_s = 0 it runs once. The polled time goes
// to the pp wait counter, as Communicator::wait would have counted it,
// less the tests inside it (Communicator::test counts its own time).
template <typename Fn>
void wait_for(Communicator& pp, Request& r, double poll_s, Fn&& between_polls) {
  const double t0 = now_s();
  const CommCounters before = pp.counters();
  auto account = [&] {
    const CommCounters tested = pp.counters() - before;
    double counted = 0;
    for (double w : tested.wait_s) counted += w;
    pp.counters().wait_s[int(pp.kind())] += std::max(0.0, now_s() - t0 - counted);
  };
  while (!pp.test(r)) {
    between_polls();
    if (now_s() - t0 >= poll_s) {
      account();
      pp.wait(r);
      return;
    }
    std::this_thread::yield();
  }
  account();
}

// Positions of the receives that rank `me`'s schedule posts early, by the
// position of the action that posts them.
std::vector<std::vector<size_t>> early_post_table(const Schedule& s, int me) {
  const auto& row = s.ranks[size_t(me)];
  std::vector<std::vector<size_t>> early(row.size());
  if (s.early_posts.empty()) return early;
  for (const auto& e : s.early_posts[size_t(me)]) {
    const auto recv = std::find(row.begin(), row.end(), e.recv);
    const auto at = std::find(row.begin(), row.end(), e.at);
    TRIDENT_CHECK(recv != row.end() && at < recv,
                  "execute: early post of " + e.recv.str() + " at " + e.at.str() +
                      " does not precede it on rank " + std::to_string(me));
    early[size_t(at - row.begin())].push_back(size_t(recv - row.begin()));
  }
  return early;
}

// A message's key in in_order_plan's replay: its send time, then its
// sender and its position on the sender.
struct ReplayKey {
  int64_t t = -1;
  int rank = 0;
  size_t pos = 0;
  bool operator<(const ReplayKey& o) const {
    return t != o.t ? t < o.t : rank != o.rank ? rank < o.rank : pos < o.pos;
  }
};

// Replays rank r's actions from position pc on, until a receive whose send
// has not happened yet; keys its messages. True when it moved.
bool replay_rank(const Schedule& s, int r, std::vector<ReplayKey>& sent,
                 std::vector<ReplayKey>& key, int64_t& now, size_t& pc) {
  const auto& row = s.ranks[size_t(r)];
  bool moved = false;
  for (size_t& i = pc; i < row.size(); ++i, moved = true) {
    const Action& a = row[i];
    if (is_compute(a.op)) {
      ++now;
    } else if (a.op == Op::SEND_F || a.op == Op::SEND_B) {
      const size_t tag = size_t(message_tag(s, a.stage, a.microbatch, a.op == Op::SEND_B));
      sent[tag] = key[i] = ReplayKey{++now, r, i};
    } else {
      const bool fwd = a.op == Op::RECV_F;
      const size_t tag =
          size_t(message_tag(s, fwd ? a.stage - 1 : a.stage + 1, a.microbatch, !fwd));
      if (sent[tag].t < 0) break;  // its send has not happened yet
      key[i] = sent[tag];
      now = std::max(now, sent[tag].t);
    }
  }
  return moved;
}

// The order in which rank `me` posts its messages on an in-order
// communicator (NCCL: no tags, one stream, a posted operation holds the
// stream until its partner is posted): the positions of its SEND/RECV
// actions, sorted by one key that every rank computes alike. The key of a
// message is its send time in a replay of the whole schedule in which every
// compute and every send takes one tick and a receive waits for its send
// (then the sender and its position break ties). Then the globally first
// message not yet delivered is always first in both its sender's and its
// receiver's streams, as long as each rank posts everything up to the
// message it waits for, so nothing deadlocks. A rank's sends keep their list
// order, and a send that follows a receive has a larger key, so no send is
// due before its compute; receives may be posted before their RECV action.
// A schedule whose replay deadlocks (which validate/simulate reject) keeps
// its list order.
std::vector<size_t> in_order_plan(const Schedule& s, int me) {
  const int S = s.num_stages(), M = s.microbatches;
  std::vector<ReplayKey> sent(size_t(message_tag(s, S - 1, M - 1, true)) + 1);
  std::vector<std::vector<ReplayKey>> key(size_t(s.pp));
  std::vector<int64_t> t(size_t(s.pp), 0);
  std::vector<size_t> pc(size_t(s.pp), 0);
  for (int r = 0; r < s.pp; ++r) key[size_t(r)].resize(s.ranks[size_t(r)].size());
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < s.pp; ++r)
      if (replay_rank(s, r, sent, key[size_t(r)], t[size_t(r)], pc[size_t(r)])) moved = true;
  }
  const auto& row = s.ranks[size_t(me)];
  std::vector<size_t> order;
  for (size_t i = 0; i < row.size(); ++i)
    if (!is_compute(row[i].op)) order.push_back(i);
  for (int r = 0; r < s.pp; ++r)
    if (pc[size_t(r)] < s.ranks[size_t(r)].size()) return order;  // deadlocked replay
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key[size_t(me)][a] < key[size_t(me)][b]; });
  return order;
}

void check_arguments(const Schedule& s, int me, const Communicator* pp) {
  // pp = 1 may come without a communicator: its lowered list holds no
  // SEND/RECV, and the collectives are skipped.
  const int pp_size = pp ? pp->size() : 1, pp_rank = pp ? pp->rank() : 0;
  TRIDENT_CHECK(pp_size == s.pp,
                "execute: schedule '" + s.name + "' has pp=" + std::to_string(s.pp) +
                    " but the pp communicator has " + std::to_string(pp_size) + " ranks");
  TRIDENT_CHECK(me == pp_rank, "execute: my_pp_rank " + std::to_string(me) +
                                   " is not this process's rank in pp (" + std::to_string(pp_rank) +
                                   ")");
  const int S = s.num_stages(), M = s.microbatches;
  TRIDENT_CHECK(!pp || message_tag(s, S - 1, M - 1, true) <= pp->max_tag(),
                "execute: " + std::to_string(M) + " micro-batches x " + std::to_string(S) +
                    " stages exceed the tag range of pp");
}

// One rank's walk through its action list: the boundary buffers per
// (stage, micro-batch), the posted receives and the sends in flight.
class ScheduleWalk {
 public:
  ScheduleWalk(const Schedule& s, int me, PipelineStage& stage, Communicator* pp,
               const ExecOptions& options)
      : s_(s),
        me_(me),
        stage_(stage),
        pp_(pp),
        options_(options),
        row_(s.ranks[size_t(me)]),
        M_(s.microbatches),
        last_(s.num_stages() - 1),
        input_(size_t(s.num_stages()) * size_t(M_)),
        output_(input_.size()),
        grad_output_(input_.size()),
        grad_input_(input_.size()),
        recv_(row_.size()),
        is_posted_(row_.size(), 0),
        early_(early_post_table(s, me)),
        in_order_(pp && pp->in_order_p2p()) {
    for (size_t i = 0; i < row_.size(); ++i)
      if (is_compute(row_[i].op)) compute_at_.push_back(i);
    if (in_order_) {
      plan_ = in_order_plan(s, me);
      plan_index_.assign(row_.size(), 0);
      for (size_t k = 0; k < plan_.size(); ++k) plan_index_[plan_[k]] = k;
    }
  }

  // Runs every action in order, timing each into res. On an in-order
  // communicator (NCCL) messages are posted in the common order of
  // in_order_plan instead of ahead by look-ahead. An overlapped F and its B
  // run as a pair (run_pair).
  void run(ExecResult& res) {
    res.actions.reserve(row_.size());
    for (size_t i = 0; i < row_.size(); ++i) {
      const size_t j = pair_end(i);
      if (j > i) {
        run_pair(i, j, res);
        i = j;
        continue;
      }
      step(i, res);
    }
  }

  // Waits for every send still in flight.
  void finish_sends() { reap_sends(true); }

 private:
  void step(size_t i, ExecResult& res) {
    if (in_order_ && !is_compute(row_[i].op)) {
      const double t0 = now_s();
      post_in_order_through(i, res);
      if (row_[i].op == Op::RECV_F || row_[i].op == Op::RECV_B) run_action(i, res);
      record(i, t0, now_s(), res);
      return;
    }
    post_receives_for(i);
    const double t0 = now_s();
    run_action(i, res);
    record(i, t0, now_s(), res);
  }

  // The position of the B that shares the slot of action i when i is an
  // overlapped F that runs as a pair with it: ExecOptions::overlap_pairs,
  // the B on another chunk (the two lanes must write disjoint layers), and
  // only sends between them (lower() puts both receives before the slot).
  // Else i.
  size_t pair_end(size_t i) const {
    const Action& a = row_[i];
    if (!options_.overlap_pairs || a.op != Op::F || !a.overlapped) return i;
    size_t j = i + 1;
    while (j < row_.size() && (row_[j].op == Op::SEND_F || row_[j].op == Op::SEND_B)) ++j;
    if (j == row_.size() || row_[j].op != Op::B) return i;
    return s_.chunk_of(row_[j].stage) != s_.chunk_of(a.stage) ? j : i;
  }

  // Actions i (the F) .. j (the B) as two lanes (core/overlap.hpp): the F
  // and the sends of its output in one, the B in the other, taking turns
  // where an EP exchange is in flight. The records go in list order; busy
  // time counts the slot's wall time once.
  void run_pair(size_t i, size_t j, ExecResult& res) {
    const size_t first = res.actions.size();
    const int device = kernels::current_device_index();
    const overlap::PairStats stats = overlap::run_pair(
        [&] {
          for (size_t k = i; k < j; ++k) step(k, res);
        },
        [&] { step(j, res); },
        [device] {
          if (kernels::device_runtime().count() > 0) kernels::device_runtime().set_current(device);
        });
    auto position = [&](const ActionTiming& t) {
      return std::find(row_.begin() + long(i), row_.begin() + long(j) + 1, t.action) - row_.begin();
    };
    std::stable_sort(
        res.actions.begin() + long(first), res.actions.end(),
        [&](const ActionTiming& a, const ActionTiming& b) { return position(a) < position(b); });
    const ActionTiming &f = res.actions[first], &b = res.actions.back();
    const double both =
        std::max(0.0, std::min(f.t_end_s, b.t_end_s) - std::max(f.t_begin_s, b.t_begin_s));
    res.busy_s -= both;  // the time both lanes' spans cover, counted twice by record()
    ++res.overlapped_pairs;
    res.overlap_exchanges += stats.exchanges;
    res.overlap_hidden += stats.hidden;
  }

  void record(size_t i, double t0, double t1, ExecResult& res) {
    const Action& a = row_[i];
    if (is_compute(a.op)) {
      res.busy_s += t1 - t0;
      ++computes_started_;
    } else if (a.op == Op::RECV_F || a.op == Op::RECV_B) {
      res.recv_wait_s += t1 - t0;
    } else {
      res.send_s += t1 - t0;
    }
    res.actions.push_back({a, t0, t1});
    // Sends are reaped while a RECV waits and at the end, not after every
    // action: under Open MPI a test that finds nothing to do yields the
    // core when ranks oversubscribe it (mpi_yield_when_idle), which costs
    // tens of microseconds per action. Only a long run of sends without a
    // receive (more than kMaxPendingSends) is reaped in between.
    if (sends_.size() > kMaxPendingSends) reap_sends(false);
  }

  // In-order mode: posts this rank's messages up to and including the one
  // of action i in the common order (in_order_plan), receives possibly
  // before their RECV action. A send is never due before its SEND action
  // (the plan orders a rank's sends as its list does).
  void post_in_order_through(size_t i, ExecResult& res) {
    for (const size_t through = plan_index_[i]; flushed_ <= through; ++flushed_) {
      const size_t k = plan_[flushed_];
      if (row_[k].op == Op::RECV_F || row_[k].op == Op::RECV_B) {
        post(k);
      } else {
        TRIDENT_CHECK(k == i, "execute: in-order plan posts " + row_[k].str() + " before " +
                                  row_[i].str() + " on rank " + std::to_string(me_));
        run_action(k, res);
      }
    }
  }

  size_t at(int st, int mb) const { return static_cast<size_t>(st) * size_t(M_) + size_t(mb); }
  bool local(int st) const { return st >= 0 && st <= last_ && s_.rank_of(st) == me_; }

  // Receives are posted up to recv_lookahead compute actions ahead, and
  // those the schedule posts early at action i (not on an in-order
  // communicator: post_in_order_through posts them).
  void post_receives_for(size_t i) {
    if (in_order_) return;
    const size_t ahead =
        computes_started_ + static_cast<size_t>(std::max(0, options_.recv_lookahead));
    const size_t limit =
        std::max(i + 1, ahead < compute_at_.size() ? compute_at_[ahead] : row_.size());
    for (; posted_ < limit; ++posted_) post(posted_);
    for (size_t j : early_[i]) post(j);
  }

  void post(size_t j) {
    const Action& a = row_[j];
    if (is_posted_[j] || (a.op != Op::RECV_F && a.op != Op::RECV_B)) return;
    is_posted_[j] = 1;
    const bool fwd = a.op == Op::RECV_F;
    const int from = fwd ? a.stage - 1 : a.stage + 1;  // the sending stage
    auto& buf = (fwd ? input_ : grad_output_)[at(a.stage, a.microbatch)];
    buf.allocate(stage_.allocator(),
                 stage_.boundary_numel(s_.chunk_of(fwd ? a.stage - 1 : a.stage), a.microbatch));
    recv_[j] = pp_->irecv(buf.data(), buf.bytes(), s_.rank_of(from),
                          message_tag(s_, from, a.microbatch, !fwd));
  }

  void reap_sends(bool block) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (block) pp_->wait(it->req);
      if (block || pp_->test(it->req)) {
        it->buffer->reset();
        it = sends_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void run_action(size_t i, ExecResult& res) {
    const Action& a = row_[i];
    // What F, B and W allocate (the boundary buffers say otherwise).
    MemKindScope kind(MemKind::activations);
    const int st = a.stage, mb = a.microbatch;
    switch (a.op) {
      case Op::F:
        forward(st, mb, res);
        break;
      case Op::B:
        backward(st, mb);
        break;
      case Op::W:
        stage_.backward_weight(s_.chunk_of(st), mb);
        input_[at(st, mb)].reset();
        --live_;
        break;
      case Op::SEND_F:
        send(output_[at(st, mb)], st + 1, message_tag(s_, st, mb, false), res);
        break;
      case Op::SEND_B:
        send(grad_input_[at(st, mb)], st - 1, message_tag(s_, st, mb, true), res);
        break;
      case Op::RECV_F:
      case Op::RECV_B:
        wait_for(*pp_, recv_[i], options_.recv_poll_s, [&] { reap_sends(false); });
        break;
    }
  }

  void forward(int st, int mb, ExecResult& res) {
    const int chunk = s_.chunk_of(st);
    auto& out = output_[at(st, mb)];
    if (st < last_) out.allocate(stage_.allocator(), stage_.boundary_numel(chunk, mb));
    stage_.forward(chunk, mb, input_[at(st, mb)].t, out.t);
    if (local(st + 1)) input_[at(st + 1, mb)] = std::move(out);
    res.peak_inflight = std::max(res.peak_inflight, ++live_);
    if (s_.forward_only) {  // no backward will read the input or what F kept
      stage_.discard_forward(chunk, mb);
      input_[at(st, mb)].reset();
      --live_;
    }
  }

  void backward(int st, int mb) {
    const size_t k = at(st, mb);
    const bool split = s_.split_backward;
    auto& gin = grad_input_[k];
    if (st > 0) gin.allocate(stage_.allocator(), input_[k].t.numel());
    stage_.backward(s_.chunk_of(st), mb, grad_output_[k].t, gin.t, !split);
    grad_output_[k].reset();
    if (local(st - 1)) grad_output_[at(st - 1, mb)] = std::move(gin);
    if (!split) {
      input_[k].reset();
      --live_;
    }
  }

  void send(Buffer& buf, int to_stage, int tag, ExecResult& res) {
    sends_.push_back({pp_->isend(buf.data(), buf.bytes(), s_.rank_of(to_stage), tag), &buf});
    res.bytes_sent += static_cast<int64_t>(buf.bytes());
  }

  const Schedule& s_;
  const int me_;
  PipelineStage& stage_;
  Communicator* pp_;
  const ExecOptions& options_;
  const std::vector<Action>& row_;
  const int M_, last_;
  // Buffers are declared before the requests so that a request unwound by an
  // exception is cancelled while its buffer still exists.
  std::vector<Buffer> input_, output_, grad_output_, grad_input_;
  std::vector<Request> recv_;
  std::vector<PendingSend> sends_;
  std::vector<char> is_posted_;
  const std::vector<std::vector<size_t>> early_;
  const bool in_order_;       // pp_->in_order_p2p()
  std::vector<size_t> plan_;  // in-order mode: this rank's SEND/RECV positions, in posting order
  std::vector<size_t> plan_index_;  // position -> index in plan_
  size_t flushed_ = 0;              // plan_[0, flushed_) are posted
  std::vector<size_t> compute_at_;  // positions of F/B/W in the row
  size_t posted_ = 0, computes_started_ = 0;
  int live_ = 0;
};

// Makespan as the simulator counts it: from the first action's begin on any
// rank to the last action's end on any rank (the simulator starts every
// rank's first action at 0 and its sends take no time, so neither the entry
// skew after a barrier nor the final wait for sends to complete is in it).
void measure_makespan(ExecResult& res, Communicator* pp, double t_entry, double t_done) {
  // (-first begin, last end); a rank without actions (none in a valid schedule): entry, exit
  double span[2] = {-t_entry, t_done};
  if (!res.actions.empty()) {
    span[0] = -res.actions.front().t_begin_s;
    span[1] = res.actions.back().t_end_s;
  }
  if (pp && pp->size() > 1) pp->allreduce_max(span, 2);
  res.makespan_s = span[1] + span[0];
  res.bubble_fraction = res.makespan_s > 0 ? 1.0 - res.busy_s / res.makespan_s : 0.0;
}

// The measured actions to the profiler sink and the run file's timeline.
void report_actions(const ExecResult& res, const Schedule& s, int me, const Communicator* pp,
                    int step, std::vector<TimelineEvent>* timeline, prof::Sink* profiler) {
  if (profiler)
    for (const auto& t : res.actions)
      profiler->span(prof::Span{op_name(t.action.op), t.action.stage, s.chunk_of(t.action.stage),
                                t.action.microbatch, t.t_begin_s, t.t_end_s});
  if (!timeline) return;
  const int world_rank = pp ? pp->world_rank_of(me) : 0;
  for (const auto& t : res.actions) {
    TimelineEvent e;
    e.rank = world_rank;
    e.step = step;
    e.kind = op_name(t.action.op);
    e.stage = t.action.stage;
    e.chunk = s.chunk_of(t.action.stage);
    e.microbatch = t.action.microbatch;
    e.t_begin_s = t.t_begin_s;
    e.t_end_s = t.t_end_s;
    timeline->push_back(std::move(e));
  }
}

}  // namespace

ExecResult execute(const Schedule& s, int me, PipelineStage& stage, Communicator& pp, int step,
                   std::vector<TimelineEvent>* timeline, const ExecOptions& options) {
  return execute(s, me, stage, &pp, step, timeline, options);
}

ExecResult execute(const Schedule& s, int me, PipelineStage& stage, Communicator* pp, int step,
                   std::vector<TimelineEvent>* timeline, const ExecOptions& options) {
  const double t_entry = now_s();
  check_arguments(s, me, pp);
  ExecResult res;
  {
    ScheduleWalk walk(s, me, stage, pp, options);
    walk.run(res);
    const double t_sends = now_s();
    walk.finish_sends();
    const double t_done = now_s();
    res.send_s += t_done - t_sends;
    res.elapsed_s = t_done - t_entry;
    res.overhead_s = res.elapsed_s - res.busy_s - res.recv_wait_s - res.send_s;
    measure_makespan(res, pp, t_entry, t_done);
  }
  report_actions(res, s, me, pp, step, timeline, options.profiler);
  return res;
}

}  // namespace trident::pp
