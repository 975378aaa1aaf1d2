// Tensor: storage sharing and lifetime, views, dtype checks, and the
// allocator accounting that the run file and the planner read.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "counting_allocator.hpp"
#include "random.hpp"
#include "trident/core/error.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace trident;
using trident::testing::CountingAllocator;
using trident::testing::random_tensor;

TEST_CASE("copies share storage; the last handle frees it into its allocator") {
  CountingAllocator a;
  {
    Tensor t = Tensor::empty({4, 8}, a);
    CHECK(a.bytes_in_use() == 4 * 8 * sizeof(float));
    Tensor u = t;
    CHECK(u.shares_storage_with(t));
    CHECK(u.ptr() == t.ptr());
    CHECK(a.bytes_in_use() == 4 * 8 * sizeof(float));  // no second allocation
    t = Tensor();
    CHECK(a.bytes_in_use() == 4 * 8 * sizeof(float));  // u still holds it
    Tensor w = Tensor::empty({3}, a);
    CHECK(a.peak_bytes() == (32 + 3) * sizeof(float));
  }
  CHECK(a.bytes_in_use() == 0);
  CHECK(a.peak_bytes() == (32 + 3) * sizeof(float));
}

TEST_CASE("a borrowed tensor views its caller's memory and never frees it") {
  std::vector<float> owned(12, 0.0f);
  const size_t in_use = cpu_allocator().bytes_in_use();
  {
    Tensor t = Tensor::borrow(owned.data(), {3, 4}, Device::emulated());
    CHECK(cpu_allocator().bytes_in_use() == in_use);  // nothing allocated
    CHECK(t.numel() == 12);
    CHECK(t.device().is_emulated());
    CHECK(t.data<float>() == owned.data());
    const Tensor row = Tensor::borrow(owned.data(), {3, 4}, Device::cpu()).rows(1, 2);
    row.values()[3] = 5.0f;  // a view of it writes the caller's elements
    CHECK(owned[7] == 5.0f);
    CHECK_THROWS_WITH(Tensor::borrow(nullptr, {2}, Device::cpu()),
                      Catch::Contains("Tensor::borrow: null data"));
    CHECK(Tensor::borrow(nullptr, {0}, Device::cpu()).empty());
  }
  CHECK(cpu_allocator().bytes_in_use() == in_use);
  CHECK(owned[7] == 5.0f);  // the last handle left the memory alone
}

TEST_CASE("clone copies the elements into new storage") {
  Tensor t = random_tensor({5, 7}, "clone");
  Tensor c = t.clone();
  CHECK_FALSE(c.shares_storage_with(t));
  CHECK(c.shape() == t.shape());
  CHECK(std::memcmp(c.ptr(), t.ptr(), t.bytes()) == 0);
  const float before = t[3];
  c[3] = before + 1.0f;
  CHECK(t[3] == before);
}

TEST_CASE("views and rows address part of the storage without copying") {
  Tensor t = random_tensor({6, 4}, "views");
  Tensor r = t.rows(2, 5);
  CHECK(r.shape() == std::vector<int64_t>{3, 4});
  CHECK(r.shares_storage_with(t));
  CHECK(r.ptr() == t.ptr() + 2 * 4);
  r[0] = 42.0f;
  CHECK(t[2 * 4] == 42.0f);
  Tensor v = r.view(5, {2, 3});  // offsets add up through views
  CHECK(v.ptr() == t.ptr() + 2 * 4 + 5);
  Tensor flat = t.reshape({24});
  CHECK(flat.ptr() == t.ptr());
  CHECK(flat.numel() == 24);
  CHECK_THROWS_AS(t.rows(4, 7), Error);
  CHECK_THROWS_AS(r.view(10, {1, 3}), Error);
  CHECK_THROWS_AS(t.reshape({5, 5}), Error);
}

TEST_CASE("typed access checks the dtype") {
  Tensor ids = Tensor::empty({3}, cpu_allocator(), DType::i32);
  CHECK(ids.bytes() == 3 * sizeof(int32_t));
  ids.data<int32_t>()[2] = 7;
  CHECK(ids.data<int32_t>()[2] == 7);
  CHECK_THROWS_AS(ids.data<float>(), Error);
  CHECK_THROWS_AS(ids.ptr(), Error);
  Tensor half = Tensor::empty({4}, cpu_allocator(), DType::bf16);
  CHECK(half.bytes() == 8);
}

TEST_CASE("the host constructor fills; kernels::zeros and clone use the Ctx's allocator") {
  Tensor t({2, 3}, 1.5f);
  for (float x : t.values()) CHECK(x == 1.5f);
  CountingAllocator a;
  kernels::Ctx ctx;
  ctx.alloc = &a;
  Tensor z = kernels::zeros(ctx, {10});
  CHECK(a.bytes_in_use() == 10 * sizeof(float));
  for (float x : z.values()) CHECK(x == 0.0f);
  Tensor src = random_tensor({10}, "copy");
  Tensor c = kernels::clone(ctx, src);
  CHECK(a.bytes_in_use() == 20 * sizeof(float));
  CHECK(std::memcmp(c.ptr(), src.ptr(), src.bytes()) == 0);
  kernels::copy(ctx, z, src);
  CHECK(std::memcmp(z.ptr(), src.ptr(), src.bytes()) == 0);
  Tensor wrong({11});
  CHECK_THROWS_AS(kernels::copy(ctx, wrong, src), Error);
}

