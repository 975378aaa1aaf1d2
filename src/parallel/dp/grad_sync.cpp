// The three ways a step's gradients are synchronised (see grad_sync.hpp).
#include "trident/parallel/dp/grad_sync.hpp"

#include "trident/parallel/dp/grad_reduce.hpp"

namespace trident::dp {

std::array<int64_t, 3> GradSync::store_multiples(bool sharded, Communicator* dpcp,
                                                 Communicator* expert_replica) {
  return sharded ? shard_multiples(dpcp, expert_replica) : std::array<int64_t, 3>{1, 1, 1};
}

GradSync::GradSync(const ParamStore& store, bool sharded, Communicator* dpcp,
                   Communicator* expert_replica)
    : store_(store),
      sharded_(sharded),
      dpcp_(dpcp),
      expert_replica_(expert_replica),
      sharding_(make_sharding(store, sharded, dpcp, expert_replica)) {}

void GradSync::use_buckets(double bucket_mb, int microbatches, GradBuckets::BeforeReduce before) {
  buckets_ = std::make_unique<GradBuckets>(store_, sharding_, dpcp_, expert_replica_, bucket_mb,
                                           microbatches, std::move(before));
  if (buckets_->buckets().empty()) buckets_.reset();  // nothing to reduce
}

void GradSync::reduce(bool bucketed, const kernels::Ctx& ctx) {
  if (bucketed)
    buckets_->finish();
  else if (sharded_)
    reduce_scatter_gradients(store_, sharding_, ctx);
  else
    reduce_gradients(store_, dpcp_, expert_replica_);
}

double GradSync::sumsq(Communicator* world, const kernels::Ctx& ctx) const {
  return grad_sumsq(store_, dpcp_, expert_replica_, world, ctx);
}

void GradSync::after_update(const kernels::Ctx& ctx) {
  if (sharded_) allgather_values(store_, sharding_, ctx);
}

}  // namespace trident::dp
