// A host allocator that counts its bytes on its own (Allocator's
// bytes_in_use and peaks), so a test's figures are exact whatever else the
// process allocates. One place instead of a copy per test file.
#pragma once
#include <cstddef>
#include <new>

#include "trident/core/allocator.hpp"
#include "trident/core/device.hpp"

namespace trident::testing {

class CountingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    count_alloc(bytes);
    return bytes ? ::operator new(bytes) : nullptr;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    if (p) ::operator delete(p);
    count_free(bytes);
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace trident::testing
