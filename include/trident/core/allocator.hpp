// Allocator: where buffers of one device come from.
//
// Tensor storage and kernel workspaces allocate through an Allocator, so that
// the CUDA backend supplies device memory (cudaMallocAsync on its stream, or a
// caching pool) behind the same calls the CPU uses. Every allocator counts its
// bytes in use and its peak, which the run file and the planner read as the
// measured memory of a rank.
//
// Memory accounting: each allocation is counted under the kind of what it
// holds, the calling thread's current MemKind (set by a MemKindScope where
// the training code allocates parameters, gradients, optimizer state,
// activations or communication buffers; workspace otherwise), and the bytes
// in use of each kind are kept at the moment of the peak, so the peak splits
// by kind (the run file's /ranks/summary).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "trident/core/device.hpp"

namespace trident {

enum class MemKind : uint8_t {
  parameters,
  gradients,
  optimizer,      // optimizer state (AdamW's moments)
  activations,    // allocated by the pipeline's F, B and W actions
  communication,  // pipeline boundary buffers, reduction scratch
  workspace,      // everything else: kernel scratch, inputs, captures
};
constexpr int kNumMemKinds = 6;
const char* mem_kind_name(MemKind k);  // "parameters", ..., "workspace"

// The kind this thread's allocations are counted as now (workspace unless a
// MemKindScope says otherwise).
MemKind current_mem_kind();
// Sets the current kind for its lifetime (scopes nest).
class MemKindScope {
 public:
  explicit MemKindScope(MemKind k);
  ~MemKindScope();
  MemKindScope(const MemKindScope&) = delete;
  MemKindScope& operator=(const MemKindScope&) = delete;

 private:
  MemKind prev_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least 64 bytes (256 on CUDA); bytes may be 0
  // (a non-null unique pointer is not promised then). Throws trident::Error
  // with the size and the device when the memory is not there.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual Device device() const = 0;

  // Memory an allocator keeps for reuse after its owner freed it (the host
  // allocator's free lists): not in use, so not in bytes_in_use() or any
  // kind's figure. release_cached() gives it back to the system and returns
  // how many bytes that was.
  virtual size_t bytes_cached() const { return 0; }
  virtual size_t release_cached() { return 0; }

  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes() const { return peak_; }
  // Bytes in use of each kind (MemKind order) now, and when the peak was
  // reached (they sum to peak_bytes()).
  const std::array<size_t, kNumMemKinds>& bytes_in_use_by_kind() const { return live_; }
  const std::array<size_t, kNumMemKinds>& peak_bytes_by_kind() const { return peak_live_; }
  void reset_peak() {
    peak_ = in_use_;
    peak_live_ = live_;
  }

 protected:
  // p: the allocation, so that its free is counted under the same kind.
  void count_alloc(const void* p, size_t b);
  void count_free(const void* p, size_t b);
  // Without the pointer: counted as workspace.
  void count_alloc(size_t b) { add(MemKind::workspace, b); }
  void count_free(size_t b) { live_[size_t(MemKind::workspace)] -= b, in_use_ -= b; }

 private:
  void add(MemKind k, size_t b) {
    in_use_ += b;
    live_[size_t(k)] += b;
    if (in_use_ > peak_) {
      peak_ = in_use_;
      peak_live_ = live_;
    }
  }

  size_t in_use_ = 0, peak_ = 0;
  std::array<size_t, kNumMemKinds> live_{}, peak_live_{};
  std::mutex kinds_mu_;  // kind_of_ (a helper thread may allocate)
  std::unordered_map<const void*, MemKind> kind_of_;
};

// The host allocator (64-byte aligned). One per process.
//
// It keeps freed blocks of 64 KiB and more on free lists by size class
// (eight classes per power of two, so a block is at most 1/8 larger than
// asked) and hands them out again: a training step frees and allocates the
// same shapes every step, and fresh memory from the system costs a page
// fault and a page clearing per 4 KiB. The cache holds at most as many bytes
// as the peak of the blocks in use (a freed block that would take it over
// goes back to the system at once), so the process holds at most twice its
// peak; release_cached() empties it.
// Smaller blocks go to malloc, which keeps them in its own heap.
Allocator& cpu_allocator();

}  // namespace trident
