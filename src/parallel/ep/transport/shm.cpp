// The shm transport: rows written straight into the expert ranks' shared
// inboxes and read straight out of their outboxes (see transport.hpp).
//
// Rank r's block of a window holds its inbox [R_r, d] and then its outbox
// [R_r, d], both in r's expert-side layout. A window grows (collectively,
// decided from the counts that every rank has) when a step needs more; if
// /dev/shm cannot hold it, every rank falls back to alltoallv together.
// The transient transfers (dispatch, gather_back) share one window: a box
// some peer may still be reading is fenced before anyone writes it again,
// unless a collective has ordered everything since.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../row_views.hpp"
#include "trident/comm/shared_window.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/ep/transport.hpp"

namespace trident::ep {
namespace {

constexpr size_t kRowBytes = sizeof(float);

double window_bytes(const SharedWindow& w, int ranks) {
  double b = 0;
  for (int r = 0; r < ranks; ++r) b += double(w.block_bytes(r));
  return b;
}

float* inbox_of(const SharedWindow& w, int r) { return reinterpret_cast<float*>(w.block(r)); }

// Where this rank's rows of each expert g lie in g's rank's outbox.
std::vector<const float*> outbox_bases(const SharedWindow& w, const DispatchPlan& p, int64_t d) {
  const int L = p.local_experts;
  std::vector<const float*> base(size_t(p.n_experts));
  for (int g = 0; g < p.n_experts; ++g)
    base[size_t(g)] = inbox_of(w, g / L) + (p.rows_at[g / L] + p.expert_at[g]) * d;
  return base;
}

// This rank's copies' rows [S, d] at `base` (outbox_bases): one block per
// expert, as the unpermute reads them where they lie.
kernels::RowBlocks outbox_blocks(const kernels::Ctx& ctx, const std::vector<const float*>& base,
                                 const DispatchPlan& p, int64_t d) {
  std::vector<Tensor> blocks;
  for (int g = 0; g < p.n_experts; ++g)
    blocks.push_back(row_view(ctx, base[size_t(g)], p.tokens_per_expert[size_t(g)], d));
  return kernels::RowBlocks(std::move(blocks), p.expert_first);
}

// Writes this rank's send rows into each expert's place on its rank: the
// inbox of w, or `own` for this rank's experts (nullptr: its inbox too).
void write_rows(const kernels::Ctx& ctx, const DispatchPlan& p, const SendRows& src,
                const SharedWindow& w, float* own, int64_t d) {
  const int P = p.ep_size, L = p.local_experts, me = p.ep_rank;
  for (int i = 0; i < P; ++i) {
    const int r = (me + i) % P;  // start at different peers: less contention
    float* box = r == me && own ? own : inbox_of(w, r);
    for (int g = r * L; g < (r + 1) * L; ++g) {
      const int64_t first = p.expert_first[g], n = p.tokens_per_expert[g];
      if (n == 0) continue;
      float* dst = box + p.expert_at[g] * d;
      if (!src.index.empty()) {
        kernels::gather_rows(ctx, src.rows, src.index.view(first, {n}), row_view(ctx, dst, n, d));
      } else {
        std::memcpy(dst, src.rows.ptr() + first * d, kRowBytes * size_t(n * d));
      }
    }
  }
}

// A forward's rows in a shared slot; releasing the slot is the destructor's.
class SlotPool;
class ShmRows final : public ForwardRows {
 public:
  // in, out: the inbox and the outbox [R, d] of this rank's block.
  ShmRows(std::shared_ptr<SlotPool> pool, int slot, Tensor in, Tensor out)
      : pool_(std::move(pool)), slot_(slot) {
    in_ = std::move(in);
    out_ = std::move(out);
  }
  ~ShmRows() override;
  int slot() const { return slot_; }
  void set_returned(kernels::RowBlocks rows) {
    returned_ = std::move(rows);
    back_ = true;
  }

 private:
  std::shared_ptr<SlotPool> pool_;
  int slot_;
};

// Shared slots for forwards that keep their rows. A slot is busy from
// dispatch_forward to the ShmRows' destruction, then "released"; it
// becomes free at the next collective the transport runs (count exchange
// or fence), after which no peer can still read it. Every rank makes the
// same calls in the same order, so all pick the same slot.
class SlotPool {
 public:
  enum class State { free, busy, released };
  struct Slot {
    std::unique_ptr<SharedWindow> window;
    State state = State::free;
  };
  std::vector<Slot> slots;
  void release(int i) { slots.at(size_t(i)).state = State::released; }
  void settle() {
    for (auto& s : slots)
      if (s.state == State::released) s.state = State::free;
  }
  int lowest_free() {
    size_t s = 0;
    while (s < slots.size() && slots[s].state != State::free) ++s;
    if (s == slots.size()) slots.emplace_back();
    return int(s);
  }
};

ShmRows::~ShmRows() { pool_->release(slot_); }

class ShmTransport final : public Transport {
 public:
  ShmTransport(Communicator& ep, double shm_limit_bytes, const kernels::Ctx& ctx)
      : Transport(ctx),
        ep_(ep),
        shm_limit_(shm_limit_bytes),
        fallback_(make_alltoallv_transport(ep, ctx)) {}

