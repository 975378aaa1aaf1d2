// TokenDispatcher: count exchange and the index plan of the expert-major
// permutation; the transfers are the Transport's, the permute and unpermute
// the kernels' (see the header for the layout).
#include "trident/parallel/ep/token_dispatcher.hpp"

#include <string>

#include "row_views.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/ep/transport.hpp"

namespace trident::ep {
namespace {
// now_s() when a sink listens; no clock is read otherwise.
double stamp(const prof::Sink* sink) { return sink ? now_s() : 0.0; }
}  // namespace

const char* ep_transport_name(EpTransport t) {
  switch (t) {
    case EpTransport::local:
      return "local";
    case EpTransport::alltoallv:
      return "alltoallv";
    case EpTransport::shm:
      return "shm";
  }
  return "?";
}

int64_t DispatchPlan::received() const {
  int64_t n = 0;
  for (auto r : recv_rows) n += r;
  return n;
}

const kernels::RowBlocks& ForwardRows::returned() const {
  TRIDENT_CHECK(back_, "ForwardRows: combine_forward has not brought the rows back yet");
  return returned_;
}

TokenDispatcher::TokenDispatcher(Communicator* ep, int n_experts, EpTransportChoice transport,
                                 double shm_limit_bytes, const kernels::Ctx& ctx)
    : ep_(ep && ep->size() > 1 ? ep : nullptr),
      n_experts_(n_experts),
      ep_size_(ep_ ? ep_->size() : 1),
      ep_rank_(ep_ ? ep_->rank() : 0),
      ctx_(ctx) {
  TRIDENT_CHECK(n_experts > 0 && n_experts % ep_size_ == 0,
                "n_experts " + std::to_string(n_experts) + " is not a multiple of ep " +
                    std::to_string(ep_size_));
  transport_ = make_transport(ep_, transport, shm_limit_bytes, ctx_);
}

TokenDispatcher::~TokenDispatcher() = default;

namespace {

// Send side: the stable counting sort of the copies by expert (kernels
// expert_counts and expert_order); the counts come to the host to size the
// transfers.
void plan_send(DispatchPlan& p, const kernels::Ctx& ctx, const Tensor& expert) {
  const int E = p.n_experts, L = p.local_experts, k = p.k;
  const int64_t n = p.T * k;
  TRIDENT_CHECK(expert.numel() == n && expert.dtype() == DType::i32,
                "dispatch plan: expert must be i32 [T*k]");
  Tensor counts = kernels::empty(ctx, {E}, DType::i64);
  kernels::expert_counts(ctx, expert, counts);
  const Tensor host = kernels::to_host(ctx, counts);
  p.tokens_per_expert.assign(host.data<int64_t>(), host.data<int64_t>() + E);
  p.expert_first.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) p.expert_first[e + 1] = p.expert_first[e] + p.tokens_per_expert[e];
  p.row_of = kernels::empty(ctx, {n}, DType::i64);
  p.send_token = kernels::empty(ctx, {p.expert_first[E]}, DType::i64);
  kernels::expert_order(ctx, expert, k, counts, p.row_of, p.send_token);
  p.send_rows.assign(p.ep_size, 0);
  p.send_displ.assign(p.ep_size, 0);
  for (int e = 0; e < E; ++e) p.send_rows[e / L] += p.tokens_per_expert[e];
  for (int r = 1; r < p.ep_size; ++r) p.send_displ[r] = p.send_displ[r - 1] + p.send_rows[r - 1];
}

// Expert side, from every rank's counts: local experts in order, within one
// the sources in rank order; and where this rank's rows land on each peer.
void plan_receive(DispatchPlan& p) {
  const int E = p.n_experts, L = p.local_experts, P = p.ep_size, me = p.ep_rank;
  auto count = [&](int src, int g) { return p.counts[size_t(src) * E + g]; };
  p.chunk_rows.assign(size_t(P) * L, 0);
  p.chunk_offset.assign(size_t(P) * L, 0);
  p.recv_rows.assign(P, 0);
  int64_t off = 0;
  for (int e = 0; e < L; ++e)
    for (int r = 0; r < P; ++r) {
      const int64_t n = count(r, me * L + e);
      p.chunk_rows[r * L + e] = n;
      p.chunk_offset[r * L + e] = off;
      off += n;
      p.recv_rows[r] += n;
    }
  p.rows_at.assign(P, 0);
  p.expert_at.assign(E, 0);
  for (int dst = 0; dst < P; ++dst) {
    int64_t at = 0;  // rows of dst's earlier experts and, for this expert, earlier sources
    for (int g = dst * L; g < (dst + 1) * L; ++g) {
      for (int s = 0; s < P; ++s) {
        if (s == me) p.expert_at[g] = at;
        at += count(s, g);
      }
    }
    p.rows_at[dst] = at;
  }
}

}  // namespace

