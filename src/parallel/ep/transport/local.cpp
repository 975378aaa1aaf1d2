// The local transport (ep = 1): every expert is on this rank, so the expert
// side is the send order and a transfer is the permutation alone.
#include "../row_views.hpp"
#include "owned_rows.hpp"
#include "trident/parallel/ep/transport.hpp"

namespace trident::ep {
namespace {

class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(const kernels::Ctx& ctx) : Transport(ctx) {}
  EpTransport kind() const override { return EpTransport::local; }

  void dispatch(const DispatchPlan& p, const SendRows& src, float* expert_in, int64_t d) override {
    const double t0 = stamp();
    if (src.index) {
      gather_send_rows(ctx_, src.base, p.T, src.index, p.sent(), expert_in, d);
    } else {
      copy(src.base, expert_in, p.sent() * d);
    }
    span("ep.permute", t0);
  }

  // Nothing travels: the exchange is a copy, complete when posted.
  std::unique_ptr<Exchange> start_dispatch(const DispatchPlan& p, const float* rows,
                                           float* expert_in, int64_t d) override {
    copy(rows, expert_in, p.sent() * d);
    return std::make_unique<DeferredExchange>(nullptr);
  }
  std::unique_ptr<Exchange> start_return(const DispatchPlan& p, const float* expert_side,
                                         float* back, int64_t d) override {
    copy(expert_side, back, p.sent() * d);
    return std::make_unique<DeferredExchange>(nullptr);
  }

  kernels::RowSource gather_back(const DispatchPlan&, const float* expert_side, int64_t,
                                 KeptRows*) override {
    return kernels::RowSource(expert_side);
  }

  std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const float* x,
                                                int64_t d) override {
    auto rows = std::make_unique<OwnedRows>(pool_, size_t(p.received() * d), 0);
    dispatch(p, SendRows{x, p.send_token.data<int64_t>()}, rows->in(), d);
    return rows;
  }

  void return_forward(const DispatchPlan&, ForwardRows& rows, int64_t) override {
    auto& own = static_cast<OwnedRows&>(rows);
    own.set_returned(kernels::RowSource(own.out()));
  }

 private:
  void copy(const float* from, float* to, int64_t n) { copy_floats(ctx_, from, to, n); }

  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>(ctx_);
};

}  // namespace

std::unique_ptr<Transport> make_local_transport(const kernels::Ctx& ctx) {
  return std::make_unique<LocalTransport>(ctx);
}

}  // namespace trident::ep
