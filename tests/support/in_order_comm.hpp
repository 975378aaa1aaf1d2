// A test Communicator with NCCL's point-to-point semantics, for ranks that
// run as threads of one process (no MPI, no GPU):
//  - one stream per rank: every operation a rank posts completes in posting
//    order, and a posted operation holds the stream until it is matched;
//  - rendezvous: a send is matched only by the receive at the head of its
//    peer's stream (and the other way round), so two ranks whose heads are
//    both sends to each other deadlock, as they do on NCCL;
//  - begin_group()/end_group(): the grouped operations are one unit at the
//    head of the stream; each finds its partner among the peer's head unit,
//    and the unit completes once all of them are matched;
//  - no tags: the k-th send from a to b meets b's k-th receive from a. Tags
//    are still compared, and a mismatch (NCCL would deliver the wrong
//    message) or a size mismatch is an error that every later poll throws.
// A deadlock shows as a TimeoutError of Communicator's watchdog on every
// rank. With record_uses, like NcclCommunicator, it records the buffers of
// each point-to-point operation as in use until it is matched
// (kernels/buffer_uses.hpp), so that an allocator that asks before a free
// keeps them (tests/unit/comm/test_buffer_lifetime.cpp). Host collectives (the executor's
// makespan reduction) do not go through the stream: NcclCommunicator sends host buffers to its MPI
// host group, so here they meet at a separate rendezvous.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/comm/op_buffers.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/buffer_uses.hpp"

namespace trident::test {

class InOrderWorld {
 public:
  explicit InOrderWorld(int ranks) : streams_(size_t(ranks)), coll_in_(size_t(ranks)) {}
  int size() const { return int(streams_.size()); }

  struct P2p {
    bool send = false;
    int me = 0, peer = 0, tag = 0;
    const void* in = nullptr;
    void* out = nullptr;
    size_t bytes = 0;
    bool matched = false;
    std::atomic<bool> done{false};  // read without the lock by a buffer's fence
  };
  using Unit = std::vector<std::shared_ptr<P2p>>;

  // Appends op to rank me's stream: to the open group's unit, or as a unit
  // of its own.
  void post(int me, std::shared_ptr<P2p> op, bool grouped) {
    std::lock_guard<std::mutex> lock(m_);
    auto& s = streams_[size_t(me)];
    if (grouped) {
      if (open_[me]) {
        s.back().push_back(std::move(op));
        return;
      }
      open_[me] = true;
    }
    s.push_back(Unit{std::move(op)});
  }
  void close_group(int me) {
    std::lock_guard<std::mutex> lock(m_);
    open_[me] = false;
  }
  void open_group(int me) {
    std::lock_guard<std::mutex> lock(m_);
    open_[me] = false;  // the first grouped post opens the unit
    grouping_[me] = true;
  }
  bool grouping(int me) {
    std::lock_guard<std::mutex> lock(m_);
    return grouping_[me];
  }
  void end_grouping(int me) {
    std::lock_guard<std::mutex> lock(m_);
    grouping_[me] = false;
    open_[me] = false;
  }

  // Matches what the stream heads allow; true when op is complete.
  bool poll(const P2p& op) {
    std::lock_guard<std::mutex> lock(m_);
    progress();
    if (!error_.empty()) throw Error(error_);
    return op.done;
  }

  // Host collective rendezvous: every rank hands in its bytes; once all
  // have, each gets the reduction computed by `combine`.
  struct Collective {
    size_t generation = 0;
  };
  size_t collective_enter(int me, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    coll_in_[size_t(me)].assign(static_cast<const char*>(data),
                                static_cast<const char*>(data) + bytes);
    ++coll_arrived_;
    return coll_generation_;
  }
  bool collective_done(size_t generation) {
    std::lock_guard<std::mutex> lock(m_);
    if (coll_generation_ > generation) return true;
    if (coll_arrived_ < size()) return false;
    coll_result_ = coll_in_;
    coll_arrived_ = 0;
    ++coll_generation_;
    return true;
  }
  std::vector<std::vector<char>> collective_inputs() {
    std::lock_guard<std::mutex> lock(m_);
    return coll_result_;
  }
  int max_unit_size() const { return max_unit_; }

 private:
  // Runs until nothing more matches: a head operation meets the first
  // unmatched partner in its peer's head unit.
  void progress() {
    for (bool moved = true; moved && error_.empty();) {
      moved = false;
      for (int r = 0; r < size(); ++r) {
        auto& s = streams_[size_t(r)];
        if (s.empty() || (open_[r] && s.size() == 1)) continue;  // an open group is not started
        for (auto& op : s.front()) {
          if (op->matched) continue;
          auto& ps = streams_[size_t(op->peer)];
          if (ps.empty() || (open_[op->peer] && ps.size() == 1)) continue;
          for (auto& other : ps.front()) {
            if (other->matched || other->send == op->send || other->peer != r) continue;
            const P2p& snd = op->send ? *op : *other;
            const P2p& rcv = op->send ? *other : *op;
            if (snd.bytes != rcv.bytes || snd.tag != rcv.tag) {
              error_ = "in-order p2p: rank " + std::to_string(snd.me) + "'s send (tag " +
                       std::to_string(snd.tag) + ", " + std::to_string(snd.bytes) +
                       " B) met rank " + std::to_string(rcv.me) + "'s receive (tag " +
                       std::to_string(rcv.tag) + ", " + std::to_string(rcv.bytes) +
                       " B): the two ranks post their messages in different orders";
              return;
            }
            if (snd.bytes) std::memcpy(rcv.out, snd.in, snd.bytes);
            op->matched = other->matched = true;
            moved = true;
            break;
          }
        }
        for (int q = 0; q < size(); ++q) pop_complete(q);
      }
    }
  }
  void pop_complete(int r) {
    auto& s = streams_[size_t(r)];
    while (
        !s.empty() && !(open_[r] && s.size() == 1) &&
        std::all_of(s.front().begin(), s.front().end(), [](const auto& o) { return o->matched; })) {
      max_unit_ = std::max(max_unit_, int(s.front().size()));
      for (auto& o : s.front()) o->done = true;
      s.pop_front();
    }
  }

