// Sharded optimizer state (ZeRO-1, train.optimizer_sharding = "dp") over a
// stage's ParamStore.
//
// Each reduction kind's range of the store is cut into equal shards over the
// ranks that hold a replica of those parameters: dense over dp x cp (the
// dpcp communicator), expert over the expert's replicas (expert_replica).
// Rank r of a group owns shard r: it receives the summed gradient of that
// shard (reduce-scatter), keeps AdamW's moments for it alone and updates it;
// the updated shards are then all-gathered so that every replica holds the
// whole parameters again for the next forward. The store pads each kind's
// range to a multiple of its group's size (ParamStore's range_multiple), so
// the shards are equal; padding holds zeros and belongs to no parameter.
//
// Bit for bit: every gradient sum is bracketed in group-rank order
// (SumOrder::rank), so a reduce-scatter leaves each element with the bits
// that the unsharded optimizer's all-reduce gives it, the gradient norm sums
// the same parts either way (parallel/dp/grad_reduce.hpp: grad_sumsq), and
// the AdamW update is elementwise: sharded and unsharded runs give the same losses, norms,
// parameters and moments on the MPI backend (share/trident/memory.md).
//
// With sharding off (or a group of one rank) a rank owns whole ranges, and
// the functions below reduce to local copies.
#pragma once
#include <array>

#include "trident/comm/comm.hpp"
#include "trident/core/param_store.hpp"
#include "trident/kernels/context.hpp"

namespace trident::dp {

struct Sharding {
  // Per GradReduce kind: the group the kind's range is sharded over (null:
  // not sharded) and the part of the store this rank owns.
  std::array<Communicator*, 3> group{};
  std::array<ParamStore::Range, 3> owned{};
  // The element offset of each kind's owned part in a buffer that holds the
  // owned parts one after another (AdamW's moments).
  std::array<int64_t, 3> base{};
  int64_t owned_numel = 0;
  // Per kind: the elements of one shard, ceil(parameter elements / group
  // size), with sharding on or off (0: the kind has no group of 2+ ranks).
  // The optimizer ends its kernel calls at multiples of it either way, so
  // that each element is updated by a call of the same extent, and so by
  // the same code path of a vectorised kernel (a loop's body and its tail
  // may round differently), sharded or not.
  std::array<int64_t, 3> part{};
};

// The padding multiples a store needs for sharding over these groups.
std::array<int64_t, 3> shard_multiples(Communicator* dpcp, Communicator* expert_replica);
// sharded: dense over dpcp, expert over expert_replica, none kept whole;
// otherwise every range whole (no group).
Sharding make_sharding(const ParamStore& store, bool sharded, Communicator* dpcp,
                       Communicator* expert_replica);

// Sums each sharded kind's gradients over its group; afterwards this rank's
// owned part of grads() holds the sum (the rest of its range is left as it
// was: this rank's own unreduced gradients).
void reduce_scatter_gradients(const ParamStore& store, const Sharding& s, const kernels::Ctx& ctx);
// Sends this rank's owned part of values() to every rank of its group, so
// that each holds the whole range.
void allgather_values(const ParamStore& store, const Sharding& s, const kernels::Ctx& ctx);
// A buffer of owned parts (Sharding::base layout) gathered into `full`, a
// buffer in the store's layout [store.numel()], on every rank of the groups.
void gather_owned(const ParamStore& store, const Sharding& s, const Tensor& owned, Tensor& full,
                  const kernels::Ctx& ctx);
// The reverse, without communication: this rank's owned parts of `full`.
void scatter_owned(const Sharding& s, const Tensor& full, Tensor& owned, const kernels::Ctx& ctx);

}  // namespace trident::dp
