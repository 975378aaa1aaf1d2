// TokenDispatcher: count exchange, expert-major permutation plan, and the
// transfers of token rows to the experts and back (see the header for the
// layout and the two transports).
#include "trident/parallel/ep/token_dispatcher.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "trident/comm/shared_window.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/moe.hpp"

namespace trident::ep {
namespace {

constexpr size_t kRowBytes = sizeof(float);

double window_bytes(const SharedWindow& w, int ranks) {
  double b = 0;
  for (int r = 0; r < ranks; ++r) b += double(w.block_bytes(r));
  return b;
}

// Rank r's block holds its inbox [R_r, d] and then its outbox [R_r, d].
float* inbox_of(const SharedWindow& w, int r) { return reinterpret_cast<float*>(w.block(r)); }

// Row r of this rank's send order comes back at base[peer_of_row(r)] + r*d:
// this rank's rows start at peer_offset in each peer's outbox.
std::vector<const float*> outbox_bases(const SharedWindow& w, const DispatchPlan& p, int64_t d) {
  std::vector<const float*> base(static_cast<size_t>(p.ep_size));
  for (int r = 0; r < p.ep_size; ++r)
    base[size_t(r)] = inbox_of(w, r) + (p.rows_at[r] + p.peer_offset[r] - p.send_displ[r]) * d;
  return base;
}

}  // namespace

// Shared slots for forwards that keep their rows. A slot is busy from
// dispatch_forward to the ForwardRows' destruction, then "released"; it
// becomes free at the next collective the dispatcher runs (count exchange
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
  // alltoallv: buffers of finished forwards, handed to the next ones (a
  // fresh buffer would page-fault and zero its memory every layer).
  std::vector<std::vector<float>> spare;
  void release(int i) { slots.at(size_t(i)).state = State::released; }
  void recycle(std::vector<float>&& v) {
    if (v.capacity() > 0 && spare.size() < 16) spare.push_back(std::move(v));
  }
  std::vector<float> take(size_t n) {
    std::vector<float> v;
    if (!spare.empty()) {
      v = std::move(spare.back());
      spare.pop_back();
    }
    if (v.size() < n) v.resize(n);  // grow only: kept elements are not re-zeroed
    return v;
  }
  void settle() {
    for (auto& s : slots)
      if (s.state == State::released) s.state = State::free;
  }
};

ForwardRows::~ForwardRows() {
  if (!pool_) return;
  if (slot_ >= 0) {
    pool_->release(slot_);
    return;
  }
  pool_->recycle(std::move(own_in_));
  pool_->recycle(std::move(own_out_));
  pool_->recycle(std::move(kept_.rows));
}

// Steady clock (not now_s): the layer also runs without MPI initialised.
double ep_clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* ep_transport_name(EpTransport t) { return t == EpTransport::shm ? "shm" : "alltoallv"; }

int64_t DispatchPlan::received() const {
  int64_t n = 0;
  for (auto r : recv_rows) n += r;
  return n;
}

int DispatchPlan::peer_of_row(int64_t row) const {
  for (int r = 0; r < ep_size; ++r)
    if (row < send_displ[r] + send_rows[r]) return r;
  return ep_size - 1;
}

TokenDispatcher::TokenDispatcher(Communicator* ep, int n_experts, EpTransportChoice transport,
                                 double shm_limit_bytes)
    : ep_(ep && ep->size() > 1 ? ep : nullptr),
      n_experts_(n_experts),
      ep_size_(ep_ ? ep_->size() : 1),
      ep_rank_(ep_ ? ep_->rank() : 0),
      slots_(std::make_shared<SlotPool>()),
      shm_limit_(shm_limit_bytes) {
  TRIDENT_CHECK(n_experts > 0 && n_experts % ep_size_ == 0,
                "n_experts " + std::to_string(n_experts) + " is not a multiple of ep " +
                    std::to_string(ep_size_));
  if (!ep_ || transport == EpTransportChoice::alltoallv) return;
  std::string why;
  if (SharedWindow::node_local(*ep_, &why)) {
    transport_ = EpTransport::shm;
  } else if (transport == EpTransportChoice::shm) {
    throw InputError("runtime.ep_transport = \"shm\": the ep group spans nodes: " + why);
  } else {
    reason_ = why;
  }
}

TokenDispatcher::~TokenDispatcher() = default;

