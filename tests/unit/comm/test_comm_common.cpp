// The common part of Communicator, reached through the interface with a
// scripted backend (no MPI): requests complete after a set number of polls
// or never; the watchdog throws TimeoutError naming rank, operation and peer
// after timeout_s and calls the backend's on_timeout; bytes, calls and wait
// time are accounted per kind as comm.hpp documents.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/error.hpp"

using namespace trident;

namespace {

// Completes on the n-th poll (never when n < 0).
class ScriptedOp final : public PendingOp {
 public:
  explicit ScriptedOp(int n) : left_(n) {}
  bool poll() override { return left_ >= 0 && --left_ <= 0; }

 private:
  int left_;
};

// A group of 4 whose rank 1 is world rank 5; every operation takes
// `polls` polls. Records what the common part handed over.
class ScriptedComm final : public Communicator {
 public:
  ScriptedComm(double timeout_s, int polls)
      : Communicator(CommKind::ep, "scripted", timeout_s, 1, {4, 5, 6, 7}), polls_(polls) {}
  const char* backend_name() const override { return "scripted"; }
  Device device() const override { return Device::cpu(); }
  int max_tag() const override { return 32767; }
  Communicator& host() override { return *this; }
  std::unique_ptr<Communicator> split(int, int, CommKind, std::string) override { return nullptr; }
  std::unique_ptr<Communicator> split_node(CommKind, std::string) override { return nullptr; }

  int timeouts = 0;
  std::vector<size_t> reduce_pieces;
  size_t last_elem_bytes = 0;

 protected:
  std::unique_ptr<PendingOp> op() { return std::make_unique<ScriptedOp>(polls_); }
  std::unique_ptr<PendingOp> post(const CommOp& o) override {
    if (o.kind == CommOp::Kind::allreduce) reduce_pieces.push_back(o.count);
    if (o.kind == CommOp::Kind::alltoallv) last_elem_bytes = o.elem_bytes;
    return op();
  }
  size_t max_elements_per_reduction() const override { return 10; }
  void on_timeout() override { ++timeouts; }

 private:
  int polls_;
};

}  // namespace

TEST_CASE("a request that never completes times out with rank, operation and peer", "[comm]") {
  ScriptedComm c(0.2, -1);
  float buf[4];
  Request r = c.irecv(buf, sizeof buf, 3, 42);
  const CommCounters before = c.counters();
  const double t0 = monotonic_s();
  std::string msg;
  try {
    c.wait(r);
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  const double waited = monotonic_s() - t0;
  const CommCounters d = c.counters() - before;
  INFO(msg);
  CHECK(waited >= 0.2);
  CHECK(waited < 5.0);
  CHECK(msg ==
        "rank 5: recv of 16 B from rank 3 (world 7, tag 42) on scripted (ep) timed out "
        "after 0.2s (the peer this rank waited on: stopped, dead, or itself waiting on another "
        "rank)");
  CHECK(c.timeouts == 1);
  CHECK(d.calls[int(CommKind::ep)] == 0);  // no completed call, but the lost time is counted
  CHECK(d.bytes_sent[int(CommKind::ep)] == 0);
  CHECK(d.wait_s[int(CommKind::ep)] >= 0.2);
}

TEST_CASE("completed operations are accounted once, by wait or by test", "[comm]") {
  ScriptedComm c(10.0, 3);
  char buf[100];
  const CommCounters before = c.counters();
  Request s = c.isend(buf, 100, 0, 1);
  c.wait(s);
  CHECK_FALSE(s.active());
  c.wait(s);  // a finished request waits for nothing and counts nothing
  Request t = c.isend(buf, 60, 2, 1);
  CHECK_FALSE(c.test(t));
  CHECK_FALSE(c.test(t));
  CHECK(c.test(t));
  CHECK(c.test(t));
  Request rcv = c.irecv(buf, 100, 0, 1);
  c.wait(rcv);
  double x[25];
  c.allreduce_sum(x, 25);   // pieces of 10: 10, 10, 5, each its own call
  c.broadcast(buf, 40, 1);  // this rank is the root: its bytes count
  c.broadcast(buf, 40, 0);  // not the root: nothing sent
  int64_t cnt[8];
  c.alltoall(cnt, cnt + 4, 1);
  const CommCounters d = c.counters() - before;
  CHECK(c.reduce_pieces == std::vector<size_t>{10, 10, 5});
  CHECK(c.last_elem_bytes == 8);
  const double expect = 100 + 60 + 0 + 25 * 8 + 40 + 0 + 3 * 8;
  CHECK(d.bytes_sent[int(CommKind::ep)] == expect);
  CHECK(d.calls[int(CommKind::ep)] == 3 + 3 + 2 + 1);
}

TEST_CASE("arguments are checked before anything is posted", "[comm]") {
  ScriptedComm c(1.0, 1);
  char buf[8];
  CHECK_THROWS_AS(c.isend(buf, 8, 4, 0), Error);
  CHECK_THROWS_AS(c.irecv(buf, 8, -1, 0), Error);
  CHECK_THROWS_AS(c.broadcast(buf, 8, 4), Error);
  std::vector<int64_t> three(3, 0), four(4, 0);
  CHECK_THROWS_AS(c.alltoallv(buf, three, four, buf, four, four, 4), Error);
  CHECK(c.world_rank_of(2) == 6);
  CHECK_THROWS_AS(c.world_rank_of(4), Error);
  CHECK(c.reduce_pieces.empty());
}

TEST_CASE("the host backend's compute-stream wait is a host wait", "[comm]") {
  ScriptedComm c(1.0, 2);
  char buf[8];
  CHECK(c.compute_stream() == nullptr);
  Request r = c.isend(buf, 8, 0, 0);
  c.wait_on_compute(r);
  CHECK_FALSE(r.active());
}
