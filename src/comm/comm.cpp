// The common part of every Communicator: argument checks, the watchdog loop
// that polls any backend's pending operation against the deadline and turns
// a lost peer into a TimeoutError naming the rank, the operation and the
// peer, and the byte/time accounting per communicator kind.
#include "trident/comm/comm.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "trident/comm/flight_recorder.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"

namespace trident {

namespace {

std::string format_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%gs", s);
  return b;
}

// Poll with a little spinning first (latency of small messages), then yield
// so that oversubscribed ranks sharing a core can make progress.
class Backoff {
 public:
  void pause() {
    ++n_;
    if (n_ < 64) return;
    if (n_ < 2048) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  int n_ = 0;
};

}  // namespace

const char* comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::cp:
      return "cp";
    case CommKind::pp:
      return "pp";
    case CommKind::ep:
      return "ep";
    case CommKind::dp:
      return "dp";
    case CommKind::world:
      return "world";
  }
  return "?";
}

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::f32:
    case ElemType::i32:
      return 4;
    case ElemType::f64:
    case ElemType::i64:
      return 8;
  }
  return 0;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return "float";
    case ElemType::f64:
      return "double";
    case ElemType::i32:
      return "int";
    case ElemType::i64:
      return "int64_t";
  }
  return "?";
}

CommCounters CommCounters::operator-(const CommCounters& o) const {
  CommCounters d;
  d.longest_wait_s = longest_wait_s;
  for (size_t i = 0; i < bytes_sent.size(); ++i) {
    d.bytes_sent[i] = bytes_sent[i] - o.bytes_sent[i];
    d.wait_s[i] = wait_s[i] - o.wait_s[i];
    d.calls[i] = calls[i] - o.calls[i];
  }
  return d;
}

// ---- Communicator: members and the watchdog ----

Communicator::Communicator(CommKind kind, std::string name, double timeout_s, int rank,
                           std::vector<int> world_ranks)
    : kind_(kind),
      name_(std::move(name)),
      timeout_s_(timeout_s),
      rank_(rank),
      world_ranks_(std::move(world_ranks)) {
  TRIDENT_CHECK(timeout_s > 0, "Communicator '" + name_ + "': timeout_s must be > 0");
  TRIDENT_CHECK(rank_ >= 0 && rank_ < size(), "Communicator '" + name_ + "': rank outside group");
  flight_group_ = flight_register_group(kind_, name_, rank_, world_ranks_);
}

Communicator::~Communicator() = default;

int Communicator::world_rank_of(int group_rank) const {
  TRIDENT_CHECK(group_rank >= 0 && group_rank < size(),
                "rank " + std::to_string(group_rank) + " is not in " + name_);
  return world_ranks_[size_t(group_rank)];
}

namespace {
FailureNoticeProbe g_notice_probe = nullptr;
}  // namespace

void set_failure_notice_probe(FailureNoticeProbe probe) { g_notice_probe = probe; }

void Communicator::await(PendingOp& op, const std::string& what, CommKind kind, double bytes_sent,
                         uint64_t flight) {
  const double t0 = monotonic_s();
  flight_waiting(flight);
  Backoff backoff;
  for (unsigned polls = 1; !op.poll(); ++polls) {
    if (polls % 256 == 0) flight_poll();  // SIGUSR2: the records of a wait that seems stuck
    // Another rank failed and said so: end now rather than at the deadline.
    int failed_rank = 0, code = 0;
    const double waited = monotonic_s() - t0;
    // At the deadline too: a rank stopped past its deadline and then resumed
    // is not the one that knows what happened.
    if ((polls % 256 == 0 || waited > timeout_s_) && g_notice_probe &&
        g_notice_probe(&failed_rank, &code))
      throw PeerFailure(failed_rank, code);
    if (waited > timeout_s_) {
      counters().wait_s[int(kind)] += waited;  // time lost, but no completed call
      on_timeout();
      flight_end(flight, FlightState::timed_out);
      const int me = world_ranks_[size_t(rank_)];
      flight_dump("rank " + std::to_string(me) + ": " + what + " on " + name_ + " timed out");
      throw TimeoutError("rank " + std::to_string(me) + ": " + what + " on " + name_ + " (" +
                         comm_kind_name(kind) + ") timed out after " + format_seconds(timeout_s_));
    }
    backoff.pause();
  }
  flight_end(flight, FlightState::completed);
  counters().add(kind, bytes_sent, monotonic_s() - t0);
}

