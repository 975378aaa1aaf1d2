// The alltoallv transport: an all-to-all-v of token rows over the ep
// communicator, as one message per (source, expert) block, so that rows
// land where they belong: in expert order on the expert side, in send order
// back on the source. Rows are gathered into a send buffer first; nothing
// is packed or unpacked after.
#include <vector>

#include "../row_views.hpp"
#include "owned_rows.hpp"
#include "trident/core/overlap.hpp"
#include "trident/parallel/ep/transport.hpp"

namespace trident::ep {
namespace {

constexpr size_t kRowBytes = sizeof(float);
constexpr int kToExperts = 0x4550, kToSources = 0x4551;  // message tags of the two directions

class AlltoallvTransport final : public Transport {
 public:
  AlltoallvTransport(Communicator& ep, const kernels::Ctx& ctx) : Transport(ctx), ep_(ep) {}
  EpTransport kind() const override { return EpTransport::alltoallv; }

  std::unique_ptr<Exchange> start_dispatch(const DispatchPlan& p, const Tensor& rows,
                                           const Tensor& expert_in) override {
    return post(p, rows.ptr(), expert_in.data<float>(), true, rows.dim(-1));
  }

  std::unique_ptr<Exchange> start_return(const DispatchPlan& p, const Tensor& expert_side,
                                         const Tensor& back) override {
    return post(p, expert_side.ptr(), back.data<float>(), false, back.dim(-1));
  }

  void dispatch(const DispatchPlan& p, const SendRows& src, const Tensor& expert_in) override {
    const double t0 = stamp();
    const Tensor rows = permute(p, src);
    const double t1 = stamp();
    finish(*start_dispatch(p, rows, expert_in));
    if (sink_) sink_->span(prof::Span{"ep.permute", -1, -1, -1, t0, t1});
    span("ep.dispatch", t1);
    count("ep.bytes", double(p.sent()) * double(rows.dim(-1)) * kRowBytes);
  }

  kernels::RowBlocks gather_back(const DispatchPlan& p, const Tensor& expert_side,
                                 KeptRows* keep) override {
    const int64_t S = p.sent(), d = expert_side.dim(-1);
    if (keep && keep->filled) return first_rows(keep->rows, S, d);
    Tensor& back = keep ? keep->rows : back_;
    kernels::reserve(ctx_, back, S * d);
    if (keep) keep->filled = true;
    const Tensor rows = first_rows(back, S, d);
    const double t0 = stamp();
    finish(*start_return(p, expert_side, rows));
    span("ep.return", t0);
    count("ep.bytes", double(p.received()) * double(d) * kRowBytes);
    return rows;
  }

  std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const Tensor& x) override {
    auto rows = std::make_unique<OwnedRows>(pool_, p.received(), p.sent(), x.dim(-1));
    dispatch(p, SendRows{x, p.send_token}, rows->in());
    return rows;
  }

  void return_forward(const DispatchPlan& p, ForwardRows& rows) override {
    auto& own = static_cast<OwnedRows&>(rows);
    own.set_returned(gather_back(p, own.out(), &own.kept));
  }

 private:
  // Posts every block from `from` to `to`: to_experts, from this rank's
  // send-order rows [S, d] to the expert sides (this rank's [R, d]
  // receives); else the reverse. A block is the rows of one source for one
  // expert, contiguous on both sides. Receives are posted first; peers go
  // in turn from the next rank on, so that not every rank starts at rank 0;
  // the blocks that stay on this rank are copied while the others travel.
  // The returned exchange waits for the requests.
  std::unique_ptr<Exchange> post(const DispatchPlan& p, const float* from, float* to,
                                 bool to_experts, int64_t d) {
    const int P = p.ep_size, L = p.local_experts, me = p.ep_rank;
    const size_t row_bytes = kRowBytes * size_t(d);
    const int tag = (to_experts ? kToExperts : kToSources) + 2 * overlap::lane();
    // fn(offset in floats, rows) for each block between this rank and peer
    // r: on this rank's expert side (r the source), or in its send order (r
    // the expert rank).
    auto blocks = [&](int r, bool expert_side, auto&& fn) {
      for (int e = 0; e < L; ++e) {
        const int64_t n = expert_side ? p.chunk_rows[r * L + e] : p.tokens_per_expert[r * L + e];
        if (n > 0) fn((expert_side ? p.chunk_offset[r * L + e] : p.expert_first[r * L + e]) * d, n);
      }
    };
    auto requests = std::make_shared<std::vector<Request>>();
    // One group, so that a device backend (NCCL) posts them together.
    ep_.begin_group();
    for (int i = 1; i < P; ++i) {
      const int r = (me + i) % P;
      blocks(r, to_experts, [&](int64_t at, int64_t n) {
        requests->push_back(ep_.irecv(to + at, row_bytes * size_t(n), r, tag));
      });
    }
    for (int i = 1; i < P; ++i) {
      const int r = (me + i) % P;
      blocks(r, !to_experts, [&](int64_t at, int64_t n) {
        requests->push_back(ep_.isend(from + at, row_bytes * size_t(n), r, tag));
      });
    }
    ep_.end_group();
    for (int e = 0; e < L; ++e) {
      if (p.chunk_rows[me * L + e] == 0) continue;
      const int64_t sent_at = p.expert_first[me * L + e] * d,
                    expert_at = p.chunk_offset[me * L + e] * d;
      copy_floats(ctx_, from + (to_experts ? sent_at : expert_at),
                  to + (to_experts ? expert_at : sent_at), p.chunk_rows[me * L + e] * d);
    }
    return std::make_unique<DeferredExchange>([this, requests] { ep_.wait_all(*requests); });
  }

  Communicator& ep_;
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>(ctx_);
  Tensor back_;  // rows back when the caller keeps none
};

}  // namespace

std::unique_ptr<Transport> make_alltoallv_transport(Communicator& ep, const kernels::Ctx& ctx) {
  return std::make_unique<AlltoallvTransport>(ep, ctx);
}

}  // namespace trident::ep
