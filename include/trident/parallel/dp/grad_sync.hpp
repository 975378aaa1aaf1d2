// A step's gradient synchronisation over the data-parallel replicas, the
// one place that knows the three ways it can go:
//
//   plain     after the pipeline, one all-reduce per reduction kind
//             (parallel/dp/grad_reduce.hpp): every rank gets the whole sum;
//   sharded   train.optimizer_sharding = "dp" (parallel/dp/zero.hpp): the
//             sums reduce-scattered to the ranks that own them, and after
//             the update the new values all-gathered back;
//   bucketed  train.grad_bucket_mb > 0 (parallel/dp/grad_buckets.hpp): the
//             same reductions as either of the above, posted bucket by
//             bucket during the backward; reduce() then waits for them.
//
// All three give each element the same bits on the MPI backend (every sum
// bracketed in group-rank order), so the trainer picks by speed and memory
// alone.
#pragma once
#include <array>
#include <memory>

#include "trident/parallel/dp/grad_buckets.hpp"
#include "trident/parallel/dp/zero.hpp"

namespace trident::dp {

class GradSync {
 public:
  // The padding multiples the store must be built with (sharding pads each
  // kind's range to its group's size).
  static std::array<int64_t, 3> store_multiples(bool sharded, Communicator* dpcp,
                                                Communicator* expert_replica);

  GradSync(const ParamStore& store, bool sharded, Communicator* dpcp, Communicator* expert_replica);
  // Posts reductions bucket by bucket during the backward (bucket_mb > 0);
  // no buckets are kept when the store has nothing to reduce.
  void use_buckets(double bucket_mb, int microbatches, GradBuckets::BeforeReduce before);

  bool sharded() const { return sharded_; }
  const Sharding& sharding() const { return sharding_; }
  GradBuckets* buckets() const { return buckets_.get(); }  // null: none

  // The step's sums, where the optimizer reads them: the wait for the
  // buckets (bucketed: their reductions were posted during the backward),
  // otherwise the reduce-scatter (sharded) or the all-reduce.
  void reduce(bool bucketed, const kernels::Ctx& ctx);
  // The global gradient norm's square, the same bits whichever way.
  double sumsq(Communicator* world, const kernels::Ctx& ctx) const;
  // After the optimizer's update: sharded, each rank's updated shard goes
  // to every replica; otherwise nothing.
  void after_update(const kernels::Ctx& ctx);

 private:
  const ParamStore& store_;
  bool sharded_;
  Communicator* dpcp_;
  Communicator* expert_replica_;
  Sharding sharding_;
  std::unique_ptr<GradBuckets> buckets_;
};

}  // namespace trident::dp
