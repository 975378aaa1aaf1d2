// Float sums in group-rank order, each part summed by its owner (see
// ordered_sum.hpp).
#include "ordered_sum.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "mpi_check.hpp"
#include "trident/core/allocator.hpp"

namespace trident::detail {
namespace {

// Elements per chunk of the data (all, root) or, for a reduce-scatter, per
// chunk of all the blocks together: p parts of kChunk / p elements (128 KiB
// messages at p = 4, 64 KiB at 8), large enough that a message costs mostly
// bandwidth and few enough messages that ranks sharing cores are not
// switched for each; small enough that kOrderedWindow chunks pipeline and
// that the receive scratch, (p-1)/p of kOrderedWindow chunks, stays under
// 2 MiB per operation.
constexpr size_t kChunk = size_t(1) << 17;
// A part never smaller than this (16 KiB, unless the data is), so that many
// ranks do not cut a chunk into messages that cost mostly latency: a sum of
// fewer than p x kMinPart elements is summed by fewer ranks (at 8 ranks on
// 2 cores, 8 parts of a 32 KiB all-reduce took 1.9x the old chain's time).
constexpr size_t kMinPart = 4096;

// Elements summed at a time: each is read from its p terms and written once
// all are added, so `out` may be one of the terms (in place).
constexpr size_t kSumBlock = 256;

// The operation's receive scratch, from the host allocator and counted as
// communication memory (the run file's peak by kind).
class Scratch {
 public:
  explicit Scratch(size_t floats) : bytes_(floats * sizeof(float)) {
    if (bytes_ == 0) return;
    MemKindScope kind(MemKind::communication);
    p_ = static_cast<float*>(cpu_allocator().allocate(bytes_));
  }
  ~Scratch() {
    if (p_ != nullptr) cpu_allocator().deallocate(p_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return p_; }
  // Left to MPI, which may still write into it: never freed, still counted.
  void leak() { p_ = nullptr; }

 private:
  size_t bytes_;
  float* p_ = nullptr;
};

class OrderedSum final : public PendingOp {
 public:
  explicit OrderedSum(const OrderedSumArgs& a) : a_(a), p_(size_t(a.size)) {
    using Mode = OrderedSumArgs::Mode;
    // A chunk: p parts of at most part_ elements, part r summed by rank r
    // (part(): a short chunk's parts are shorter, or empty).
    part_ = std::max(kMinPart, kChunk / p_);
    const size_t span = a.mode == Mode::scatter ? a.block : a.n;
    if (a.mode == Mode::scatter)
      n_chunks_ = (span + part_ - 1) / part_;  // the same offsets in every block
    else
      n_chunks_ = (span + part_ * p_ - 1) / (part_ * p_);
    // Per window slot: the p-1 other ranks' terms of this rank's part, and
    // (reduce, this rank not the root) its part's sum until the root has it.
    const bool own_sum = a.mode == Mode::root && a.rank != a.root;
    slot_len_ = part_ * (p_ - 1 + (own_sum ? 1 : 0));
    slots_.emplace(std::min<size_t>(kOrderedWindow, n_chunks_) * slot_len_);
    for (auto& r : req_) r.assign(2 * (p_ - 1), MPI_REQUEST_NULL);
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
      std::vector<MPI_Request>& reqs = req_[c % kOrderedWindow];
      for (size_t j = 0; j < reqs.size(); ++j) {
        if (reqs[j] == MPI_REQUEST_NULL) continue;
        if (j >= p_ - 1) MPI_Cancel(&reqs[j]);  // a receive
        MPI_Request_free(&reqs[j]);
      }
    }
    slots_->leak();
  }

  bool poll() override {
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t c = first_; c < next_; ++c) {
        if (state_[c] == State::done) continue;
        std::vector<MPI_Request>& r = req_[c % kOrderedWindow];
        int flag = 0;
        MPI_CHECK(MPI_Testall(int(r.size()), r.data(), &flag, MPI_STATUSES_IGNORE));
        if (!flag) continue;
        step(c);
        moved = true;
      }
      while (first_ < next_ && state_[first_] == State::done) ++first_;
      while (next_ < n_chunks_ && next_ < first_ + kOrderedWindow) {
        state_.push_back(State::done);
        start(next_++);
        moved = true;
      }
    }
    return done();
  }

 private:
  // collect: the others' terms of this rank's part are arriving (and its
  // terms of theirs are on their way); share: the sums are on their way to
  // where they belong.
  enum class State : uint8_t { collect, share, done };

  bool done() const { return first_ == n_chunks_; }

