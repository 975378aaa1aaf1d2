// Float sums in group-rank order over an MPI chain (see ordered_sum.hpp).
#include "ordered_sum.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_check.hpp"

namespace trident::detail {
namespace {

// Elements per message: large enough that a message costs mostly bandwidth,
// small enough that the chain's pipeline fills (kOrderedWindow chunks of
// scratch per operation, 1 MiB).
constexpr size_t kChunk = size_t(1) << 16;

std::array<MPI_Request, kOrderedWindow> filled(MPI_Request r) {
  std::array<MPI_Request, kOrderedWindow> a;
  a.fill(r);
  return a;
}

class OrderedSum final : public PendingOp {
 public:
  explicit OrderedSum(const OrderedSumArgs& a) : a_(a) {
    using Mode = OrderedSumArgs::Mode;
    const int dest = a.mode == Mode::all ? -1 : a.root;
    if (a.mode == Mode::scatter) {
      for (int r = 0; r < a.size; ++r)
        for (size_t off = 0; off < a.block; off += kChunk)
          chunks_.push_back(
              {size_t(r) * a.block + off, std::min(kChunk, a.block - off), r, a.out + off});
    } else {
      for (size_t lo = 0; lo < a.n; lo += kChunk)
        chunks_.push_back({lo, std::min(kChunk, a.n - lo), dest, a.out + lo});
    }
    size_t longest = 0;
    for (const Chunk& c : chunks_) longest = std::max(longest, c.len);
    slot_len_ = longest;
    if (a.rank > 0 && longest > 0) slots_.reset(new float[size_t(kOrderedWindow) * longest]);
  }

  ~OrderedSum() override {
    if (done()) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Released while pending (an exception unwound past the wait): what is
    // posted is released, and the scratch is left to MPI, which may still
    // write into it.
    for (size_t c = first_; c < next_; ++c) {
      MPI_Request& r = req_[c % kOrderedWindow];
      if (r == MPI_REQUEST_NULL) continue;
      if (state_[c] == State::reduce_recv || state_[c] == State::deliver_recv) MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    (void)slots_.release();
  }

  bool poll() override {
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t c = first_; c < next_; ++c) {
        MPI_Request& r = req_[c % kOrderedWindow];
        if (state_[c] == State::done) continue;
        int flag = 0;
        MPI_CHECK(MPI_Test(&r, &flag, MPI_STATUS_IGNORE));
        if (!flag) continue;
        step(c);
        moved = true;
      }
      while (first_ < next_ && state_[first_] == State::done) ++first_;
      while (next_ < chunks_.size() && next_ < first_ + kOrderedWindow) {
        state_.push_back(State::done);
        start(next_++);
        moved = true;
      }
    }
    return done();
  }

 private:
  struct Chunk {
    size_t lo = 0, len = 0;
    int dest = -1;         // the rank that receives the sum; -1: every rank
    float* out = nullptr;  // where the sum lands on dest
  };
  enum class State : uint8_t { reduce_send, reduce_recv, deliver_send, deliver_recv, done };

  bool done() const { return first_ == chunks_.size(); }
  int last() const { return a_.size - 1; }
  float* slot(size_t c) { return slots_.get() + (c % kOrderedWindow) * slot_len_; }
  int tag(size_t c, bool deliver) const {
    return a_.tag_base + 2 * int(c % kOrderedWindow) + (deliver ? 1 : 0);
  }
  MPI_Request* req(size_t c) { return &req_[c % kOrderedWindow]; }

  void send(size_t c, const float* buf, int to, bool deliver, State s) {
    MPI_CHECK(MPI_Isend(buf, int(chunks_[c].len), MPI_FLOAT, to, tag(c, deliver), a_.comm, req(c)));
    state_[c] = s;
  }
  void recv(size_t c, float* buf, int from, bool deliver, State s) {
    MPI_CHECK(
        MPI_Irecv(buf, int(chunks_[c].len), MPI_FLOAT, from, tag(c, deliver), a_.comm, req(c)));
    state_[c] = s;
  }

  // Rank 0 sends its term; the others wait for the partial sum before them.
  void start(size_t c) {
    if (a_.rank == 0)
      send(c, a_.in + chunks_[c].lo, 1, false, State::reduce_send);
    else
      recv(c, slot(c), a_.rank - 1, false, State::reduce_recv);
  }

  // The request of chunk c completed.
  void step(size_t c) {
    const Chunk& k = chunks_[c];
    switch (state_[c]) {
      case State::reduce_recv: {
        // The partial sum of the ranks before this one, plus this rank's term.
        float* s = slot(c);
        const float* mine = a_.in + k.lo;
        for (size_t i = 0; i < k.len; ++i) s[i] = s[i] + mine[i];
        if (a_.rank < last())
          send(c, s, a_.rank + 1, false, State::reduce_send);
        else
          deliver(c);
        return;
      }
      case State::reduce_send:
        deliver(c);
        return;
      case State::deliver_recv:
        // All-reduce: the sum goes on down the chain, rank 0 to p-2.
        if (k.dest < 0 && a_.rank < last() - 1)
          send(c, k.out, a_.rank + 1, true, State::deliver_send);
        else
          state_[c] = State::done;
        return;
      case State::deliver_send:
      case State::done:
        state_[c] = State::done;
        return;
    }
  }

  // This rank's part of chunk c's sum is done; the sum goes where it belongs.
  void deliver(size_t c) {
    const Chunk& k = chunks_[c];
    if (a_.rank == last()) {
      if (k.dest < 0 || k.dest == last()) std::memcpy(k.out, slot(c), k.len * sizeof(float));
      if (k.dest < 0)
        send(c, k.out, 0, true, State::deliver_send);
      else if (k.dest != last())
        send(c, slot(c), k.dest, true, State::deliver_send);
      else
        state_[c] = State::done;
      return;
    }
    if (k.dest < 0)
      recv(c, k.out, a_.rank == 0 ? last() : a_.rank - 1, true, State::deliver_recv);
    else if (k.dest == a_.rank)
      recv(c, k.out, last(), true, State::deliver_recv);
    else
      state_[c] = State::done;
  }

  OrderedSumArgs a_;
  std::vector<Chunk> chunks_;
  std::vector<State> state_;  // per started chunk
  std::array<MPI_Request, kOrderedWindow> req_ = filled(MPI_REQUEST_NULL);
  std::unique_ptr<float[]> slots_;  // kOrderedWindow chunks (ranks > 0)
  size_t slot_len_ = 0;
  size_t first_ = 0;  // chunks before it are done
  size_t next_ = 0;   // chunks from it on are not started
};

}  // namespace

std::unique_ptr<PendingOp> post_ordered_sum(const OrderedSumArgs& a) {
  TRIDENT_CHECK(a.size >= 2 && a.rank >= 0 && a.rank < a.size,
                "ordered sum: rank " + std::to_string(a.rank) + " of " + std::to_string(a.size));
  auto op = std::make_unique<OrderedSum>(a);
  op->poll();  // posts the first chunks
  return op;
}

}  // namespace trident::detail
