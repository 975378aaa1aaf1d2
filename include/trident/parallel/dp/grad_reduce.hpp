// Data-parallel gradient reduction: every parameter's gradient is summed over
// the ranks that hold a copy of it, as its Param::reduce says.
//
//   GradReduce::dense   over dp x cp (the dpcp communicator of the stage)
//   GradReduce::expert  over the (dp*cp)/ep replicas of that expert
//   GradReduce::none    not reduced
//
// The gradients of one kind lie in one contiguous range of the stage's
// ParamStore (core/param_store.hpp), in parameter order; each range is reduced
// in place by one allreduce, so the order of additions (and so the result) is
// the same in every step: a resumed run reduces exactly as the original did.
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

// Sum of squared gradient entries of the whole model, each distinct parameter
// counted once although several ranks hold it (dense: on dpcp rank 0 of each
// stage; expert: on replica rank 0), summed over `world` (null: this rank
// only). Call after reduce_gradients.
double global_grad_sumsq(const std::vector<Param*>& params, Communicator* dpcp,
                         Communicator* expert_replica, Communicator* world,
                         const kernels::Ctx& ctx = {});

}  // namespace trident::dp