  EpTransport kind() const override {
    return fell_back_ ? EpTransport::alltoallv : EpTransport::shm;
  }
  void set_profiler(prof::Sink* sink) override {
    sink_ = sink;
    fallback_->set_profiler(sink);
  }
  void synced() override {
    inbox_busy_ = outbox_busy_ = false;
    slots_->settle();
  }

  std::unique_ptr<Exchange> start_dispatch(const DispatchPlan& p, const Tensor& rows,
                                           const Tensor& expert_in) override;
  std::unique_ptr<Exchange> start_return(const DispatchPlan& p, const Tensor& expert_side,
                                         const Tensor& back) override;
  void dispatch(const DispatchPlan& p, const SendRows& src, const Tensor& expert_in) override;
  kernels::RowBlocks gather_back(const DispatchPlan& p, const Tensor& expert_side,
                                 KeptRows* keep) override;
  std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const Tensor& x) override;
  void return_forward(const DispatchPlan& p, ForwardRows& rows) override;

 private:
  // Whether window w holds (or was grown to hold) an inbox and an outbox of
  // R_r rows of d floats on every rank r; false on every rank when there is
  // no room: the transport is then alltoallv from here on.
  bool fit(std::unique_ptr<SharedWindow>& w, const DispatchPlan& p, int64_t d);
  // Collective: whether replacing blocks of old_bytes (all ranks) by
  // new_bytes keeps within /dev/shm and the limit. Counts as a growth.
  bool room(double old_bytes, double new_bytes);
  // Bytes of this transport's windows, all ranks together.
  double held_bytes() const;
  void fence(SharedWindow& w) {
    w.fence();
    synced();
  }
  void account(double bytes) { ep_.counters().add(ep_.kind(), bytes, 0.0); }
  // The halves of the transient transfers (window_ fits p): the writes,
  // and an exchange that fences and reads.
  std::unique_ptr<Exchange> post_dispatch(const DispatchPlan& p, const SendRows& src,
                                          float* expert_in, int64_t d);
  std::unique_ptr<Exchange> post_return(const DispatchPlan& p, const float* expert_side, int64_t d);
  // This rank's copies' rows, where they lie in the outboxes (bases_), into
  // back [S, d] in send order.
  void copy_back(const DispatchPlan& p, float* back, int64_t d) const;

  Communicator& ep_;
  double shm_limit_;
  std::unique_ptr<Transport> fallback_;
  bool fell_back_ = false;
  std::unique_ptr<SharedWindow> window_;  // transient transfers
  std::shared_ptr<SlotPool> slots_ = std::make_shared<SlotPool>();
  // Whether p's inboxes, rows [0, rows_at[r]) of each block r, reach into
  // the outboxes of the last gather_back, rows [outbox_at_[r], 2
  // outbox_at_[r]), while those may still be read: the same on every rank
  // (every rank has every plan's rows_at).
  bool meets_busy_outbox(const DispatchPlan& p) const {
    if (!outbox_busy_) return false;
    for (size_t r = 0; r < outbox_at_.size(); ++r)
      if (outbox_at_[r] > 0 && p.rows_at[r] > outbox_at_[r]) return true;
    return false;
  }

