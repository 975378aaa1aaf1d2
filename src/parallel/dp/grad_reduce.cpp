// Gradient reduction by GradReduce tag (see parallel/dp/grad_reduce.hpp).
#include "trident/parallel/dp/grad_reduce.hpp"

#include <vector>

#include "trident/kernels/ops.hpp"

namespace trident::dp {
namespace {

void reduce_kind(const ParamStore& store, GradReduce kind, Communicator* comm) {
  if (!comm || comm->size() == 1) return;
  Tensor g = store.grads(kind);
  if (g.empty()) return;
  comm->allreduce_sum(g.ptr(), size_t(g.numel()));
}

}  // namespace

void reduce_gradients(const ParamStore& store, Communicator* dpcp, Communicator* expert_replica) {
  reduce_kind(store, GradReduce::dense, dpcp);
  reduce_kind(store, GradReduce::expert, expert_replica);
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