namespace {

// What an operation moves, for its flight record: the bytes of a message or
// of this rank's data (an alltoallv's: all it sends).
uint64_t flight_bytes(const CommOp& op, int group_size) {
  switch (op.kind) {
    case CommOp::Kind::allreduce:
    case CommOp::Kind::reduce:
      return op.count * elem_size(op.type);
    case CommOp::Kind::reduce_scatter:
      return op.count * size_t(group_size) * elem_size(op.type);
    case CommOp::Kind::alltoallv: {
      int64_t n = 0;
      for (int i = 0; i < group_size; ++i) n += op.send_counts[i];
      return uint64_t(n) * op.elem_bytes;
    }
    case CommOp::Kind::barrier:
      return 0;
    default:
      return op.bytes;
  }
}

}  // namespace

std::unique_ptr<PendingOp> Communicator::post_recorded(const CommOp& op, uint64_t* flight) {
  const bool p2p = op.kind == CommOp::Kind::send || op.kind == CommOp::Kind::recv;
  const bool rooted = p2p || op.kind == CommOp::Kind::broadcast || op.kind == CommOp::Kind::reduce;
  *flight = flight_post(flight_group_, op.kind, rooted ? world_ranks_[size_t(op.peer)] : -1,
                        p2p ? op.tag : 0, flight_bytes(op, size()), flight_seq_[p2p ? 1 : 0]++);
  return post(op);
}

// ---- point to point ----

Request Communicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  TRIDENT_CHECK(peer >= 0 && peer < size(), "isend to rank " + std::to_string(peer) + " outside " +
                                                name_ + " of size " + std::to_string(size()));
  Request r;
  r.op_ = post_recorded(
      {.kind = CommOp::Kind::send, .in = buf, .bytes = bytes, .peer = peer, .tag = tag},
      &r.flight_);
  r.what_ = "send of " + std::to_string(bytes) + " B to rank " + std::to_string(peer) + " (world " +
            std::to_string(world_ranks_[size_t(peer)]) + ", tag " + std::to_string(tag) + ")";
  r.kind_ = kind_;
  r.bytes_ = double(bytes);
  return r;
}

Request Communicator::irecv(void* buf, size_t bytes, int peer, int tag) {
  TRIDENT_CHECK(peer >= 0 && peer < size(), "irecv from rank " + std::to_string(peer) +
                                                " outside " + name_ + " of size " +
                                                std::to_string(size()));
  Request r;
  r.op_ = post_recorded(
      {.kind = CommOp::Kind::recv, .out = buf, .bytes = bytes, .peer = peer, .tag = tag},
      &r.flight_);
  r.what_ = "recv of " + std::to_string(bytes) + " B from rank " + std::to_string(peer) +
            " (world " + std::to_string(world_ranks_[size_t(peer)]) + ", tag " +
            std::to_string(tag) + ")";
  r.kind_ = kind_;
  r.bytes_ = 0;
  return r;
}

void Communicator::wait(Request& r) {
  if (!r.active()) return;
  try {
    await(*r.op_, r.what_, r.kind_, r.bytes_, r.flight_);
  } catch (const TimeoutError& e) {
    // The peer named is the one this rank waited on. When a rank stops, the
    // ranks waiting on it wait, and so do the ranks waiting on those: the
    // first deadline to pass may be one link further down that chain.
    throw TimeoutError(std::string(e.what()) +
                       " (the peer this rank waited on: stopped, dead, or itself waiting on "
                       "another rank)");
  }
  r.op_.reset();
}

void Communicator::wait_all(std::vector<Request>& rs) {
  // One deadline per request keeps the message precise about which peer is
  // missing; a slow peer does not consume the others' budget because the
  // earlier requests are usually complete by the time the later are polled.
  for (auto& r : rs) wait(r);
}

bool Communicator::test(Request& r) {
  if (!r.active()) return true;
  // A test's time is communication too: it may copy a message, and under
  // Open MPI one that finds nothing to do on an oversubscribed node yields
  // the core (mpi_yield_when_idle), so a rank whose peer is slow loses
  // time in its tests that would otherwise look like its own compute.
  const double t0 = monotonic_s();
  const bool done = r.op_->poll();
  counters().wait_s[int(r.kind_)] += monotonic_s() - t0;
  if (!done) return false;
  flight_end(r.flight_, FlightState::completed);
  counters().add(r.kind_, r.bytes_, 0.0);
  r.op_.reset();
  return true;
}

// ---- collectives ----

