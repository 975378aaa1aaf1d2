// Ulysses (all-to-all) context parallelism, alone or under the ring (see
// parallel/cp/ulysses_attention.hpp), forward and backward side by side.
//
// An exchange packs, for every rank d of the Ulysses group, the head slice d
// takes of every local token into one contiguous block, and one all-to-all
// with equal blocks delivers them: the block from rank s is exactly rows
// [s*T_local, (s+1)*T_local) of the head-layout tensor, so it is received in
// place. The way back needs no packing (the head-layout rows for rank d are
// already one block) and unpacks each arriving block into its head slice.
// The exchanges are blocking: Ulysses has nothing to overlap them with (the
// attention needs all of them), which is its cost against the ring.
#include "trident/parallel/cp/ulysses_attention.hpp"

#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/cp/config_rules.hpp"

namespace trident::cp {

namespace {

// The Ulysses group (consecutive cp ranks) or the ring (same Ulysses index)
// of this cp rank. Collective over cp.
std::unique_ptr<Communicator> split_group(Communicator* cp, int u, bool ulysses_group) {
  TRIDENT_CHECK(cp && u >= 1 && cp->size() % u == 0,
                "Ulysses group of " + std::to_string(u) + " does not divide the cp group");
  const int r = cp->rank();
  return ulysses_group ? cp->split(r / u, r % u, CommKind::cp, "cp_ulysses")
                       : cp->split(r % u, r / u, CommKind::cp, "cp_ring");
}

int checked_heads(int H, int Hkv, int u) {
  const std::string broken = heads_rule_broken(H, Hkv, u);
  if (!broken.empty()) throw InputError(broken);
  return H / u;
}

}  // namespace

UlyssesAttention::UlyssesAttention(Communicator* cp, int ulysses, Layout layout, bool causal,
                                   int64_t seq_len, int H, int Hkv, int D, const kernels::Ctx& ctx)
    : ctx_(ctx),
      cp_(cp),
      layout_(layout),
      causal_(causal),
      seq_len_(seq_len),
      u_(ulysses),
      H_(H),
      Hkv_(Hkv),
      D_(D),
      hq_(checked_heads(H, Hkv, ulysses)),
      hkv_local_(Hkv % ulysses == 0 ? Hkv / ulysses : 1) {
  TRIDENT_CHECK(cp && ulysses >= 1 && cp->size() % ulysses == 0,
                "Ulysses group of " + std::to_string(ulysses) + " does not divide the cp group");
  ring_size_ = cp->size() / u_;
  tl_ = seq_len / cp->size();
  positions_ = local_positions(seq_len, cp->size(), cp->rank(), layout, ulysses);
}

void UlyssesAttention::connect() {
  if (ring_) return;
  group_ = split_group(cp_, u_, true);
  ring_comm_ = split_group(cp_, u_, false);
  ring_ = std::make_unique<RingAttention>(ring_comm_.get(), layout_, causal_, seq_len_, ctx_);
  ring_->set_profiler(sink_);
  ring_->set_window(window_);
  TRIDENT_CHECK(group_->size() == u_ && ring_->local_tokens() == u_ * tl_,
                "Ulysses groups do not match the cp group");
}

void UlyssesAttention::set_window(int64_t window) {
  window_ = window;
  if (ring_) ring_->set_window(window);
}

LocalDocs UlyssesAttention::group_docs(const LocalDocs& docs) {
  TRIDENT_CHECK((docs.device == nullptr) == (docs.host == nullptr),
                "UlyssesAttention: document ids on the device and not on the host, or the reverse");
  if (!docs.host) return {};
  // Rank s's tokens are rows [s*tl_, (s+1)*tl_) of the head layout (to_heads),
  // which is the all-gather's order over the group's ranks.
  group_docs_.resize(size_t(u_ * tl_));
  group_->host().allgather(docs.host, group_docs_.data(), size_t(tl_) * sizeof(int32_t));
  if (ctx_.device.is_cpu()) return {group_docs_.data(), group_docs_.data()};
  group_docs_dev_ = kernels::from_host(ctx_, group_docs_.data(), {u_ * tl_}, DType::i32);
  return {group_docs_dev_.data<int32_t>(), group_docs_.data()};
}

int UlyssesAttention::kv_first(int i) const {
  // Query head i*hq_ reads K/V head (i*hq_) / (H/Hkv); with Hkv % u == 0 that
  // is i*Hkv/u, the first of this rank's Hkv/u heads.
  return int((int64_t(i) * hq_ * Hkv_) / H_);
}

void UlyssesAttention::set_profiler(prof::Sink* sink) {
  sink_ = sink;
  if (ring_) ring_->set_profiler(sink);
}

void UlyssesAttention::note_workspace() {
  if (!sink_) return;
  size_t bytes = 0;
  for (const Tensor* t : {&buf_.pack, &buf_.unpack, &buf_.q, &buf_.k, &buf_.v, &buf_.out, &buf_.lse,
                          &buf_.dout, &buf_.dq, &buf_.dk, &buf_.dv})
    bytes += t->bytes();
  sink_->peak("ulysses.workspace_bytes", double(bytes));
}

void UlyssesAttention::exchange(const Tensor& send, const Tensor& recv, int64_t per_peer) {
  const std::vector<int64_t> counts(size_t(u_), per_peer);
  std::vector<int64_t> displs(size_t(u_), 0);
  for (int d = 0; d < u_; ++d) displs[size_t(d)] = d * per_peer;
  group_->alltoallv(send.data_ptr(), counts, displs, recv.data_ptr(), counts, displs,
                    sizeof(float));
  if (sink_) sink_->add("ulysses.bytes_sent", double(per_peer) * (u_ - 1) * sizeof(float));
}

namespace {
// n elements of t from offset (one token's heads, one peer's block).
Tensor span(const Tensor& t, int64_t offset, int64_t n) { return t.view(offset, {n}); }
}  // namespace

template <typename First>
void UlyssesAttention::to_heads(const Tensor& x, int hx, int n, int w, First first, Tensor& dst) {
  prof::Span span_of_call{"ulysses.alltoall"};
  span_of_call.t_begin_s = sink_ ? now_s() : 0;
  const int64_t row = int64_t(n) * w, per_peer = tl_ * row;
  TRIDENT_CHECK(x.numel() == tl_ * hx * w && x.dtype() == DType::f32,
                "UlyssesAttention: an input " + x.shape_str() + " " + dtype_name(x.dtype()) +
                    " should be " + std::to_string(tl_ * hx * w) + " f32");
  kernels::reserve(ctx_, buf_.pack, u_ * per_peer);
  kernels::reserve(ctx_, dst, u_ * per_peer);
  for (int d = 0; d < u_; ++d) {
    const int64_t h0 = first(d);
    for (int64_t t = 0; t < tl_; ++t) {
      Tensor to = span(buf_.pack, d * per_peer + t * row, row);
      kernels::copy(ctx_, to, span(x, (t * hx + h0) * w, row));
    }
  }
  exchange(buf_.pack, dst, per_peer);
  if (sink_) {
    span_of_call.t_end_s = now_s();
    sink_->span(span_of_call);
  }
}

template <typename First>
void UlyssesAttention::to_tokens(const Tensor& y, int hx, int n, int w, First first, bool sum,
                                 const Tensor& x) {
  prof::Span span_of_call{"ulysses.alltoall"};
  span_of_call.t_begin_s = sink_ ? now_s() : 0;
  const int64_t row = int64_t(n) * w, per_peer = tl_ * row;
  TRIDENT_CHECK(x.numel() == tl_ * hx * w && x.dtype() == DType::f32,
                "UlyssesAttention: an output " + x.shape_str() + " " + dtype_name(x.dtype()) +
                    " should be " + std::to_string(tl_ * hx * w) + " f32");
  kernels::reserve(ctx_, buf_.unpack, u_ * per_peer);
  exchange(y, buf_.unpack, per_peer);
  if (sum) kernels::fill(ctx_, x, 0.0f);
  for (int s = 0; s < u_; ++s) {
    const int64_t h0 = first(s);
    for (int64_t t = 0; t < tl_; ++t) {
      Tensor to = span(x, (t * hx + h0) * w, row);
      const Tensor from = span(buf_.unpack, s * per_peer + t * row, row);
      if (sum)
        kernels::add_inplace(ctx_, to, from);
      else
        kernels::copy(ctx_, to, from);
    }
  }
  if (sink_) {
    span_of_call.t_end_s = now_s();
    sink_->span(span_of_call);
  }
}

void UlyssesAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const LocalDocs& docs) {
  connect();
  const LocalDocs gdocs = group_docs(docs);
  auto qh = [this](int d) { return d * hq_; };
  auto kvh = [this](int d) { return kv_first(d); };
  const int64_t nq = u_ * tl_ * hq_ * D_, nkv = u_ * tl_ * hkv_local_ * D_;
  to_heads(q, H_, hq_, D_, qh, buf_.q);
  to_heads(k, Hkv_, hkv_local_, D_, kvh, buf_.k);
  to_heads(v, Hkv_, hkv_local_, D_, kvh, buf_.v);
  kernels::reserve(ctx_, buf_.out, nq);
  kernels::reserve(ctx_, buf_.lse, u_ * tl_ * hq_);
  ring_->forward(span(buf_.q, 0, nq), span(buf_.k, 0, nkv), span(buf_.v, 0, nkv), hq_, hkv_local_,
                 D_, span(buf_.out, 0, nq), span(buf_.lse, 0, u_ * tl_ * hq_), gdocs);
  to_tokens(buf_.out, H_, hq_, D_, qh, false, out);
  to_tokens(buf_.lse, H_, hq_, 1, qh, false, lse);
  note_workspace();
}

void UlyssesAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse, const Tensor& dout,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const LocalDocs& docs) {
  connect();
  const LocalDocs gdocs = group_docs(docs);
  auto qh = [this](int d) { return d * hq_; };
  auto kvh = [this](int d) { return kv_first(d); };
  const int64_t nq = u_ * tl_ * hq_ * D_, nkv = u_ * tl_ * hkv_local_ * D_, nl = u_ * tl_ * hq_;
  to_heads(q, H_, hq_, D_, qh, buf_.q);
  to_heads(k, Hkv_, hkv_local_, D_, kvh, buf_.k);
  to_heads(v, Hkv_, hkv_local_, D_, kvh, buf_.v);
  to_heads(out, H_, hq_, D_, qh, buf_.out);
  to_heads(lse, H_, hq_, 1, qh, buf_.lse);
  to_heads(dout, H_, hq_, D_, qh, buf_.dout);
  kernels::reserve(ctx_, buf_.dq, nq);
  kernels::reserve(ctx_, buf_.dk, nkv);
  kernels::reserve(ctx_, buf_.dv, nkv);
  ring_->backward(span(buf_.q, 0, nq), span(buf_.k, 0, nkv), span(buf_.v, 0, nkv),
                  span(buf_.out, 0, nq), span(buf_.lse, 0, nl), span(buf_.dout, 0, nq), hq_,
                  hkv_local_, D_, span(buf_.dq, 0, nq), span(buf_.dk, 0, nkv),
                  span(buf_.dv, 0, nkv), gdocs);
  // K/V heads replicated on several ranks (u > n_kv_heads): their gradient
  // is the sum of every holder's part.
  const bool replicated = hkv_local_ * u_ > Hkv_;
  to_tokens(buf_.dq, H_, hq_, D_, qh, false, dq);
  to_tokens(buf_.dk, Hkv_, hkv_local_, D_, kvh, replicated, dk);
  to_tokens(buf_.dv, Hkv_, hkv_local_, D_, kvh, replicated, dv);
  note_workspace();
}

}  // namespace trident::cp
