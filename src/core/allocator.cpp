// The host allocator, and the names of Device and DType.
#include "trident/core/allocator.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "trident/core/error.hpp"

namespace trident {

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::cuda:
      return "cuda:" + std::to_string(index);
    case DeviceType::emulated:
      return "emulated:" + std::to_string(index);
  }
  return "?";
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::f64:
      return "f64";
  }
  return "?";
}

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::parameters:
      return "parameters";
    case MemKind::gradients:
      return "gradients";
    case MemKind::optimizer:
      return "optimizer";
    case MemKind::activations:
      return "activations";
    case MemKind::communication:
      return "communication";
    case MemKind::workspace:
      return "workspace";
  }
  return "?";
}

namespace {
thread_local MemKind t_mem_kind = MemKind::workspace;
}  // namespace

MemKind current_mem_kind() { return t_mem_kind; }

MemKindScope::MemKindScope(MemKind k) : prev_(t_mem_kind) { t_mem_kind = k; }
MemKindScope::~MemKindScope() { t_mem_kind = prev_; }

void Allocator::count_alloc(const void* p, size_t b) {
  const MemKind k = t_mem_kind;
  std::lock_guard<std::mutex> lock(kinds_mu_);
  if (p) kind_of_[p] = k;
  add(k, b);
}

void Allocator::count_free(const void* p, size_t b) {
  std::lock_guard<std::mutex> lock(kinds_mu_);
  MemKind k = MemKind::workspace;
  if (const auto it = kind_of_.find(p); it != kind_of_.end()) {
    k = it->second;
    kind_of_.erase(it);
  }
  live_[size_t(k)] -= b;
  in_use_ -= b;
}

namespace {

// Bytes of a block of `bytes`: blocks below kCachedMin are rounded to 64 bytes
// and not cached; from kCachedMin up to the next size class, eight per power
// of two (1/8 steps of the power of two below).
constexpr size_t kCachedMin = size_t(64) << 10;

size_t block_bytes(size_t bytes) {
  if (bytes < kCachedMin) return (bytes + 63) / 64 * 64;
  const size_t step = std::bit_floor(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override { release_cached(); }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t block = block_bytes(bytes);
    void* p = take_cached(block);
    if (!p) p = std::aligned_alloc(64, block);
    if (!p)
      throw Error("cpu allocator: out of host memory allocating " + std::to_string(bytes) +
                  " bytes");
    count_alloc(p, bytes);
    return p;
  }

  void deallocate(void* p, size_t bytes) noexcept override {
    if (!p) return;
    count_free(p, bytes);  // before the address can be handed out again
    if (!keep(p, block_bytes(bytes))) std::free(p);
  }

  Device device() const override { return Device::cpu(); }

  size_t bytes_cached() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

  size_t release_cached() override {
    std::vector<void*> blocks;
    size_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [size, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
      free_.clear();
      released = cached_;
      cached_ = 0;
    }
    for (void* p : blocks) std::free(p);
    return released;
  }

 private:
  // A cached block of this size, or nullptr; counts the block as in use.
  void* take_cached(size_t block) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_in_use_ += block;
    peak_blocks_ = std::max(peak_blocks_, blocks_in_use_);
    if (block < kCachedMin) return nullptr;
    const auto it = free_.find(block);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= block;
    return p;
  }

  // Puts a freed block on its free list unless the cache would hold more than
  // the peak of blocks in use.
  bool keep(void* p, size_t block) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_in_use_ -= block;
    if (block < kCachedMin || cached_ + block > peak_blocks_) return false;
    free_[block].push_back(p);
    cached_ += block;
    return true;
  }

  mutable std::mutex mu_;  // the members below (a helper thread may allocate)
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  // Bytes of the blocks handed out (requests rounded up to their class), now
  // and at most: what bounds the cache.
  size_t blocks_in_use_ = 0, peak_blocks_ = 0;
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

}  // namespace trident
