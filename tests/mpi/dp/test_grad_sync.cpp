// dp::GradSync: each of the three paths leaves the gradient sums a serial
// sum in rank order gives (relative 1e-6), and the three give one another's
// bits (every sum is bracketed in group-rank order); the sharded path's
// all-gather gives every rank each owner's values; the norm is the same
// whichever path reduced. Random gradients, different on every rank.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>

#include "../../support/kernel_ctx.hpp"
#include "../../support/mpi_test_util.hpp"
#include "trident/core/rng.hpp"
#include "trident/parallel/dp/grad_sync.hpp"

using namespace trident;

namespace {

void host_copy(Tensor& dst, const Tensor& src) {
  std::memcpy(dst.data_ptr(), src.data_ptr(), src.bytes());
}
void host_fill(Tensor& dst, float v) { dst.fill(v); }

// A stage's parameters (dense, expert, none, interleaved as a stage lists
// them), with this rank's own random gradients.
struct Stage {
  std::deque<Param> params;
  std::unique_ptr<ParamStore> store;

  Stage(int rank, bool sharded, Communicator& world) {
    const std::pair<const char*, GradReduce> spec[] = {
        {"attn.wq", GradReduce::dense},    {"moe.w1", GradReduce::expert},
        {"norm.frozen", GradReduce::none}, {"attn.wo", GradReduce::dense},
        {"moe.w2", GradReduce::expert},    {"head", GradReduce::dense}};
    int64_t n = 37;
    std::vector<Param*> list;
    for (auto [name, kind] : spec) {
      Param& p = params.emplace_back(name, std::vector<int64_t>{n}, kind);
      p.init_normal(0.5f);
      rng::fill_normal(p.grad.ptr(), n, rng::hash_name(name) + 1000u * uint64_t(rank + 1), 0, 1.0f);
      list.push_back(&p);
      n += 29;
    }
    store = std::make_unique<ParamStore>(list, cpu_allocator(), host_copy, host_fill,
                                         dp::GradSync::store_multiples(sharded, &world, &world));
    for (Param& p : params)  // the store starts with zero gradients: this rank's own again
      rng::fill_normal(p.grad.ptr(), p.grad.numel(),
                       rng::hash_name(p.name) + 1000u * uint64_t(rank + 1), 0, 1.0f);
  }
};

// Every rank's gradients of p summed serially, rank 0 first.
std::vector<float> serial_sum(Communicator& world, const Param& p) {
  const int64_t n = p.grad.numel();
  std::vector<float> all(size_t(n * world.size()));
  world.allgather(p.grad.ptr(), all.data(), size_t(n) * sizeof(float));
  std::vector<float> sum(all.begin(), all.begin() + n);
  for (int r = 1; r < world.size(); ++r)
    for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += all[size_t(r * n + i)];
  return sum;
}

std::vector<float> grads_of(const Param& p) {
  return std::vector<float>(p.grad.values().begin(), p.grad.values().end());
}

}  // namespace

TEST_CASE("GradSync: plain, sharded and bucketed give the serial sum, bit for bit alike") {
  Communicator& world = testing::world_comm();
  const int rank = world.rank();
  const kernels::Ctx& ctx = test::kernel_ctx();

  Stage plain(rank, false, world), sharded(rank, true, world), bucketed(rank, false, world);
  std::vector<std::vector<float>> want;
  for (const Param& p : plain.params) {
    want.push_back(p.reduce == GradReduce::none ? grads_of(p) : serial_sum(world, p));
  }

  dp::GradSync a(*plain.store, false, &world, &world);
  a.reduce(false, ctx);
  dp::GradSync b(*sharded.store, true, &world, &world);
  b.reduce(false, ctx);
  dp::GradSync c(*bucketed.store, false, &world, &world);
  c.use_buckets(1e-4, 2, {});                                // ~100-byte buckets, two micro-batches
  REQUIRE((world.size() == 1) == (c.buckets() == nullptr));  // one rank: nothing to reduce
  if (c.buckets()) {
    c.buckets()->begin_step();
    std::vector<Param*> backward;
    for (auto it = bucketed.params.rbegin(); it != bucketed.params.rend(); ++it)
      backward.push_back(&*it);
    c.buckets()->ready(backward);
    c.buckets()->ready(backward);
  }
  c.reduce(c.buckets() != nullptr, ctx);

  for (size_t i = 0; i < plain.params.size(); ++i) {
    const Param& p = plain.params[i];
    INFO(p.name);
    const std::vector<float> got = grads_of(p);
    for (size_t j = 0; j < got.size(); ++j)
      REQUIRE(std::fabs(got[j] - want[i][j]) <= 1e-6f * (std::fabs(want[i][j]) + 1e-3f));
    REQUIRE(std::memcmp(got.data(), grads_of(bucketed.params[i]).data(), got.size() * 4) == 0);
  }
  // The sharded path: this rank's owned part holds the sums, the same bits.
  const Tensor& full = plain.store->grads();
  const Tensor& part = sharded.store->grads();
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    const ParamStore::Range owned = b.sharding().owned[size_t(kind)];
    const ParamStore::Range whole = sharded.store->range(kind);
    const ParamStore::Range plain_whole = plain.store->range(kind);
    for (int64_t e = owned.begin; e < owned.end; ++e) {
      const int64_t at = plain_whole.begin + (e - whole.begin);
      if (at >= plain_whole.end) break;  // the shard's padding
      REQUIRE(part.ptr()[e] == full.ptr()[at]);
    }
  }
  const double norm_a = a.sumsq(&world, ctx), norm_b = b.sumsq(&world, ctx);
  REQUIRE(norm_a == norm_b);
  REQUIRE(norm_a > 0);
}

TEST_CASE("GradSync: after a sharded update, every rank holds each owner's values") {
  Communicator& world = testing::world_comm();
  const int rank = world.rank();
  const kernels::Ctx& ctx = test::kernel_ctx();
  Stage s(rank, true, world);
  dp::GradSync sync(*s.store, true, &world, &world);
  // Each rank "updates" its owned part to values only it knows: rank + element/1000.
  float* v = const_cast<float*>(s.store->values().ptr());  // the buffer the optimizer updates
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    const ParamStore::Range owned = sync.sharding().owned[size_t(kind)];
    for (int64_t e = owned.begin; e < owned.end; ++e) v[e] = float(rank) + float(e) * 1e-3f;
  }
  sync.after_update(ctx);
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    const ParamStore::Range whole = s.store->range(kind);
    const int64_t shard = (whole.size() + world.size() - 1) / world.size();
    for (int64_t e = whole.begin; e < whole.end; ++e) {
      const int owner = int((e - whole.begin) / shard);
      REQUIRE(v[e] == float(owner) + float(e) * 1e-3f);
    }
  }
}