TEST_CASE("an empty tensor has no storage and no elements") {
  Tensor e;
  CHECK(e.empty());
  CHECK(e.numel() == 0);
  CHECK(e.data_ptr() == nullptr);
  CHECK(e.device().is_cpu());
  Tensor z = Tensor::empty({0, 5});
  CHECK(z.empty());
  CHECK(z.dim(1) == 5);
}

namespace {

// Counts by kind, as the host allocator does (the pointer names the kind).
class KindCountingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = bytes ? ::operator new(bytes) : nullptr;
    count_alloc(p, bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    count_free(p, bytes);
    if (p) ::operator delete(p);
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

TEST_CASE("the allocator's peak splits by the kind each allocation was made under") {
  KindCountingAllocator a;
  auto kind = [&](MemKind k) { return a.bytes_in_use_by_kind()[size_t(k)]; };
  auto at_peak = [&](MemKind k) { return a.peak_bytes_by_kind()[size_t(k)]; };
  Tensor params, grads;
  {
    MemKindScope s(MemKind::parameters);
    params = Tensor::empty({100}, a);
    MemKindScope inner(MemKind::gradients);  // scopes nest
    grads = Tensor::empty({100}, a);
  }
  CHECK(current_mem_kind() == MemKind::workspace);
  CHECK(kind(MemKind::parameters) == 400);
  CHECK(kind(MemKind::gradients) == 400);
  Tensor act;
  {
    MemKindScope s(MemKind::activations);
    act = Tensor::empty({300}, a);  // the peak: 400 + 400 + 1200
  }
  CHECK(a.peak_bytes() == 2000);
  CHECK(kind(MemKind::activations) == 1200);
  act = Tensor();  // freed outside its scope: still leaves its own kind
  CHECK(kind(MemKind::activations) == 0);
  CHECK(kind(MemKind::workspace) == 0);
  Tensor work = Tensor::empty({50}, a);  // no scope: workspace, below the peak
  CHECK(kind(MemKind::workspace) == 200);
  CHECK(at_peak(MemKind::parameters) == 400);
  CHECK(at_peak(MemKind::gradients) == 400);
  CHECK(at_peak(MemKind::activations) == 1200);
  CHECK(at_peak(MemKind::workspace) == 0);
  size_t sum = 0;
  for (size_t b : a.peak_bytes_by_kind()) sum += b;
  CHECK(sum == a.peak_bytes());
  CHECK(std::string(mem_kind_name(MemKind::communication)) == "communication");
}

TEST_CASE("the host allocator reuses freed blocks and counts them as cached, not in use") {
  Allocator& a = cpu_allocator();
  a.release_cached();
  CHECK(a.bytes_cached() == 0);
  const size_t base = a.bytes_in_use();
  const size_t bytes = size_t(300) << 10;  // in the size class of 320 KiB
  void* p = nullptr;
  {
    MemKindScope s(MemKind::activations);
    p = a.allocate(bytes);
  }
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  CHECK(a.bytes_in_use() == base + bytes);
  std::memset(p, 1, bytes);  // the whole request is usable
  const size_t activations = a.bytes_in_use_by_kind()[size_t(MemKind::activations)];
  a.deallocate(p, bytes);
  CHECK(a.bytes_in_use() == base);
  CHECK(a.bytes_in_use_by_kind()[size_t(MemKind::activations)] == activations - bytes);
  CHECK(a.bytes_cached() == size_t(320) << 10);
  // A request of the same class gets the block back, counted under the kind current now.
  void* q = a.allocate(bytes + 1000);
  CHECK(q == p);
  CHECK(a.bytes_cached() == 0);
  CHECK(a.bytes_in_use() == base + bytes + 1000);
  CHECK(a.bytes_in_use_by_kind()[size_t(MemKind::workspace)] >= bytes + 1000);
  a.deallocate(q, bytes + 1000);
  // A different class does not take it.
  void* r = a.allocate(size_t(200) << 10);
  CHECK(r != q);
  CHECK(a.bytes_cached() == size_t(320) << 10);
  a.deallocate(r, size_t(200) << 10);
  const size_t cached = a.bytes_cached();  // 320 KiB, and 208 KiB if under the peak of blocks
  CHECK((cached == size_t(320) << 10 || cached == size_t(320 + 208) << 10));
  CHECK(a.release_cached() == cached);
  CHECK(a.bytes_cached() == 0);
  CHECK(a.bytes_in_use() == base);
  // Small blocks are never cached.
  a.deallocate(a.allocate(1000), 1000);
  CHECK(a.bytes_cached() == 0);
}

TEST_CASE("the host allocator's cache holds no more than the peak of its blocks in use") {
  Allocator& a = cpu_allocator();
  a.release_cached();
  REQUIRE(a.bytes_in_use() < (size_t(4) << 20));  // the test's sizes dominate
  const size_t mib16 = size_t(16) << 20, mib24 = size_t(24) << 20;
  a.deallocate(a.allocate(mib16), mib16);
  CHECK(a.bytes_cached() == mib16);
  void* y = a.allocate(mib24);  // another class: the 16 MiB block stays cached
  CHECK(a.bytes_cached() == mib16);
  a.deallocate(y, mib24);  // 16 + 24 MiB would exceed the peak of blocks (about 24 MiB)
  CHECK(a.bytes_cached() == mib16);
  void* x = a.allocate(mib16);
  void* z = a.allocate(mib24);  // now 40 MiB in use: both fit when freed
  a.deallocate(x, mib16);
  a.deallocate(z, mib24);
  CHECK(a.bytes_cached() == mib16 + mib24);
  CHECK(a.release_cached() == mib16 + mib24);
}