namespace {
// weight [T*k] (any shape of T*k elements) as the row ops take it, or
// empty (weights 1): checked against the plan.
Tensor weights(const DispatchPlan& p, const Tensor& w, const char* what) {
  TRIDENT_CHECK(w.empty() || (w.dtype() == DType::f32 && w.numel() == p.T * p.k),
                std::string("ep: ") + what + " " + w.shape_str() +
                    " is not f32 [T*k = " + std::to_string(p.T * p.k) + "]");
  return w.empty() ? w : w.reshape({p.T * p.k});
}
}  // namespace

void TokenDispatcher::unpermute(const DispatchPlan& p, const kernels::RowBlocks& rows,
                                const Tensor& weight, const Tensor& y) {
  const double t0 = stamp(sink_);
  row_width(y, p.T, "y");
  kernels::combine_rows(ctx_, rows, p.row_of, weights(p, weight, "weight"), p.k, y);
  if (sink_) sink_->span(prof::Span{"ep.combine", -1, -1, -1, t0, now_s()});
}

void TokenDispatcher::unpermute_backward(const DispatchPlan& p, const kernels::RowBlocks& rows,
                                         const Tensor& dy, const Tensor& weight,
                                         const Tensor& drows, const Tensor& dweight) {
  const int64_t d = row_width(dy, p.T, "dy");
  TRIDENT_CHECK(row_width(drows, p.sent(), "drows") == d, "ep: drows and dy differ in width");
  kernels::combine_rows_backward(ctx_, rows, dy, p.row_of, weights(p, weight, "weight"), p.k, drows,
                                 weights(p, dweight, "dweight"));
}

DispatchPlan TokenDispatcher::plan(const Tensor& expert, int64_t T, int k) {
  const double t0 = stamp(sink_);
  DispatchPlan p;
  p.T = T;
  p.k = k;
  p.n_experts = n_experts_;
  p.ep_size = ep_size_;
  p.ep_rank = ep_rank_;
  p.local_experts = n_experts_ / ep_size_;
  plan_send(p, ctx_, expert);
  // Count exchange: every rank learns every rank's counts, which places
  // each source's rows on each expert rank without another message.
  const double t1 = stamp(sink_);
  if (ep_) {
    p.counts.assign(size_t(ep_size_) * n_experts_, 0);
    ep_->allgather(p.tokens_per_expert.data(), p.counts.data(),
                   sizeof(int64_t) * size_t(n_experts_));
  } else {
    p.counts = p.tokens_per_expert;
  }
  const double t2 = stamp(sink_);
  plan_receive(p);
  transport_->synced();
  if (sink_) {  // the index work is part of the permutation
    sink_->span(prof::Span{"ep.permute", -1, -1, -1, t0, t1});
    sink_->span(prof::Span{"ep.count", -1, -1, -1, t1, t2});
    sink_->span(prof::Span{"ep.permute", -1, -1, -1, t2, now_s()});
  }
  return p;
}

