// The pinned host buffers of a GPU's staging (kernels/cuda/pinned_pool.hpp),
// checked on the CPU with fake pinning and fences: buffers are made once and
// reused, never handed out while their fence is pending, grown only when no
// free buffer fits, freed with the pool (not those released for good).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <set>
#include <vector>

#include "trident/kernels/cuda/pinned_pool.hpp"

using trident::kernels::cuda::PinnedPool;

namespace {

// Fake pinning (malloc) that counts, and fences that complete when the test
// says so: fences[i] is the i-th fence recorded.
struct Fakes {
  std::set<void*> pinned;
  size_t pins = 0, unpins = 0;
  std::vector<std::shared_ptr<bool>> fences;

  PinnedPool::Hooks hooks() {
    PinnedPool::Hooks h;
    h.pin = [this](size_t bytes) {
      void* p = std::malloc(bytes);
      pinned.insert(p);
      ++pins;
      return p;
    };
    h.unpin = [this](void* p) {
      REQUIRE(pinned.erase(p) == 1);
      std::free(p);
      ++unpins;
    };
    h.fence = [this] {
      auto done = std::make_shared<bool>(false);
      fences.push_back(done);
      return std::function<bool()>([done] { return *done; });
    };
    return h;
  }
};

}  // namespace

TEST_CASE("pinned pool: a given-back buffer is reused once its fence completes") {
  Fakes f;
  auto pool = PinnedPool::make(f.hooks());
  char* first = nullptr;
  {
    auto a = pool->get(1000);
    first = a.get();
    a.get()[999] = 1;  // the whole asked size is usable
  }
  REQUIRE(f.fences.size() == 1);
  {
    auto b = pool->get(1000);  // fence pending: a new buffer
    CHECK(b.get() != first);
    CHECK(pool->made() == 2);
  }
  *f.fences[0] = true;
  auto c = pool->get(500);
  CHECK(c.get() == first);  // complete: the first one again
  CHECK(pool->made() == 2);
  CHECK(f.pins == 2);
}

TEST_CASE("pinned pool: sizes are powers of two, the smallest fitting free buffer is taken") {
  Fakes f;
  auto pool = PinnedPool::make(f.hooks());
  {
    auto small = pool->get(1);
    auto mid = pool->get(PinnedPool::kMinBytes + 1);
    auto big = pool->get(5 * PinnedPool::kMinBytes);
    CHECK(pool->made_bytes() == PinnedPool::kMinBytes * (1 + 2 + 8));
  }
  for (auto& d : f.fences) *d = true;
  auto x = pool->get(3 * PinnedPool::kMinBytes / 2);  // fits mid (2x) and big (8x): mid
  auto y = pool->get(3 * PinnedPool::kMinBytes);      // only big fits
  auto z = pool->get(PinnedPool::kMinBytes);          // small
  CHECK(pool->made() == 3);
  auto w = pool->get(100);  // all three out: a fourth
  CHECK(pool->made() == 4);
  CHECK(pool->made_bytes() == PinnedPool::kMinBytes * (1 + 2 + 8 + 1));
}

TEST_CASE("pinned pool: freed with the pool, not the buffers released for good") {
  Fakes f;
  void* kept = nullptr;
  {
    auto pool = PinnedPool::make(f.hooks());
    auto a = pool->get(10);
    auto b = pool->get(10);
    kept = b.release();  // abandoned while a transfer may still use it
    (void)a;
  }  // a given back, then the pool freed
  CHECK(f.pins == 2);
  CHECK(f.unpins == 1);
  REQUIRE(f.pinned.count(kept) == 1);
  f.pinned.erase(kept);
  std::free(kept);
}

TEST_CASE("pinned pool: the pool outlives a buffer that is still out") {
  Fakes f;
  PinnedPool::Buffer out;
  {
    auto pool = PinnedPool::make(f.hooks());
    out = pool->get(64);
  }
  CHECK(f.unpins == 0);        // the buffer holds the pool
  out = PinnedPool::Buffer();  // given back, its deleter (the last owner) gone: all freed
  CHECK(f.unpins == 1);
  CHECK(f.pinned.empty());
}