DispatchPlan TokenDispatcher::plan(const int* expert, int64_t T, int k,
                                   DispatchTimes* times) const {
  const double t0 = ep_clock_s();
  DispatchPlan p;
  p.T = T;
  p.k = k;
  p.n_experts = n_experts_;
  p.ep_size = ep_size_;
  p.ep_rank = ep_rank_;
  p.local_experts = n_experts_ / ep_size_;
  const int E = n_experts_, L = p.local_experts, P = ep_size_, me = ep_rank_;

  // Counting sort of the copies by expert, stable in (t, j): deterministic rows.
  p.tokens_per_expert.assign(E, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int e = expert[i];
    if (e < 0) continue;
    TRIDENT_CHECK(e < E, "expert id " + std::to_string(e) + " out of range");
    p.tokens_per_expert[e]++;
  }
  std::vector<int64_t> next(E, 0);
  for (int e = 1; e < E; ++e) next[e] = next[e - 1] + p.tokens_per_expert[e - 1];
  const int64_t S = E ? next[E - 1] + p.tokens_per_expert[E - 1] : 0;
  p.row_of.assign(static_cast<size_t>(T * k), -1);
  p.send_token.assign(static_cast<size_t>(S), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int e = expert[i];
    if (e < 0) continue;
    const int64_t r = next[e]++;
    p.row_of[i] = r;
    p.send_token[r] = i / k;
  }
  p.send_rows.assign(P, 0);
  p.send_displ.assign(P, 0);
  for (int e = 0; e < E; ++e) p.send_rows[e / L] += p.tokens_per_expert[e];
  for (int r = 1; r < P; ++r) p.send_displ[r] = p.send_displ[r - 1] + p.send_rows[r - 1];

  // Count exchange: every rank learns every rank's counts, which places
  // each source's rows on each expert rank without another message.
  const double t1 = ep_clock_s();
  p.counts.assign(static_cast<size_t>(P) * E, 0);
  if (ep_) {
    ep_->allgather(p.tokens_per_expert.data(), p.counts.data(), sizeof(int64_t) * size_t(E));
  } else {
    p.counts = p.tokens_per_expert;
  }
  const double t2 = ep_clock_s();
  p.chunk_rows.assign(static_cast<size_t>(P * L), 0);
  p.recv_rows.assign(P, 0);
  p.recv_displ.assign(P, 0);
  p.chunk_offset.assign(static_cast<size_t>(P * L), 0);
  int64_t off = 0;
  for (int r = 0; r < P; ++r) {
    p.recv_displ[r] = off;
    for (int e = 0; e < L; ++e) {
      const int64_t n = p.counts[size_t(r) * E + me * L + e];
      p.chunk_rows[r * L + e] = n;
      p.chunk_offset[r * L + e] = off;
      off += n;
      p.recv_rows[r] += n;
    }
  }
  p.rows_at.assign(P, 0);
  for (int dst = 0; dst < P; ++dst)
    for (int s = 0; s < P; ++s)
      for (int e = dst * L; e < (dst + 1) * L; ++e) p.rows_at[dst] += p.counts[size_t(s) * E + e];
  p.peer_offset.assign(P, 0);
  for (int dst = 0; dst < P; ++dst)
    for (int s = 0; s < me; ++s)
      for (int e = dst * L; e < (dst + 1) * L; ++e)
        p.peer_offset[dst] += p.counts[size_t(s) * E + e];
  synced();  // the all-gather orders every earlier read of the shared boxes
  if (times) {
    times->permute += (t1 - t0) + (ep_clock_s() - t2);  // index work is part of the permutation
    times->count_exchange += t2 - t1;
  }
  return p;
}

void TokenDispatcher::account(double bytes) const { comm_counters().add(CommKind::ep, bytes, 0.0); }

void TokenDispatcher::dispatch(const DispatchPlan& p, const float* x, float* expert_in, int64_t d,
                               DispatchTimes* times) const {
  const int64_t S = p.sent();
  if (!ep_) {
    const double t0 = ep_clock_s();
    kernels::gather_rows(x, d, p.send_token.data(), S, expert_in);
    if (times) times->permute += ep_clock_s() - t0;
    return;
  }
  if (transport_ == EpTransport::shm && shm_reserve(p, d))
    return dispatch_shm(p, x, true, expert_in, d, times);
  const double t0 = ep_clock_s();
  if (send_.size() < size_t(S * d)) send_.resize(static_cast<size_t>(S * d));
  kernels::gather_rows(x, d, p.send_token.data(), S, send_.data());
  if (times) times->permute += ep_clock_s() - t0;
  dispatch_rows(p, send_.data(), expert_in, d, times);
}

