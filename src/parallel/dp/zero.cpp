// Sharded optimizer state over the ParamStore (see parallel/dp/zero.hpp).
#include "trident/parallel/dp/zero.hpp"

#include <string>

#include "trident/core/allocator.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::dp {
namespace {

constexpr std::array<GradReduce, 3> kKinds = {GradReduce::dense, GradReduce::expert,
                                              GradReduce::none};

bool splits(const Communicator* g) { return g && g->size() > 1; }

}  // namespace

std::array<int64_t, 3> shard_multiples(Communicator* dpcp, Communicator* expert_replica) {
  return {dpcp ? dpcp->size() : 1, expert_replica ? expert_replica->size() : 1, 1};
}

Sharding make_sharding(const ParamStore& store, bool sharded, Communicator* dpcp,
                       Communicator* expert_replica) {
  Sharding s;
  int64_t base = 0;
  for (GradReduce kind : kKinds) {
    const size_t k = size_t(kind);
    const ParamStore::Range full = store.range(kind);
    Communicator* g = !sharded                     ? nullptr
                      : kind == GradReduce::dense  ? dpcp
                      : kind == GradReduce::expert ? expert_replica
                                                   : nullptr;
    if (splits(g)) {
      TRIDENT_CHECK(full.size() % g->size() == 0,
                    "dp::make_sharding: a range of " + std::to_string(full.size()) +
                        " elements does not split over " + std::to_string(g->size()) +
                        " ranks (the store was not padded for this group)");
      const int64_t n = full.size() / g->size();
      s.group[k] = g;
      s.owned[k] = {full.begin + g->rank() * n, full.begin + (g->rank() + 1) * n};
    } else {
      s.owned[k] = full;
    }
    s.base[k] = base;
    base += s.owned[k].size();
    Communicator* parts = kind == GradReduce::dense    ? dpcp
                          : kind == GradReduce::expert ? expert_replica
                                                       : nullptr;
    if (splits(parts)) {
      int64_t numel = 0;
      for (const ParamStore::Entry& e : store.entries())
        if (e.param->reduce == kind) numel += e.numel;
      s.part[k] = (numel + parts->size() - 1) / parts->size();
    }
  }
  s.owned_numel = base;
  return s;
}

void reduce_scatter_gradients(const ParamStore& store, const Sharding& s, const kernels::Ctx& ctx) {
  Tensor grads = store.grads();
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    const size_t k = size_t(kind);
    const ParamStore::Range full = store.range(kind), own = s.owned[k];
    if (!splits(s.group[k]) || full.size() == 0) continue;
    // MPI and NCCL take distinct send and receive buffers: the sum lands in
    // scratch and is copied into this rank's part of the range.
    MemKindScope scratch(MemKind::communication);
    Tensor sum = kernels::empty(ctx, {own.size()});
    s.group[k]->reduce_scatter_sum(grads.ptr() + full.begin, sum.ptr(), size_t(own.size()),
                                   SumOrder::rank);
    Tensor dst = grads.view(own.begin, {own.size()});
    kernels::copy(ctx, dst, sum);
  }
}

void allgather_values(const ParamStore& store, const Sharding& s, const kernels::Ctx& ctx) {
  Tensor values = store.values();
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    const size_t k = size_t(kind);
    const ParamStore::Range full = store.range(kind), own = s.owned[k];
    if (!splits(s.group[k]) || full.size() == 0) continue;
    MemKindScope scratch(MemKind::communication);
    const Tensor mine = kernels::clone(ctx, values.view(own.begin, {own.size()}));
    s.group[k]->allgather(mine.ptr(), values.ptr() + full.begin,
                          size_t(own.size()) * sizeof(float));
  }
}

void gather_owned(const ParamStore& store, const Sharding& s, const Tensor& owned, Tensor& full,
                  const kernels::Ctx& ctx) {
  TRIDENT_CHECK(owned.numel() == s.owned_numel && full.numel() == store.numel(),
                "dp::gather_owned: buffers of " + std::to_string(owned.numel()) + " and " +
                    std::to_string(full.numel()) + " elements");
  for (GradReduce kind : kKinds) {
    const size_t k = size_t(kind);
    const ParamStore::Range own = s.owned[k];
    if (own.size() == 0) continue;
    const Tensor src = owned.view(s.base[k], {own.size()});
    if (splits(s.group[k])) {
      s.group[k]->allgather(src.ptr(), full.ptr() + store.range(kind).begin,
                            size_t(own.size()) * sizeof(float));
    } else {
      Tensor dst = full.view(own.begin, {own.size()});
      kernels::copy(ctx, dst, src);
    }
  }
}

void scatter_owned(const Sharding& s, const Tensor& full, Tensor& owned, const kernels::Ctx& ctx) {
  for (size_t k = 0; k < kKinds.size(); ++k) {
    const ParamStore::Range own = s.owned[k];
    if (own.size() == 0) continue;
    Tensor dst = owned.view(s.base[k], {own.size()});
    kernels::copy(ctx, dst, full.view(own.begin, {own.size()}));
  }
}

}  // namespace trident::dp