  // A box some peer may still be reading (no collective since its last read).
  bool inbox_busy_ = false, outbox_busy_ = false;
  std::vector<int64_t> outbox_at_;   // rows_at of the last gather_back
  std::vector<const float*> bases_;  // gather_back's source
};

double ShmTransport::held_bytes() const {
  const int P = ep_.size();
  double held = window_ ? window_bytes(*window_, P) : 0.0;
  for (const auto& slot : slots_->slots)
    if (slot.window) held += window_bytes(*slot.window, P);
  return held;
}

bool ShmTransport::room(double old_bytes, double new_bytes) {
  const double after = held_bytes() - old_bytes + new_bytes;
  int short_of_memory =
      SharedWindow::free_bytes() < new_bytes + (64 << 20) || (shm_limit_ > 0 && after > shm_limit_)
          ? 1
          : 0;
  ep_.allreduce_max(&short_of_memory, 1);
  ++shared_.growths;
  return short_of_memory == 0;
}

// Grows with headroom, so that a step with a few more rows does not
// reallocate; every rank computes the same sizes from the same counts, so
// they agree without a message.
bool ShmTransport::fit(std::unique_ptr<SharedWindow>& w, const DispatchPlan& p, int64_t d) {
  if (fell_back_) return false;
  const int P = p.ep_size;
  const size_t row_bytes = kRowBytes * size_t(d);
  bool fits = w != nullptr;
  for (int r = 0; r < P && fits; ++r)
    fits = 2 * size_t(p.rows_at[r]) * row_bytes <= w->block_bytes(r);
  if (fits) return true;
  size_t total = 0, mine = 0;
  for (int r = 0; r < P; ++r) {
    const size_t need = 2 * size_t(p.rows_at[r]) * row_bytes;
    const size_t grown = std::max(w ? w->block_bytes(r) : 0, need + need / 4 + 4096);
    total += grown;
    if (r == p.ep_rank) mine = grown;
  }
  const bool ok = room(w ? window_bytes(*w, P) : 0.0, double(total));
  w.reset();
  if (ok) w = std::make_unique<SharedWindow>(ep_, mine);
  shared_.bytes = held_bytes();
  synced();  // room's all-reduce ordered every earlier read
  if (!ok) {
    fell_back_ = true;  // every rank saw the same shortage
    reason_ = "the ep group's shared blocks do not fit in /dev/shm or runtime.ep_shm_limit_mb";
  }
  return ok;
}

// Sources write their rows into the inboxes (their own rows to expert_in
// directly); after the fence each expert rank copies the rest of its inbox
// out. The inboxes stay busy until the next collective (or a fence before
// the next write into them). A plan with more rows than the last
// gather_back's writes where that one's outboxes were, which sources may
// still be reading when backwards run back to back (no count exchange in
// between): then it fences first too. p must live until the wait.
std::unique_ptr<Exchange> ShmTransport::post_dispatch(const DispatchPlan& p, const SendRows& src,
                                                      float* expert_in, int64_t d) {
  if (inbox_busy_ || meets_busy_outbox(p)) fence(*window_);
  write_rows(ctx_, p, src, *window_, expert_in, d);
  return std::make_unique<DeferredExchange>([this, &p, expert_in, d] {
    const int P = p.ep_size, L = p.local_experts, me = p.ep_rank;
    const size_t row_bytes = kRowBytes * size_t(d);
    fence(*window_);
    const float* in = inbox_of(*window_, me);
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      for (int e = 0; e < L; ++e) {
        const int64_t off = p.chunk_offset[r * L + e];
        std::memcpy(expert_in + off * d, in + off * d, row_bytes * size_t(p.chunk_rows[r * L + e]));
      }
    }
    inbox_busy_ = true;
    account(double(p.sent() - p.send_rows[me]) * double(row_bytes));
  });
}

std::unique_ptr<Exchange> ShmTransport::start_dispatch(const DispatchPlan& p, const Tensor& rows,
                                                       const Tensor& expert_in) {
  const int64_t d = rows.dim(-1);
  if (!fit(window_, p, d)) return fallback_->start_dispatch(p, rows, expert_in);
  return post_dispatch(p, SendRows{rows, Tensor()}, expert_in.data<float>(), d);
}

void ShmTransport::dispatch(const DispatchPlan& p, const SendRows& src, const Tensor& expert_in) {
  const int64_t d = expert_in.dim(-1);
  if (!fit(window_, p, d)) return fallback_->dispatch(p, src, expert_in);
  const double t0 = stamp();
  finish(*post_dispatch(p, src, expert_in.data<float>(), d));
  span("ep.dispatch", t0);
  count("ep.bytes", double(p.sent()) * double(kRowBytes) * double(d));
}

// The expert rank puts its rows in its outbox; after the fence each source
// reads its copies' rows where they lie in the peers' outboxes (bases_);
// the outboxes stay busy until the next collective.
std::unique_ptr<Exchange> ShmTransport::post_return(const DispatchPlan& p, const float* expert_side,
                                                    int64_t d) {
  const int me = p.ep_rank;
  const int64_t R = p.received();
  const size_t row_bytes = kRowBytes * size_t(d);
  float* out_me = inbox_of(*window_, me) + R * d;
  if (outbox_busy_) fence(*window_);  // on every rank alike: the flag is the same everywhere
  if (expert_side != out_me && R > 0) std::memcpy(out_me, expert_side, row_bytes * size_t(R));
  return std::make_unique<DeferredExchange>([this, &p, d, R, row_bytes] {
    fence(*window_);
    outbox_busy_ = true;
    outbox_at_ = p.rows_at;
    bases_ = outbox_bases(*window_, p, d);
    account(double(R - p.recv_rows[p.ep_rank]) * double(row_bytes));
  });
}