  std::mutex m_;
  std::vector<std::deque<Unit>> streams_;
  std::vector<char> open_ = std::vector<char>(streams_.size(), 0);
  std::vector<char> grouping_ = std::vector<char>(streams_.size(), 0);
  std::string error_;
  int max_unit_ = 0;
  std::vector<std::vector<char>> coll_in_, coll_result_;
  int coll_arrived_ = 0;
  size_t coll_generation_ = 0;
};

// Rank `rank` of an InOrderWorld, as a Communicator of kind pp.
class InOrderComm final : public Communicator {
 public:
  InOrderComm(InOrderWorld& world, int rank, double timeout_s, bool record_uses = false)
      : Communicator(CommKind::pp, "in-order", timeout_s, rank, all_ranks(world.size())),
        world_(world),
        record_uses_(record_uses) {}
  const char* backend_name() const override { return "in-order"; }
  Device device() const override { return Device::cpu(); }
  int max_tag() const override { return 1 << 30; }
  bool in_order_p2p() const override { return true; }
  Communicator& host() override { return *this; }
  std::unique_ptr<Communicator> split(int, int, CommKind, std::string) override {
    throw Error("InOrderComm: split is not used by these tests");
  }
  std::unique_ptr<Communicator> split_node(CommKind, std::string) override {
    throw Error("InOrderComm: split_node is not used by these tests");
  }
  void begin_group() override { world_.open_group(rank()); }
  void end_group() override { world_.end_grouping(rank()); }

 protected:
  std::unique_ptr<PendingOp> post(const CommOp& op) override {
    using Kind = CommOp::Kind;
    if (op.kind == Kind::send || op.kind == Kind::recv) {
      auto p = std::make_shared<InOrderWorld::P2p>();
      p->send = op.kind == Kind::send;
      p->me = rank();
      p->peer = op.peer;
      p->tag = op.tag;
      p->in = op.in;
      p->out = op.out;
      p->bytes = op.bytes;
      world_.post(rank(), p, world_.grouping(rank()));
      if (record_uses_) {
        auto fence = std::make_shared<P2pFence>(world_, p);
        for (const OpBuffer& b : op_buffers(op, size()))
          kernels::buffer_uses().record(b.ptr, b.bytes, fence);
      }
      return std::make_unique<P2pOp>(world_, std::move(p));
    }
    if (op.kind == Kind::allreduce && op.type == ElemType::f64 && op.reduce == ReduceOp::max)
      return std::make_unique<MaxOp>(world_, rank(), static_cast<double*>(op.out), op.count);
    throw Error("InOrderComm: only send, recv and allreduce_max of doubles are modelled");
  }
  size_t max_elements_per_reduction() const override { return size_t(1) << 20; }

 private:
  static std::vector<int> all_ranks(int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = i;
    return v;
  }
  class P2pOp final : public PendingOp {
   public:
    P2pOp(InOrderWorld& w, std::shared_ptr<InOrderWorld::P2p> op) : w_(w), op_(std::move(op)) {}
    bool poll() override { return w_.poll(*op_); }

   private:
    InOrderWorld& w_;
    std::shared_ptr<InOrderWorld::P2p> op_;
  };
  // A point-to-point operation's end, as its buffers' users see it: on the
  // host (no streams here), a free waits for the match, driving the world's
  // progress meanwhile. done() reads the flag alone, since the registry may
  // ask after the world is gone.
  class P2pFence final : public kernels::UseFence {
   public:
    P2pFence(InOrderWorld& w, std::shared_ptr<InOrderWorld::P2p> op) : w_(w), op_(std::move(op)) {}
    bool done() override { return op_->done; }
    void order_before(void*, double timeout_s) override {
      const double t0 = monotonic_s();
      while (!w_.poll(*op_)) {
        if (monotonic_s() - t0 > timeout_s)
          throw TimeoutError("in-order p2p: a freed buffer's operation was not matched within " +
                             std::to_string(timeout_s) + " s");
        std::this_thread::yield();
      }
    }

   private:
    InOrderWorld& w_;
    std::shared_ptr<InOrderWorld::P2p> op_;
  };
  class MaxOp final : public PendingOp {
   public:
    MaxOp(InOrderWorld& w, int me, double* data, size_t n) : w_(w), data_(data), n_(n) {
      gen_ = w_.collective_enter(me, data, n * sizeof(double));
    }
    bool poll() override {
      if (!w_.collective_done(gen_)) return false;
      const auto all = w_.collective_inputs();
      for (const auto& in : all)
        for (size_t i = 0; i < n_; ++i) {
          double v;
          std::memcpy(&v, in.data() + i * sizeof(double), sizeof v);
          data_[i] = std::max(data_[i], v);
        }
      return true;
    }

   private:
    InOrderWorld& w_;
    double* data_;
    size_t n_;
    size_t gen_ = 0;
  };
  InOrderWorld& world_;
  bool record_uses_;
};

}  // namespace trident::test