void Communicator::allreduce(void* data, size_t n, ElemType type, ReduceOp op, SumOrder order) {
  static const char* op_names[] = {"sum", "max", "min"};
  const size_t esize = elem_size(type), piece = max_elements_per_reduction();
  size_t off = 0;
  do {
    const size_t len = std::min(piece, n - off);
    uint64_t flight = 0;
    auto pending = post_recorded({.kind = CommOp::Kind::allreduce,
                                  .out = static_cast<char*>(data) + off * esize,
                                  .count = len,
                                  .type = type,
                                  .reduce = op,
                                  .order = order},
                                 &flight);
    await(*pending,
          std::string("allreduce_") + op_names[int(op)] + " of " + std::to_string(len) + " " +
              elem_name(type) + " over " + std::to_string(size()) + " ranks",
          kind_, double(len * esize), flight);
    off += len;
  } while (off < n);
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  TRIDENT_CHECK(root >= 0 && root < size(),
                "broadcast root " + std::to_string(root) + " outside " + name_);
  uint64_t flight = 0;
  auto pending = post_recorded(
      {.kind = CommOp::Kind::broadcast, .out = data, .bytes = bytes, .peer = root}, &flight);
  await(*pending,
        "broadcast of " + std::to_string(bytes) + " B from rank " + std::to_string(root) +
            " (world " + std::to_string(world_ranks_[size_t(root)]) + ")",
        kind_, rank_ == root ? double(bytes) : 0.0, flight);
}

void Communicator::reduce_scatter_sum(const float* in, float* out, size_t count, SumOrder order) {
  TRIDENT_CHECK(count <= max_elements_per_reduction(),
                "reduce_scatter on " + name_ + ": " + std::to_string(count) +
                    " elements per rank exceed what one operation takes");
  uint64_t flight = 0;
  auto pending = post_recorded({.kind = CommOp::Kind::reduce_scatter,
                                .in = in,
                                .out = out,
                                .count = count,
                                .type = ElemType::f32,
                                .reduce = ReduceOp::sum,
                                .order = order},
                               &flight);
  await(*pending,
        "reduce_scatter_sum of " + std::to_string(count) + " float per rank over " +
            std::to_string(size()) + " ranks",
        kind_, double(count * size_t(size()) * sizeof(float)), flight);
}

// One posted sum of n floats (allreduce, or reduce to op.peer), as a
// request that carries what it is and the bytes it sends.
Request Communicator::post_sum(CommOp op, const std::string& what) {
  TRIDENT_CHECK(op.count <= max_elements_per_reduction(),
                what + " on " + name_ + ": " + std::to_string(op.count) +
                    " elements exceed what one operation takes");
  op.type = ElemType::f32;
  op.reduce = ReduceOp::sum;
  Request r;
  r.op_ = post_recorded(op, &r.flight_);
  r.what_ =
      what + " of " + std::to_string(op.count) + " float" +
      (op.kind == CommOp::Kind::reduce ? " to rank " + std::to_string(op.peer) + " (world " +
                                             std::to_string(world_ranks_[size_t(op.peer)]) + ")"
                                       : std::string()) +
      " over " + std::to_string(size()) + " ranks";
  r.kind_ = kind_;
  r.bytes_ = double(op.count * sizeof(float));
  return r;
}

Request Communicator::iallreduce_sum(float* data, size_t n, SumOrder order) {
  return post_sum({.kind = CommOp::Kind::allreduce, .out = data, .count = n, .order = order},
                  "iallreduce_sum");
}

Request Communicator::ireduce_sum(float* data, size_t n, int root, SumOrder order) {
  TRIDENT_CHECK(root >= 0 && root < size(),
                "reduce root " + std::to_string(root) + " outside " + name_);
  return post_sum(
      {.kind = CommOp::Kind::reduce, .out = data, .count = n, .peer = root, .order = order},
      "ireduce_sum");
}

void Communicator::allgather(const void* in, void* out, size_t bytes) {
  uint64_t flight = 0;
  auto pending = post_recorded(
      {.kind = CommOp::Kind::allgather, .in = in, .out = out, .bytes = bytes}, &flight);
  await(*pending,
        "allgather of " + std::to_string(bytes) + " B per rank over " + std::to_string(size()) +
            " ranks",
        kind_, double(bytes), flight);
}

namespace {

CommOp alltoallv_op(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                    size_t elem_bytes) {
  return {.kind = CommOp::Kind::alltoallv,
          .in = send,
          .out = recv,
          .send_counts = send_counts,
          .send_displs = send_displs,
          .recv_counts = recv_counts,
          .recv_displs = recv_displs,
          .elem_bytes = elem_bytes};
}

}  // namespace