void TokenDispatcher::dispatch_rows(const DispatchPlan& p, const float* rows, float* expert_in,
                                    int64_t d, DispatchTimes* times) const {
  if (ep_ && transport_ == EpTransport::shm && shm_reserve(p, d))
    return dispatch_shm(p, rows, false, expert_in, d, times);
  const double t0 = ep_clock_s();
  if (ep_) {
    ep_->alltoallv(rows, p.send_rows, p.send_displ, expert_in, p.recv_rows, p.recv_displ,
                   kRowBytes * static_cast<size_t>(d));
  } else if (p.sent() > 0) {
    std::memcpy(expert_in, rows, kRowBytes * static_cast<size_t>(p.sent() * d));
  }
  if (times) {
    times->a2a += ep_clock_s() - t0;
    if (ep_) times->a2a_bytes += double(p.sent()) * double(d) * kRowBytes;
  }
}

bool TokenDispatcher::shm_reserve(const DispatchPlan& p, int64_t d) const {
  if (fit_window(window_, p, d)) return true;
  fall_back();
  return false;
}

// Inbox + outbox of R_r rows on every rank r. Grows with headroom, so that a
// step with a few more rows does not reallocate; every rank computes the
// same sizes from the same counts, so they agree without a message.
bool TokenDispatcher::fit_window(std::unique_ptr<SharedWindow>& w, const DispatchPlan& p,
                                 int64_t d) const {
  const int P = ep_size_;
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
    if (r == ep_rank_) mine = grown;
  }
  const bool room = shm_room(w ? window_bytes(*w, P) : 0.0, double(total));
  w.reset();
  if (room) w = std::make_unique<SharedWindow>(*ep_, mine);
  synced();  // shm_room's all-reduce ordered every earlier read
  return w != nullptr;
}

void TokenDispatcher::fall_back() const {
  transport_ = EpTransport::alltoallv;  // every rank saw the same shortage
  reason_ = "the ep group's shared blocks do not fit in /dev/shm or runtime.ep_shm_limit_mb";
}

void TokenDispatcher::synced() const {
  inbox_busy_ = outbox_busy_ = false;
  slots_->settle();
}

void TokenDispatcher::fence(SharedWindow& w) const {
  w.fence();
  synced();
}

double TokenDispatcher::shm_bytes() const {
  double held = window_ ? window_bytes(*window_, ep_size_) : 0.0;
  for (const auto& slot : slots_->slots)
    if (slot.window) held += window_bytes(*slot.window, ep_size_);
  return held;
}

bool TokenDispatcher::shm_room(double old_bytes, double new_bytes) const {
  const double after = shm_bytes() - old_bytes + new_bytes;
  int short_of_memory =
      SharedWindow::free_bytes() < new_bytes + (64 << 20) || (shm_limit_ > 0 && after > shm_limit_)
          ? 1
          : 0;
  ep_->allreduce_max(&short_of_memory, 1);
  ++growths_;
  return short_of_memory == 0;
}

// Sources write: each its rows for expert rank r, straight from x in send
// order, into its place in r's inbox (its own rows go to expert_in
// directly). After the fence each expert rank copies its inbox out; the
// inboxes stay marked busy until the next collective (or a fence before the
// next write into them).
void TokenDispatcher::dispatch_shm(const DispatchPlan& p, const float* src, bool indexed,
                                   float* expert_in, int64_t d, DispatchTimes* times) const {
  const double t0 = ep_clock_s();
  const int P = ep_size_, me = ep_rank_;
  const size_t row_bytes = kRowBytes * size_t(d);
  if (inbox_busy_) fence(*window_);
  for (int i = 0; i < P; ++i) {
    const int r = (me + i) % P;  // start at different peers: less contention
    const int64_t n = p.send_rows[r], first = p.send_displ[r];
    if (n == 0) continue;
    float* dst =
        r == me ? expert_in + p.recv_displ[me] * d : inbox_of(*window_, r) + p.peer_offset[r] * d;
    if (indexed) {
      kernels::gather_rows(src, d, p.send_token.data() + first, n, dst);
    } else {
      std::memcpy(dst, src + first * d, row_bytes * size_t(n));
    }
  }
  fence(*window_);
  const float* in = inbox_of(*window_, me);
  const int64_t mine_at = p.recv_displ[me], mine_rows = p.recv_rows[me], R = p.received();
  std::memcpy(expert_in, in, row_bytes * size_t(mine_at));
  const int64_t after = mine_at + mine_rows;
  std::memcpy(expert_in + after * d, in + after * d, row_bytes * size_t(R - after));
  inbox_busy_ = true;
  account(double(p.sent() - p.send_rows[me]) * double(row_bytes));
  if (times) {
    times->a2a += ep_clock_s() - t0;
    times->a2a_bytes += double(p.sent()) * double(row_bytes);
  }
}

