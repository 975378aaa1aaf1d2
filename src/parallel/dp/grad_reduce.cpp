// Gradient reduction by GradReduce tag (see parallel/dp/grad_reduce.hpp).
#include "trident/parallel/dp/grad_reduce.hpp"

#include <algorithm>

#include "trident/kernels/ops.hpp"

namespace trident::dp {
namespace {

void reduce_kind(const std::vector<Param*>& params, GradReduce kind, Communicator* comm) {
  if (!comm || comm->size() == 1) return;
  size_t n = 0;
  for (Param* p : params)
    if (p->reduce == kind) n += size_t(p->grad.numel());
  if (n == 0) return;
  std::vector<float> buf(n);
  size_t off = 0;
  for (Param* p : params)
    if (p->reduce == kind) {
      std::copy(p->grad.data.begin(), p->grad.data.end(), buf.begin() + long(off));
      off += size_t(p->grad.numel());
    }
  comm->allreduce_sum(buf.data(), n);
  off = 0;
  for (Param* p : params)
    if (p->reduce == kind) {
      std::copy_n(buf.begin() + long(off), p->grad.numel(), p->grad.data.begin());
      off += size_t(p->grad.numel());
    }
}

}  // namespace

void reduce_gradients(const std::vector<Param*>& params, Communicator* dpcp,
                      Communicator* expert_replica) {
  reduce_kind(params, GradReduce::dense, dpcp);
  reduce_kind(params, GradReduce::expert, expert_replica);
}

double global_grad_sumsq(const std::vector<Param*>& params, Communicator* dpcp,
                         Communicator* expert_replica, Communicator* world) {
  const bool dense_owner = !dpcp || dpcp->rank() == 0;
  const bool expert_owner = !expert_replica || expert_replica->rank() == 0;
  double s = 0.0;
  for (Param* p : params) {
    if (p->reduce == GradReduce::dense && dense_owner)
      s += kernels::sum_squares(p->grad.ptr(), p->grad.numel());
    else if (p->reduce == GradReduce::expert && expert_owner)
      s += kernels::sum_squares(p->grad.ptr(), p->grad.numel());
  }
  if (world && world->size() > 1) world->allreduce_sum(&s, 1);
  return s;
}

}  // namespace trident::dp