void ShmTransport::copy_back(const DispatchPlan& p, float* back, int64_t d) const {
  for (int g = 0; g < p.n_experts; ++g)
    std::memcpy(back + p.expert_first[g] * d, bases_[size_t(g)],
                kRowBytes * size_t(d) * size_t(p.tokens_per_expert[g]));
}

std::unique_ptr<Exchange> ShmTransport::start_return(const DispatchPlan& p,
                                                     const Tensor& expert_side,
                                                     const Tensor& back_rows) {
  const int64_t d = back_rows.dim(-1);
  if (!fit(window_, p, d)) return fallback_->start_return(p, expert_side, back_rows);
  float* back = back_rows.data<float>();
  auto posted = std::shared_ptr<Exchange>(post_return(p, expert_side.ptr(), d));
  return std::make_unique<DeferredExchange>([this, posted, &p, back, d] {
    posted->wait();
    copy_back(p, back, d);
  });
}

// The rows back where they lie (copied into keep when asked).
kernels::RowBlocks ShmTransport::gather_back(const DispatchPlan& p, const Tensor& expert_side,
                                             KeptRows* keep) {
  const int64_t d = expert_side.dim(-1);
  if (keep && keep->filled) return first_rows(keep->rows, p.sent(), d);
  if (!fit(window_, p, d)) return fallback_->gather_back(p, expert_side, keep);
  const double t0 = stamp();
  finish(*post_return(p, expert_side.ptr(), d));
  kernels::RowBlocks source = outbox_blocks(ctx_, bases_, p, d);
  if (keep) {
    kernels::reserve(ctx_, keep->rows, p.sent() * d);
    keep->filled = true;
    copy_back(p, keep->rows.data<float>(), d);
    source = first_rows(keep->rows, p.sent(), d);
  }
  span("ep.return", t0);
  count("ep.bytes", double(p.received()) * double(kRowBytes) * double(d));
  return source;
}

std::unique_ptr<ForwardRows> ShmTransport::dispatch_forward(const DispatchPlan& p,
                                                            const Tensor& x) {
  if (fell_back_) return fallback_->dispatch_forward(p, x);
  const int64_t d = x.dim(-1);
  // The lowest free slot (the same on every rank), grown if this step needs more.
  const double t0 = stamp();
  const int s = slots_->lowest_free();
  SlotPool::Slot& slot = slots_->slots[size_t(s)];
  if (!fit(slot.window, p, d)) return fallback_->dispatch_forward(p, x);
  slot.state = SlotPool::State::busy;
  SharedWindow& w = *slot.window;
  const int me = p.ep_rank;
  const int64_t R = p.received();
  write_rows(ctx_, p, SendRows{x, p.send_token}, w, nullptr, d);
  DeferredExchange written([&] { fence(w); });
  finish(written);
  auto rows = std::make_unique<ShmRows>(slots_, s, row_view(ctx_, inbox_of(w, me), R, d),
                                        row_view(ctx_, inbox_of(w, me) + R * d, R, d));
  const double row_bytes = double(kRowBytes) * double(d);
  account(double(p.sent() - p.send_rows[me]) * row_bytes);
  span("ep.dispatch", t0);
  count("ep.bytes", double(p.sent()) * row_bytes);
  return rows;
}

// Every expert's outputs are in its outbox after the fence; the source reads
// its rows there, where they lie, for the combine and again for the backward.
void ShmTransport::return_forward(const DispatchPlan& p, ForwardRows& rows) {
  auto* mine = dynamic_cast<ShmRows*>(&rows);
  if (!mine) return fallback_->return_forward(p, rows);
  const int64_t d = rows.out().dim(-1);
  const double t0 = stamp();
  SharedWindow& w = *slots_->slots.at(size_t(mine->slot())).window;
  DeferredExchange written([&] { fence(w); });  // the experts wrote their outbox
  finish(written);
  mine->set_returned(outbox_blocks(ctx_, outbox_bases(w, p, d), p, d));
  const double row_bytes = double(kRowBytes) * double(d);
  account(double(p.received() - p.recv_rows[p.ep_rank]) * row_bytes);
  span("ep.return", t0);
  count("ep.bytes", double(p.received()) * row_bytes);
}

}  // namespace

std::unique_ptr<Transport> make_shm_transport(Communicator& ep, double shm_limit_bytes,
                                              const kernels::Ctx& ctx) {
  return std::make_unique<ShmTransport>(ep, shm_limit_bytes, ctx);
}

}  // namespace trident::ep