void TokenDispatcher::visit_back(const DispatchPlan& p, const float* expert_side, int64_t d,
                                 const CopyVisitor& fn, KeptRows* keep,
                                 DispatchTimes* times) const {
  const int64_t T = p.T, S = p.sent();
  const int k = p.k;
  auto visit_send_order = [&](const float* rows) {
    const double t0 = ep_clock_s();
    std::vector<const float*> ptr(static_cast<size_t>(k));
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) {
        const int64_t r = p.row_of[t * k + j];
        ptr[size_t(j)] = r < 0 ? nullptr : rows + r * d;
      }
      fn(t, ptr.data());
    }
    if (times) times->combine += ep_clock_s() - t0;
  };
  // Without ep the expert side is in send order already.
  if (!ep_) return visit_send_order(expert_side);
  if (keep && keep->filled) return visit_send_order(keep->rows.data());
  if (transport_ == EpTransport::shm && shm_reserve(p, d))
    return visit_back_shm(p, expert_side, d, fn, keep, times);

  const double t0 = ep_clock_s();
  std::vector<float>& back = keep ? keep->rows : back_;
  if (back.size() < size_t(S * d)) back.resize(static_cast<size_t>(S * d));  // grow only
  if (keep) keep->filled = true;
  ep_->alltoallv(expert_side, p.recv_rows, p.recv_displ, back.data(), p.send_rows, p.send_displ,
                 kRowBytes * static_cast<size_t>(d));
  if (times) {
    times->a2a += ep_clock_s() - t0;
    times->a2a_bytes += double(p.received()) * double(d) * kRowBytes;
  }
  visit_send_order(back.data());
}

// The expert rank puts its rows in its outbox (nothing to do when the
// experts wrote them there); after the fence each source reads its copies'
// rows where they lie in the peers' outboxes, copying them into keep on the
// way when asked; the outboxes stay marked busy until the next collective.
void TokenDispatcher::visit_back_shm(const DispatchPlan& p, const float* expert_side, int64_t d,
                                     const CopyVisitor& fn, KeptRows* keep,
                                     DispatchTimes* times) const {
  const double t0 = ep_clock_s();
  const int me = ep_rank_, k = p.k;
  const int64_t R = p.received();
  const size_t row_bytes = kRowBytes * size_t(d);
  float* out_me = inbox_of(*window_, me) + R * d;
  if (outbox_busy_) fence(*window_);  // on every rank alike: the flag is the same everywhere
  if (expert_side != out_me && R > 0) std::memcpy(out_me, expert_side, row_bytes * size_t(R));
  fence(*window_);
  const double t1 = ep_clock_s();
  const auto base = outbox_bases(*window_, p, d);
  if (!keep) {
    visit_rows(p, base.data(), fn, d);
  } else {
    // Copies the rows into keep (send order) on the way, and shows fn those.
    if (keep->rows.size() < size_t(p.sent() * d)) keep->rows.resize(size_t(p.sent() * d));
    keep->filled = true;
    float* kept = keep->rows.data();
    std::vector<const float*> ptr(static_cast<size_t>(k));
    visit_rows(
        p, base.data(),
        [&](int64_t t, const float* const* rows) {
          for (int j = 0; j < k; ++j) {
            const int64_t r = p.row_of[t * k + j];
            ptr[size_t(j)] = rows[j] ? kept + r * d : nullptr;
            if (rows[j]) std::memcpy(kept + r * d, rows[j], row_bytes);
          }
          fn(t, ptr.data());
        },
        d);
  }
  const double t2 = ep_clock_s();
  outbox_busy_ = true;
  account(double(R - p.recv_rows[me]) * double(row_bytes));
  if (times) {
    const double t3 = ep_clock_s();
    times->a2a += (t1 - t0) + (t3 - t2);
    times->combine += t2 - t1;
    times->a2a_bytes += double(R) * double(row_bytes);
  }
}