  // Part r of chunk c: its offset in `in` and its length.
  struct Part {
    size_t at = 0, len = 0;
  };
  Part part(size_t c, size_t r) const {
    if (a_.mode == OrderedSumArgs::Mode::scatter) {
      const size_t off = c * part_;
      return {r * a_.block + off, std::min(part_, a_.block - off)};
    }
    // The chunk's elements split evenly (the data's last chunk may be short)
    // over as many ranks as give parts of kMinPart or more, at least one.
    const size_t lo = c * part_ * p_, len = std::min(part_ * p_, a_.n - lo);
    const size_t q = std::clamp<size_t>(len / kMinPart, 1, p_);
    if (r >= q) return {lo + len, 0};
    const size_t b = len * r / q, e = len * (r + 1) / q;
    return {lo + b, e - b};
  }
  // Where the sum of part r lands on the rank that holds it.
  float* sum_of(size_t c, size_t r) {
    if (a_.mode == OrderedSumArgs::Mode::scatter) return a_.out + c * part_;
    if (a_.mode == OrderedSumArgs::Mode::root && a_.rank != a_.root)
      return slot(c) + part_ * (p_ - 1);
    return a_.out + part(c, r).at;
  }
  float* slot(size_t c) { return slots_->get() + (c % kOrderedWindow) * slot_len_; }
  // The scratch for rank r's term of this rank's part (r != this rank).
  float* term(size_t c, size_t r) { return slot(c) + part_ * (r < size_t(a_.rank) ? r : r - 1); }
  int tag(size_t c, State s) const {
    return a_.tag_base + 2 * int(c % kOrderedWindow) + (s == State::share ? 1 : 0);
  }
  // Request slots: sends first (index of the peer among the others), then
  // receives.
  MPI_Request* send_req(size_t c, size_t r) {
    return &req_[c % kOrderedWindow][r < size_t(a_.rank) ? r : r - 1];
  }
  MPI_Request* recv_req(size_t c, size_t r) { return send_req(c, r) + (p_ - 1); }
  // Chunk c's message of phase s to / from rank r, none when len is 0;
  // whether one was posted.
  bool send(size_t c, State s, size_t r, const float* buf, size_t len) {
    if (len == 0) return false;
    MPI_CHECK(MPI_Isend(buf, int(len), MPI_FLOAT, int(r), tag(c, s), a_.comm, send_req(c, r)));
    return true;
  }
  bool recv(size_t c, State s, size_t r, float* buf, size_t len) {
    if (len == 0) return false;
    MPI_CHECK(MPI_Irecv(buf, int(len), MPI_FLOAT, int(r), tag(c, s), a_.comm, recv_req(c, r)));
    return true;
  }

  // Every rank sends each other rank its term of that rank's part, and
  // receives the others' terms of its own.
  void start(size_t c) {
    const size_t me = size_t(a_.rank);
    const Part mine = part(c, me);
    for (size_t r = 0; r < p_; ++r) {
      if (r == me) continue;
      recv(c, State::collect, r, term(c, r), mine.len);
      const Part theirs = part(c, r);
      send(c, State::collect, r, a_.in + theirs.at, theirs.len);
    }
    state_[c] = State::collect;
  }

  // Every request of chunk c completed.
  void step(size_t c) {
    if (state_[c] == State::collect) {
      add_terms(c);
      share(c);
    } else {
      state_[c] = State::done;
    }
  }

  // The sum of this rank's part, ((x_0 + x_1) + x_2) + ... in rank order.
  void add_terms(size_t c) {
    const size_t me = size_t(a_.rank);
    const Part mine = part(c, me);
    std::array<const float*, 64> small{};
    std::vector<const float*> many;
    const float** t = small.data();
    if (p_ > small.size()) {
      many.resize(p_);
      t = many.data();
    }
    for (size_t r = 0; r < p_; ++r) t[r] = r == me ? a_.in + mine.at : term(c, r);
    float* out = sum_of(c, me);
    float acc[kSumBlock];
    for (size_t i0 = 0; i0 < mine.len; i0 += kSumBlock) {
      const size_t m = std::min(kSumBlock, mine.len - i0);
      std::memcpy(acc, t[0] + i0, m * sizeof(float));
      for (size_t r = 1; r < p_; ++r) {
        const float* x = t[r] + i0;
        for (size_t i = 0; i < m; ++i) acc[i] = acc[i] + x[i];
      }
      std::memcpy(out + i0, acc, m * sizeof(float));
    }
  }

  // The sums go where the operation puts them: to every rank (all-reduce),
  // to the root (reduce); a reduce-scatter's part is its owner's already.
  // The terms this rank sent are delivered (the chunk's requests all
  // completed), so an all-reduce in place may receive over them.
  void share(size_t c) {
    using Mode = OrderedSumArgs::Mode;
    const size_t me = size_t(a_.rank);
    const Part mine = part(c, me);
    bool posted = false;
    if (a_.mode == Mode::all) {
      for (size_t r = 0; r < p_; ++r) {
        if (r == me) continue;
        posted |= send(c, State::share, r, sum_of(c, me), mine.len);
        const Part theirs = part(c, r);
        posted |= recv(c, State::share, r, a_.out + theirs.at, theirs.len);
      }
    } else if (a_.mode == Mode::root) {
      const size_t root = size_t(a_.root);
      if (me != root) posted |= send(c, State::share, root, sum_of(c, me), mine.len);
      if (me == root)
        for (size_t r = 0; r < p_; ++r) {
          const Part theirs = part(c, r);
          if (r != me) posted |= recv(c, State::share, r, a_.out + theirs.at, theirs.len);
        }
    }
    state_[c] = posted ? State::share : State::done;
  }

  OrderedSumArgs a_;
  size_t p_ = 0;
  size_t part_ = 0;           // elements of one rank's part of a chunk
  size_t n_chunks_ = 0;       // chunks of the operation
  std::vector<State> state_;  // per started chunk
  // Per window slot: 2 (p-1) requests (send_req, recv_req), and slot_len_
  // floats of scratch.
  std::array<std::vector<MPI_Request>, kOrderedWindow> req_;
  std::optional<Scratch> slots_;
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