void Communicator::alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs, void* recv,
                             const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs, size_t elem_bytes) {
  const size_t p = size_t(size());
  TRIDENT_CHECK(send_counts.size() == p && send_displs.size() == p && recv_counts.size() == p &&
                    recv_displs.size() == p,
                "alltoallv on " + name_ + ": counts and displacements need " + std::to_string(p) +
                    " entries");
  TRIDENT_CHECK(elem_bytes > 0, "alltoallv on " + name_ + ": element size 0");
  uint64_t flight = 0;
  auto pending = post_recorded(alltoallv_op(send, send_counts.data(), send_displs.data(), recv,
                                            recv_counts.data(), recv_displs.data(), elem_bytes),
                               &flight);
  int64_t out_elems = 0, in_elems = 0;
  for (size_t i = 0; i < p; ++i) {
    if (int(i) == rank_) continue;  // the part kept locally crosses no link
    out_elems += send_counts[i];
    in_elems += recv_counts[i];
  }
  await(*pending,
        "alltoallv (sending " + std::to_string(out_elems) + ", receiving " +
            std::to_string(in_elems) + " elements of " + std::to_string(elem_bytes) + " B) over " +
            std::to_string(size()) + " ranks",
        kind_, double(out_elems) * double(elem_bytes), flight);
}

void Communicator::alltoall(const int64_t* send, int64_t* recv, size_t per_peer) {
  // An all-to-all-v with equal blocks: one path for both in every backend.
  // The element is one peer's block (an empty block is 0 elements of 8 B).
  const size_t p = size_t(size());
  const std::vector<int64_t> counts(p, per_peer > 0 ? 1 : 0);
  std::vector<int64_t> displs(p);
  for (size_t i = 0; i < p; ++i) displs[i] = int64_t(i);
  uint64_t flight = 0;
  auto pending =
      post_recorded(alltoallv_op(send, counts.data(), displs.data(), recv, counts.data(),
                                 displs.data(), std::max<size_t>(per_peer, 1) * sizeof(int64_t)),
                    &flight);
  await(*pending,
        "alltoall of " + std::to_string(per_peer) + " int64 per peer over " +
            std::to_string(size()) + " ranks",
        kind_, double(per_peer * sizeof(int64_t) * (p - 1)), flight);
}

void Communicator::barrier() {
  uint64_t flight = 0;
  auto pending = post_recorded({.kind = CommOp::Kind::barrier}, &flight);
  await(*pending, "barrier over " + std::to_string(size()) + " ranks", kind_, 0.0, flight);
}

// ---- agreement ----

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  comm.broadcast(&n, sizeof n, root);
  std::string out = s;
  out.resize(static_cast<size_t>(n));
  if (n > 0) comm.broadcast(out.data(), static_cast<size_t>(n), root);
  return out;
}

std::vector<std::vector<char>> gather_bytes_to_root(Communicator& comm, std::vector<char> mine,
                                                    int root, int tag) {
  const int64_t my = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(comm.size()), 0);
  comm.allgather(&my, sizes.data(), sizeof my);
  if (comm.rank() != root) {
    if (my > 0) {
      Request r = comm.isend(mine.data(), mine.size(), root, tag);
      comm.wait(r);
    }
    return {};
  }
  std::vector<std::vector<char>> parts(static_cast<size_t>(comm.size()));
  std::vector<Request> reqs;
  for (int src = 0; src < comm.size(); ++src) {
    std::vector<char>& part = parts[static_cast<size_t>(src)];
    if (src == root) continue;
    part.resize(static_cast<size_t>(sizes[static_cast<size_t>(src)]));
    if (!part.empty()) reqs.push_back(comm.irecv(part.data(), part.size(), src, tag));
  }
  if (!reqs.empty()) comm.wait_all(reqs);
  parts[static_cast<size_t>(root)] = std::move(mine);
  return parts;
}

CheckOutcome agree_on_check(Communicator& comm, bool passed, const std::string& message) {
  CheckOutcome out;
  int all = passed ? 1 : 0;
  comm.allreduce_min(&all, 1);
  if (all) return out;
  out.all_passed = false;
  out.rank = passed ? comm.size() : comm.rank();
  comm.allreduce_min(&out.rank, 1);
  out.message = broadcast_string(comm, message, out.rank);
  return out;
}

}  // namespace trident
