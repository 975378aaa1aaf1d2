// Data-parallel gradient reduction: every parameter's gradient is summed over
// the ranks that hold a copy of it, as its Param::reduce says.
//
//   GradReduce::dense   over dp x cp (the dpcp communicator of the stage)
//   GradReduce::expert  over the (dp*cp)/ep replicas of that expert
//   GradReduce::none    not reduced
//
// The gradients of one kind lie in one contiguous range of the stage's
// ParamStore (core/param_store.hpp), in parameter order; each range is reduced
// in place by one allreduce. Every reduction of gradients here, in
// parallel/dp/zero.hpp and in parallel/dp/grad_buckets.hpp sums in group-rank
// order (SumOrder::rank), so an element's sum has the same bits whether it is
// all-reduced, reduce-scattered or reduced in a bucket: the sharded optimizer
// and buckets equal the plain all-reduce bit for bit on the MPI backend, and
// a resumed run reduces exactly as the original did.
#pragma once
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/param.hpp"
#include "trident/core/param_store.hpp"
#include "trident/kernels/context.hpp"

namespace trident::dp {

// Either communicator may be null (or of size 1): nothing to reduce there.
// The buffers are the communicators' to read and write (on their device).
void reduce_gradients(const ParamStore& store, Communicator* dpcp, Communicator* expert_replica);

// Sum of squared reduced gradient entries of the whole model, with the same
// bits whether the optimizer is sharded (parallel/dp/zero.hpp) or not, and
// whether the gradients were bucketed: each kind's elements are cut into
// its group's parts as the optimizer's shards are (ceil(n / p) each; the
// padding of a sharded store is left out), rank r of the group sums the
// squares of part r in double, and the parts' sums, one per (rank, kind),
// are gathered over
// `world` and added in a fixed order (dense, then expert, each in world-rank
// order). Every part is summed by exactly one rank: the dense parts of a
// stage by the ranks of its dpcp group, an expert range's by its replicas.
// Call after the reduction (sharded: the owned parts suffice).
double grad_sumsq(const ParamStore& store, Communicator* dpcp, Communicator* expert_replica,
                  Communicator* world, const kernels::Ctx& ctx = {});

// Sum of squared gradient entries of the whole model, each distinct parameter
// counted once although several ranks hold it (dense: on dpcp rank 0 of each
// stage; expert: on replica rank 0), summed over `world` (null: this rank
// only). Call after reduce_gradients.
double global_grad_sumsq(const std::vector<Param*>& params, Communicator* dpcp,
                         Communicator* expert_replica, Communicator* world,
                         const kernels::Ctx& ctx = {});

}  // namespace trident::dp