std::unique_ptr<ForwardRows> TokenDispatcher::dispatch_forward(const DispatchPlan& p,
                                                               const float* x, int64_t d,
                                                               DispatchTimes* times) const {
  auto rows = std::make_unique<ForwardRows>();
  const int P = ep_size_, me = ep_rank_;
  const int64_t R = p.received();
  const size_t row_bytes = kRowBytes * size_t(d);
  if (ep_ && transport_ == EpTransport::shm) {
    // The lowest free slot (the same on every rank), grown if this step needs more.
    const double t0 = ep_clock_s();
    int s = 0;
    while (s < int(slots_->slots.size()) && slots_->slots[size_t(s)].state != SlotPool::State::free)
      ++s;
    if (s == int(slots_->slots.size())) slots_->slots.emplace_back();
    SlotPool::Slot& slot = slots_->slots[size_t(s)];
    if (fit_window(slot.window, p, d)) {
      slot.state = SlotPool::State::busy;
      rows->pool_ = slots_;
      rows->slot_ = s;
      SharedWindow& w = *slot.window;
      for (int i = 0; i < P; ++i) {
        const int r = (me + i) % P;  // start at different peers: less contention
        if (p.send_rows[r] == 0) continue;
        kernels::gather_rows(x, d, p.send_token.data() + p.send_displ[r], p.send_rows[r],
                             inbox_of(w, r) + p.peer_offset[r] * d);
      }
      fence(w);
      rows->in_ = inbox_of(w, me);
      rows->out_ = inbox_of(w, me) + R * d;
      account(double(p.sent() - p.send_rows[me]) * double(row_bytes));
      if (times) {
        times->a2a += ep_clock_s() - t0;
        times->a2a_bytes += double(p.sent()) * double(row_bytes);
      }
      return rows;
    }
    fall_back();
  }
  rows->pool_ = slots_;
  rows->own_in_ = slots_->take(size_t(R * d));
  rows->own_out_ = slots_->take(size_t(R * d));
  rows->kept_.rows = slots_->take(size_t(p.sent() * d));
  rows->in_ = rows->own_in_.data();
  rows->out_ = rows->own_out_.data();
  dispatch(p, x, rows->in_, d, times);
  return rows;
}

// Bases such that row r of the send order lies at base[peer_of_row(r)] + r*d.
void TokenDispatcher::visit_rows(const DispatchPlan& p, const float* const* base,
                                 const CopyVisitor& fn, int64_t d) const {
  const int k = p.k;
  std::vector<const float*> ptr(static_cast<size_t>(k));
  for (int64_t t = 0; t < p.T; ++t) {
    for (int j = 0; j < k; ++j) {
      const int64_t r = p.row_of[t * k + j];
      ptr[size_t(j)] = r < 0 ? nullptr : base[size_t(p.peer_of_row(r))] + r * d;
    }
    fn(t, ptr.data());
  }
}

void TokenDispatcher::combine_forward(const DispatchPlan& p, ForwardRows& rows, const float* weight,
                                      float* y, int64_t d, DispatchTimes* times) const {
  if (rows.slot_ < 0) {
    if (!ep_) return combine(p, rows.out_, weight, y, d, nullptr, times);
    return combine(p, rows.out_, weight, y, d, &rows.kept_, times);
  }
  const double t0 = ep_clock_s();
  fence(*slots_->slots.at(size_t(rows.slot_)).window);  // every expert's outputs are in its outbox
  const double t1 = ep_clock_s();
  visit_forward(p, rows, d, [&](int64_t t, const float* const* r) {
    kernels::combine_row(r, weight + t * p.k, p.k, d, y + t * d);
  });
  account(double(p.received() - p.recv_rows[ep_rank_]) * double(kRowBytes) * double(d));
  if (times) {
    times->a2a += t1 - t0;
    times->combine += ep_clock_s() - t1;
    times->a2a_bytes += double(p.received()) * double(kRowBytes) * double(d);
  }
}

void TokenDispatcher::visit_forward(const DispatchPlan& p, ForwardRows& rows, int64_t d,
                                    const CopyVisitor& fn) const {
  if (rows.slot_ < 0) {
    if (!ep_) return visit_back(p, rows.out_, d, fn);
    return visit_back(p, rows.out_, d, fn, &rows.kept_);
  }
  const auto base = outbox_bases(*slots_->slots.at(size_t(rows.slot_)).window, p, d);
  visit_rows(p, base.data(), fn, d);
}

void TokenDispatcher::combine(const DispatchPlan& p, const float* expert_side, const float* weight,
                              float* y, int64_t d, KeptRows* keep, DispatchTimes* times) const {
  const int k = p.k;
  visit_back(
      p, expert_side, d,
      [&](int64_t t, const float* const* rows) {
        kernels::combine_row(rows, weight ? weight + t * k : nullptr, k, d, y + t * d);
      },
      keep, times);
}

}  // namespace trident::ep
