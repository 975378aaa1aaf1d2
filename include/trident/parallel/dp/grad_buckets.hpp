// Bucketed gradient reduction overlapped with the backward
// (train.grad_bucket_mb > 0).
//
// Each reduction kind's range of a stage's ParamStore (dense over dp x cp,
// expert over the expert's replicas) is cut into buckets of whole
// parameters, about grad_bucket_mb MiB each, walking the range from its end:
// the store holds a stage's parameters in model order, and the backward
// finishes them in reverse, so the last bucket of the store is the first one
// complete. The model reports, per micro-batch, the parameters whose
// gradient it has finished (ready()); once every parameter of a bucket has
// been reported for every micro-batch of the step (the last micro-batch's
// B on this stage, or its W in a schedule that splits the backward), the
// bucket's reduction is posted without blocking and runs while the rest of
// the backward and the pipeline's cool-down compute. finish() waits for all
// of them, each wait with the communicator's deadline.
//
// What is posted per bucket:
//   not sharded: an all-reduce of the bucket (every rank gets the sum);
//   sharded (parallel/dp/zero.hpp): the bucket's elements that rank r owns
//     reduced to rank r, one reduce per owner the bucket overlaps, so each
//     rank ends up with the sum of exactly its shard, as the reduce-scatter
//     of the unbucketed path leaves it.
// Every rank of a group reports the same parameters in the same order (they
// hold the same stage and run the same schedule), so the collectives of
// each communicator are posted in the same order everywhere. The reduction
// is progressed by polling whenever the model reports (MPI moves
// non-blocking collectives only inside its calls).
//
// Results: each element is summed over the same ranks as without buckets,
// in the same order: every reduction here is bracketed in group-rank order
// (SumOrder::rank), whatever the bucket's size and position, so buckets give
// the unbucketed reduction's bits on the MPI backend, sharded or not
// (tests/mpi/train/grad_bucket_test.py). NCCL orders its sums itself.
#pragma once
#include <functional>
#include <map>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/param_store.hpp"
#include "trident/parallel/dp/zero.hpp"

namespace trident::dp {

class GradBuckets {
 public:
  struct Bucket {
    GradReduce kind = GradReduce::dense;
    ParamStore::Range range;     // elements of the store
    std::vector<Param*> params;  // whole parameters inside range
    int64_t pending = 0;         // reports still missing this step
    bool posted = false;
    std::vector<Request> requests;
  };
  // Called with a bucket's parameters just before its reduction is posted,
  // while they hold this rank's own gradients (the step guard looks for a
  // non-finite value there).
  using BeforeReduce = std::function<void(const std::vector<Param*>&)>;

  // bucket_mb > 0. microbatches: how often each parameter is reported per
  // step. s: the sharding of the store (make_sharding; unsharded: whole
  // ranges). Groups of one rank (or null) reduce nothing.
  GradBuckets(const ParamStore& store, const Sharding& s, Communicator* dpcp,
              Communicator* expert_replica, double bucket_mb, int microbatches,
              BeforeReduce before_reduce = {});

  // Every bucket waits for all its reports again.
  void begin_step();
  // One micro-batch's gradient of each of ps is final on this rank.
  void ready(const std::vector<Param*>& ps);
  // Posts what is not posted yet (in bucket order), then waits for every
  // reduction (deadline: the communicator's). After it the gradients are
  // reduced as reduce_gradients / reduce_scatter_gradients leave them.
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Whether p's gradient is reduced by a bucket (not: kind none, or a group
  // of one rank).
  bool holds(const Param* p) const { return bucket_of_.count(p) != 0; }

 private:
  void post(Bucket& b);
  void progress();

  const ParamStore& store_;
  Sharding sharding_;
  std::array<Communicator*, 3> group_{};
  int microbatches_;
  BeforeReduce before_reduce_;
  std::vector<Bucket> buckets_;
  std::map<const Param*, size_t> bucket_of_;
};

}  // namespace trident::dp
