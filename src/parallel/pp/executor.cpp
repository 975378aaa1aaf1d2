// Pipeline executor: walks one rank's lowered action list, moving activations
// and gradients between virtual stages (over pp, or in memory when the
// neighbour stage is on the same rank), and times every action.
#include "trident/parallel/pp/executor.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "trident/core/error.hpp"

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
  void allocate(Allocator& alloc, int64_t n) { t = Tensor::empty({n}, alloc); }
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
// to the pp wait counter, as Communicator::wait would have counted it.
template <typename Fn>
void wait_for(Communicator& pp, Request& r, double poll_s, Fn&& between_polls) {
  const double t0 = now_s();
  while (!pp.test(r)) {
    between_polls();
    const double waited = now_s() - t0;
    if (waited >= poll_s) {
      comm_counters().wait_s[int(pp.kind())] += waited;
      pp.wait(r);
      return;
    }
    std::this_thread::yield();
  }
  comm_counters().wait_s[int(pp.kind())] += now_s() - t0;
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

}  // namespace

ExecResult execute(const Schedule& s, int me, PipelineStage& stage, Communicator& pp, int step,
                   std::vector<TimelineEvent>* timeline, const ExecOptions& options) {
  return execute(s, me, stage, &pp, step, timeline, options);
}

ExecResult execute(const Schedule& s, int me, PipelineStage& stage, Communicator* pp, int step,
                   std::vector<TimelineEvent>* timeline, const ExecOptions& options) {
  const double t_entry = now_s();
  // pp = 1 may come without a communicator: its lowered list holds no
  // SEND/RECV, and the collectives below are skipped.
  const int pp_size = pp ? pp->size() : 1, pp_rank = pp ? pp->rank() : 0;
  TRIDENT_CHECK(pp_size == s.pp,
                "execute: schedule '" + s.name + "' has pp=" + std::to_string(s.pp) +
                    " but the pp communicator has " + std::to_string(pp_size) + " ranks");
  TRIDENT_CHECK(me == pp_rank, "execute: my_pp_rank " + std::to_string(me) +
                                   " is not this process's rank in pp (" + std::to_string(pp_rank) +
                                   ")");
  const int S = s.num_stages(), M = s.microbatches, last = S - 1;
  TRIDENT_CHECK(!pp || message_tag(s, last, M - 1, true) <= pp->max_tag(),
                "execute: " + std::to_string(M) + " micro-batches x " + std::to_string(S) +
                    " stages exceed the tag range of pp");
  const bool split = s.split_backward;
  const auto& row = s.ranks[me];
  auto at = [M](int st, int mb) { return static_cast<size_t>(st) * M + mb; };
  auto local = [&](int st) { return st >= 0 && st <= last && s.rank_of(st) == me; };

  // Buffers per (stage, micro-batch); declared before the requests so that a
  // request unwound by an exception is cancelled while its buffer still exists.
  std::vector<Buffer> input(static_cast<size_t>(S) * M), output(input.size()),
      grad_output(input.size()), grad_input(input.size());
  std::vector<Request> recv(row.size());
  std::vector<PendingSend> sends;

  std::vector<size_t> compute_at;  // positions of F/B/W in row
  for (size_t i = 0; i < row.size(); ++i)
    if (is_compute(row[i].op)) compute_at.push_back(i);
  size_t posted = 0, computes_started = 0;
  std::vector<char> is_posted(row.size(), 0);
  auto post = [&](size_t j) {
    const Action& a = row[j];
    if (is_posted[j] || (a.op != Op::RECV_F && a.op != Op::RECV_B)) return;
    is_posted[j] = 1;
    if (a.op == Op::RECV_F) {
      auto& buf = input[at(a.stage, a.microbatch)];
      buf.allocate(stage.allocator(), stage.boundary_numel(s.chunk_of(a.stage - 1), a.microbatch));
      recv[j] = pp->irecv(buf.data(), buf.bytes(), s.rank_of(a.stage - 1),
                          message_tag(s, a.stage - 1, a.microbatch, false));
    } else {
      auto& buf = grad_output[at(a.stage, a.microbatch)];
      buf.allocate(stage.allocator(), stage.boundary_numel(s.chunk_of(a.stage), a.microbatch));
      recv[j] = pp->irecv(buf.data(), buf.bytes(), s.rank_of(a.stage + 1),
                          message_tag(s, a.stage + 1, a.microbatch, true));
    }
  };
  auto post_receives_until = [&](size_t limit) {
    for (; posted < limit; ++posted) post(posted);
  };
  const std::vector<std::vector<size_t>> early = early_post_table(s, me);
  auto reap_sends = [&](bool block) {
    for (auto it = sends.begin(); it != sends.end();) {
      if (block) pp->wait(it->req);
      if (block || pp->test(it->req)) {
        it->buffer->reset();
        it = sends.erase(it);
      } else {
        ++it;
      }
    }
  };

  ExecResult res;
  res.actions.reserve(row.size());
  int live = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    const Action& a = row[i];
    const int st = a.stage, mb = a.microbatch, chunk = s.chunk_of(st);
    const size_t k = at(st, mb);
    const size_t ahead =
        computes_started + static_cast<size_t>(std::max(0, options.recv_lookahead));
    post_receives_until(
        std::max(i + 1, ahead < compute_at.size() ? compute_at[ahead] : row.size()));
    for (size_t j : early[i]) post(j);

    const double t0 = now_s();
    switch (a.op) {
      case Op::F: {
        auto& out = output[k];
        if (st < last) out.allocate(stage.allocator(), stage.boundary_numel(chunk, mb));
        stage.forward(chunk, mb, input[k].t, out.t);
        if (local(st + 1)) input[at(st + 1, mb)] = std::move(out);
        res.peak_inflight = std::max(res.peak_inflight, ++live);
        break;
      }
      case Op::B: {
        auto& gin = grad_input[k];
        if (st > 0) gin.allocate(stage.allocator(), input[k].t.numel());
        stage.backward(chunk, mb, grad_output[k].t, gin.t, !split);
        grad_output[k].reset();
        if (local(st - 1)) grad_output[at(st - 1, mb)] = std::move(gin);
        if (!split) {
          input[k].reset();
          --live;
        }
        break;
      }
      case Op::W:
        stage.backward_weight(chunk, mb);
        input[k].reset();
        --live;
        break;
      case Op::SEND_F:
        sends.push_back({pp->isend(output[k].data(), output[k].bytes(), s.rank_of(st + 1),
                                   message_tag(s, st, mb, false)),
                         &output[k]});
        res.bytes_sent += static_cast<int64_t>(output[k].bytes());
        break;
      case Op::SEND_B:
        sends.push_back({pp->isend(grad_input[k].data(), grad_input[k].bytes(),
                                   s.rank_of(st - 1), message_tag(s, st, mb, true)),
                         &grad_input[k]});
        res.bytes_sent += static_cast<int64_t>(grad_input[k].bytes());
        break;
      case Op::RECV_F:
      case Op::RECV_B:
        wait_for(*pp, recv[i], options.recv_poll_s, [&] { reap_sends(false); });
        break;
    }
    const double t1 = now_s();
    if (is_compute(a.op)) {
      res.busy_s += t1 - t0;
      ++computes_started;
    } else if (a.op == Op::RECV_F || a.op == Op::RECV_B) {
      res.recv_wait_s += t1 - t0;
    } else {
      res.send_s += t1 - t0;
    }
    res.actions.push_back({a, t0, t1});
    // Sends are reaped while a RECV waits and at the end, not after every
    // action: under Open MPI a test that finds nothing to do yields the
    // core when ranks oversubscribe it (mpi_yield_when_idle), which cost
    // 30-200 us per action here. Only a long run of sends without a receive
    // (more than kMaxPendingSends) is reaped in between.
    if (sends.size() > kMaxPendingSends) reap_sends(false);
  }
  const double t_sends = now_s();
  reap_sends(true);
  const double t_done = now_s();
  res.send_s += t_done - t_sends;
  res.elapsed_s = t_done - t_entry;
  res.overhead_s = res.elapsed_s - res.busy_s - res.recv_wait_s - res.send_s;

  // Makespan as the simulator counts it: from the first action's begin on any
  // rank to the last action's end on any rank (the simulator starts every
  // rank's first action at 0 and its sends take no time, so neither the entry
  // skew after a barrier nor the final wait for sends to complete is in it).
  // (-first begin, last end); a rank without actions (none in a valid schedule): entry, exit
  double span[2] = {-t_entry, t_done};
  if (!res.actions.empty()) {
    span[0] = -res.actions.front().t_begin_s;
    span[1] = res.actions.back().t_end_s;
  }
  if (pp_size > 1) pp->allreduce_max(span, 2);
  res.makespan_s = span[1] + span[0];
  res.bubble_fraction = res.makespan_s > 0 ? 1.0 - res.busy_s / res.makespan_s : 0.0;

  if (options.profiler)
    for (const auto& t : res.actions)
      options.profiler->span(prof::Span{op_name(t.action.op), t.action.stage,
                                        s.chunk_of(t.action.stage), t.action.microbatch,
                                        t.t_begin_s, t.t_end_s});
  if (timeline) {
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
  return res;
}

}  // namespace trident::pp