DispatchPlan TokenDispatcher::plan(const std::vector<int>& expert, int64_t T, int k) {
  TRIDENT_CHECK(int64_t(expert.size()) == T * k, "dispatch plan: expert must hold T*k values");
  return plan(kernels::from_host(ctx_, expert.data(), {T * k}, DType::i32), T, k);
}

void TokenDispatcher::dispatch(const DispatchPlan& p, const Tensor& x, const Tensor& expert_in) {
  TRIDENT_CHECK(row_width(x, p.T, "x") == row_width(expert_in, p.received(), "expert_in"),
                "ep: x and expert_in differ in width");
  transport_->dispatch(p, SendRows{x, p.send_token}, expert_in);
}

void TokenDispatcher::dispatch_rows(const DispatchPlan& p, const Tensor& rows,
                                    const Tensor& expert_in) {
  TRIDENT_CHECK(
      row_width(rows, p.sent(), "rows") == row_width(expert_in, p.received(), "expert_in"),
      "ep: rows and expert_in differ in width");
  transport_->dispatch(p, SendRows{rows, Tensor()}, expert_in);
}

Tensor TokenDispatcher::to_expert_side(const DispatchPlan& p, const Tensor& rows) {
  const int64_t d = row_width(rows, p.sent(), "rows");
  if (transport_->kind() == EpTransport::local) return rows.reshape({p.sent(), d});
  Tensor expert_in = kernels::empty(ctx_, {p.received(), d});
  dispatch_rows(p, rows, expert_in);
  return expert_in;
}

void TokenDispatcher::combine(const DispatchPlan& p, const Tensor& expert_side,
                              const Tensor& weight, const Tensor& y, KeptRows* keep) {
  row_width(expert_side, p.received(), "expert_side");
  unpermute(p, transport_->gather_back(p, expert_side, keep), weight, y);
}

void TokenDispatcher::combine_backward(const DispatchPlan& p, const Tensor& expert_side,
                                       const Tensor& dy, const Tensor& weight, const Tensor& drows,
                                       const Tensor& dweight, KeptRows* keep) {
  row_width(expert_side, p.received(), "expert_side");
  unpermute_backward(p, transport_->gather_back(p, expert_side, keep), dy, weight, drows, dweight);
}

std::unique_ptr<ForwardRows> TokenDispatcher::dispatch_forward(const DispatchPlan& p,
                                                               const Tensor& x) {
  row_width(x, p.T, "x");
  return transport_->dispatch_forward(p, x);
}

std::unique_ptr<ForwardRows> TokenDispatcher::dispatch_forward_into(const DispatchPlan& p,
                                                                    const Tensor& x,
                                                                    const Tensor& expert_in) {
  row_width(x, p.T, "x");
  TRIDENT_CHECK(
      expert_in.ndim() == 2 && expert_in.dim(0) == p.received() && expert_in.dim(1) == x.dim(-1),
      "ep: expert_in " + expert_in.shape_str() + " is not [R, d] of x " + x.shape_str());
  return transport_->dispatch_forward_into(p, x, expert_in);
}

void TokenDispatcher::combine_forward(const DispatchPlan& p, ForwardRows& rows,
                                      const Tensor& weight, const Tensor& y) {
  transport_->return_forward(p, rows);
  unpermute(p, rows.returned(), weight, y);
}

void TokenDispatcher::combine_backward(const DispatchPlan& p, const ForwardRows& rows,
                                       const Tensor& dy, const Tensor& weight, const Tensor& drows,
                                       const Tensor& dweight) {
  unpermute_backward(p, rows.returned(), dy, weight, drows, dweight);
}

void TokenDispatcher::set_profiler(prof::Sink* sink) {
  sink_ = sink;
  transport_->set_profiler(sink);
}

EpTransport TokenDispatcher::transport() const { return transport_->kind(); }
double TokenDispatcher::shm_bytes() const { return transport_->shared_memory().bytes; }
int TokenDispatcher::shm_growths() const { return transport_->shared_memory().growths; }
const std::string& TokenDispatcher::transport_reason() const { return transport_->reason(); }

}  // namespace trident::ep
