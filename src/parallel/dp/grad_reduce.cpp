// Gradient reduction by GradReduce tag (see parallel/dp/grad_reduce.hpp).
#include "trident/parallel/dp/grad_reduce.hpp"

#include <algorithm>
#include <vector>

#include "trident/kernels/functional.hpp"

namespace trident::dp {
namespace {

void reduce_kind(const ParamStore& store, GradReduce kind, Communicator* comm) {
  if (!comm || comm->size() == 1) return;
  Tensor g = store.grads(kind);
  if (g.empty()) return;
  comm->allreduce_sum(g.ptr(), size_t(g.numel()), SumOrder::rank);
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
      s += kernels::sum_squares(ctx_, p->grad);
    else if (p->reduce == GradReduce::expert && expert_owner)
      s += kernels::sum_squares(ctx_, p->grad);
  }
  if (world && world->size() > 1) world->allreduce_sum(&s, 1);
  return s;
}

double grad_sumsq(const ParamStore& store, Communicator* dpcp, Communicator* expert_replica,
                  Communicator* world, const kernels::Ctx& ctx) {
  const Tensor grads = store.grads();
  // The parameters' elements of each kind, without the padding a sharded
  // store adds at the range's end: the same count either way.
  int64_t numel[2] = {0, 0};
  for (const ParamStore::Entry& e : store.entries())
    if (e.param->reduce != GradReduce::none) numel[size_t(e.param->reduce)] += e.numel;
  double part[2] = {0.0, 0.0};  // dense, expert
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    const size_t k = size_t(kind);
    Communicator* g = kind == GradReduce::dense ? dpcp : expert_replica;
    const int64_t p = g ? g->size() : 1, r = g ? g->rank() : 0;
    // Part r: the elements of shard r (ceil(numel / p) each, as the padded
    // store's shards), without its padding.
    const int64_t each = (numel[k] + p - 1) / p;
    const int64_t lo = std::min(numel[k], r * each), hi = std::min(numel[k], (r + 1) * each);
    if (lo < hi)
      part[k] = kernels::sum_squares(ctx, grads.view(store.range(kind).begin + lo, {hi - lo}));
  }
  const int w = world ? world->size() : 1;
  if (w == 1) return part[0] + part[1];
  std::vector<double> all(2 * size_t(w));
  world->allgather(part, all.data(), sizeof part);
  double s = 0.0;
  for (size_t k = 0; k < 2; ++k)
    for (size_t i = 0; i < size_t(w); ++i) s += all[2 * i + k];
  return s;
}

}  // namespace trident::dp
