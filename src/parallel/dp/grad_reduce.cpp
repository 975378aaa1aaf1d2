// Gradient reduction by GradReduce tag (see parallel/dp/grad_reduce.hpp).
#include "trident/parallel/dp/grad_reduce.hpp"

#include <vector>

#include "trident/kernels/ops.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::dp {
namespace {

// The packing buffer comes from the Ctx's workspace when it has one (it is
// reused step after step), else from the Ctx's allocator for the call.
void reduce_kind(const kernels::Ctx& ctx_, const std::vector<Param*>& params, GradReduce kind,
                 Communicator* comm) {
  if (!comm || comm->size() == 1) return;
  int64_t n = 0;
  for (Param* p : params)
    if (p->reduce == kind) n += p->grad.numel();
  if (n == 0) return;
  Tensor own;
  float* buf = nullptr;
  if (ctx_.workspace) {
    buf = static_cast<float*>(ctx_.workspace->get(size_t(n) * sizeof(float)));
  } else {
    own = kernels::empty(ctx_, {n});
    buf = own.ptr();
  }
  int64_t off = 0;
  for (Param* p : params)
    if (p->reduce == kind) {
      kernels::copy(ctx_, buf + off, p->grad.ptr(), p->grad.numel());
      off += p->grad.numel();
    }
  comm->allreduce_sum(buf, size_t(n));
  off = 0;
  for (Param* p : params)
    if (p->reduce == kind) {
      kernels::copy(ctx_, p->grad.ptr(), buf + off, p->grad.numel());
      off += p->grad.numel();
    }
}

}  // namespace

void reduce_gradients(const std::vector<Param*>& params, Communicator* dpcp,
                      Communicator* expert_replica, const kernels::Ctx& ctx) {
  reduce_kind(ctx, params, GradReduce::dense, dpcp);
  reduce_kind(ctx, params, GradReduce::expert, expert_replica);
}

double global_grad_sumsq(const std::vector<Param*>& params, Communicator* dpcp,
                         Communicator* expert_replica, Communicator* world,
                         const kernels::Ctx& ctx_) {
  const bool dense_owner = !dpcp || dpcp->rank() == 0;
  const bool expert_owner = !expert_replica || expert_replica->rank() == 0;
  double s = 0.0;
  for (Param* p : params) {
    if (p->reduce == GradReduce::dense && dense_owner)
      s += kernels::sum_squares(ctx_, p->grad.ptr(), p->grad.numel());
    else if (p->reduce == GradReduce::expert && expert_owner)
      s += kernels::sum_squares(ctx_, p->grad.ptr(), p->grad.numel());
  }
  if (world && world->size() > 1) world->allreduce_sum(&s, 1);
  return s;
}

}  // namespace trident::dp
