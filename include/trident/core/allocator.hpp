// Allocator: where buffers of one device come from.
//
// Tensor storage and kernel workspaces allocate through an Allocator, so that
// the CUDA backend supplies device memory (cudaMallocAsync on its stream, or a
// caching pool) behind the same calls the CPU uses. Every allocator counts its
// bytes in use and its peak, which the run file and the planner read as the
// measured memory of a rank.
#pragma once
#include <cstddef>

#include "trident/core/device.hpp"

namespace trident {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least 64 bytes (256 on CUDA); bytes may be 0
  // (a non-null unique pointer is not promised then). Throws trident::Error
  // with the size and the device when the memory is not there.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual Device device() const = 0;

  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = in_use_; }

 protected:
  void count_alloc(size_t b) {
    in_use_ += b;
    if (in_use_ > peak_) peak_ = in_use_;
  }
  void count_free(size_t b) { in_use_ -= b; }

 private:
  size_t in_use_ = 0, peak_ = 0;
};

// The host allocator (64-byte aligned). One per process.
Allocator& cpu_allocator();

}  // namespace trident
