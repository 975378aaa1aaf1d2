// The local transport (ep = 1): every expert is on this rank, so the expert
// side is the send order and a transfer is the permutation alone.
#include "owned_rows.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/parallel/ep/transport.hpp"

namespace trident::ep {
namespace {

class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(const kernels::Ctx& ctx) : ctx_(ctx) {}
  EpTransport kind() const override { return EpTransport::local; }

  void dispatch(const DispatchPlan& p, const SendRows& src, float* expert_in, int64_t d) override {
    const double t0 = stamp();
    if (src.index) {
      kernels::gather_rows(ctx_, src.base, d, src.index, p.sent(), expert_in);
    } else if (p.sent() > 0) {
      kernels::copy(ctx_, expert_in, src.base, p.sent() * d);
    }
    span("ep.permute", t0);
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
  kernels::Ctx ctx_;
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>(ctx_);
};

}  // namespace

std::unique_ptr<Transport> make_local_transport(const kernels::Ctx& ctx) {
  return std::make_unique<LocalTransport>(ctx);
}

}  // namespace trident::ep
