// PinnedPool: host buffers for copies between the host and a GPU, made once
// and handed out again. A copy to or from page-locked ("pinned") memory is
// a DMA transfer that the GPU runs in its stream's order while the host goes
// on; from pageable memory the driver copies through a buffer of its own
// and the call blocks. Pinning is slow (the pages are mapped and locked), so
// the pool keeps every buffer it made: it grows to what the copies in
// flight at one time need, and no further.
//
// A buffer given back (its Buffer destroyed) gets a fence, a marker
// recorded on the copy stream at that moment; it is handed out again only
// once its fence is complete, so an asynchronous copy that still reads or
// writes it cannot meet a new owner. A Buffer released without being given
// back (the MPI staging does so when an operation is abandoned while MPI may
// still use its memory) leaves the pool for good. The pool lives as long as
// any of its buffers is out.
//
// Plain C++: pinning, freeing and fences are hooks (cudaHostAlloc,
// cudaFreeHost and events in kernels/api/staging.cpp), so the logic is
// unit-tested on the CPU with fakes (tests/unit/kernels/test_pinned_pool.cpp).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace trident::kernels::cuda {

class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  struct Hooks {
    std::function<void*(size_t)> pin;              // bytes of pinned memory; throws on failure
    std::function<void(void*)> unpin;              // frees what pin returned
    std::function<std::function<bool()>()> fence;  // recorded now; true once complete
  };
  // A buffer of at least the asked bytes; destroying it gives it back.
  using Buffer = std::unique_ptr<char, std::function<void(char*)>>;

  // Buffers are made in powers of two from kMinBytes, so that a few sizes
  // serve every message.
  static constexpr size_t kMinBytes = size_t(64) << 10;

  static std::shared_ptr<PinnedPool> make(Hooks hooks) {
    return std::shared_ptr<PinnedPool>(new PinnedPool(std::move(hooks)));
  }
  ~PinnedPool() {
    for (Block& b : free_) hooks_.unpin(b.p);
  }
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // The smallest free buffer that holds `bytes` and whose fence is complete,
  // else a new one.
  Buffer get(size_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const Block& b = free_[i];
      if (b.bytes < bytes || (best < free_.size() && free_[best].bytes <= b.bytes)) continue;
      if (b.done && !b.done()) continue;
      best = i;
    }
    Block b;
    if (best < free_.size()) {
      b = std::move(free_[best]);
      free_.erase(free_.begin() + std::ptrdiff_t(best));
    } else {
      b.bytes = kMinBytes;
      while (b.bytes < bytes) b.bytes *= 2;
      b.p = static_cast<char*>(hooks_.pin(b.bytes));
      made_bytes_ += b.bytes;
      ++made_;
    }
    const size_t size = b.bytes;
    return Buffer(b.p, [pool = shared_from_this(), size](char* p) { pool->put(p, size); });
  }

  // Buffers made so far and their bytes (what the pool holds, given out or not).
  size_t made() const { return made_; }
  size_t made_bytes() const { return made_bytes_; }

 private:
  struct Block {
    char* p = nullptr;
    size_t bytes = 0;
    std::function<bool()> done;  // the fence of its last use (empty: never used)
  };

  explicit PinnedPool(Hooks hooks) : hooks_(std::move(hooks)) {}

  void put(char* p, size_t bytes) {
    std::function<bool()> done = hooks_.fence();
    std::lock_guard<std::mutex> lock(m_);
    free_.push_back(Block{p, bytes, std::move(done)});
  }

  Hooks hooks_;
  std::mutex m_;
  std::vector<Block> free_;
  size_t made_ = 0, made_bytes_ = 0;
};

}  // namespace trident::kernels::cuda
