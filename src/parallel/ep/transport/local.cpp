// The local transport (ep = 1): every expert is on this rank, so the expert
// side is the send order and a transfer is the permutation alone.
#include "../row_views.hpp"
#include "owned_rows.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/parallel/ep/transport.hpp"

namespace trident::ep {
namespace {

class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(const kernels::Ctx& ctx) : Transport(ctx) {}
  EpTransport kind() const override { return EpTransport::local; }

  void dispatch(const DispatchPlan& p, const SendRows& src, const Tensor& expert_in) override {
    const double t0 = stamp();
    if (src.index.empty()) {
      copy(src.rows, expert_in);
    } else {
      kernels::gather_rows(ctx_, src.rows, src.index, expert_in);
    }
    span("ep.permute", t0);
  }

  // Nothing travels: the exchange is a copy, complete when posted.
  std::unique_ptr<Exchange> start_dispatch(const DispatchPlan&, const Tensor& rows,
                                           const Tensor& expert_in) override {
    copy(rows, expert_in);
    return std::make_unique<DeferredExchange>(nullptr);
  }
  std::unique_ptr<Exchange> start_return(const DispatchPlan&, const Tensor& expert_side,
                                         const Tensor& back) override {
    copy(expert_side, back);
    return std::make_unique<DeferredExchange>(nullptr);
  }

  kernels::RowBlocks gather_back(const DispatchPlan&, const Tensor& expert_side,
                                 KeptRows*) override {
    return kernels::RowBlocks(expert_side);
  }

  std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const Tensor& x) override {
    auto rows = std::make_unique<OwnedRows>(pool_, p.received(), 0, x.dim(-1));
    dispatch(p, SendRows{x, p.send_token}, rows->in());
    return rows;
  }

  std::unique_ptr<ForwardRows> dispatch_forward_into(const DispatchPlan& p, const Tensor& x,
                                                     const Tensor& expert_in) override {
    auto rows = std::make_unique<OwnedRows>(pool_, p.received(), 0, x.dim(-1));
    const double t0 = stamp();
    kernels::gather_rows(ctx_, x, p.send_token, expert_in);
    span("ep.permute", t0);
    return rows;
  }

  void return_forward(const DispatchPlan&, ForwardRows& rows) override {
    auto& own = static_cast<OwnedRows&>(rows);
    own.set_returned(kernels::RowBlocks(own.out()));
  }

 private:
  // Same-size row tensors (the send order is the expert side here).
  void copy(const Tensor& from, const Tensor& to) {
    copy_floats(ctx_, from.ptr(), to.data<float>(), to.numel());
  }

  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>(ctx_);
};

}  // namespace

std::unique_ptr<Transport> make_local_transport(const kernels::Ctx& ctx) {
  return std::make_unique<LocalTransport>(ctx);
}

}  // namespace trident::ep
