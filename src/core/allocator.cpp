// The host allocator, and the names of Device and DType.
#include "trident/core/allocator.hpp"

#include <cstdlib>
#include <string>

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

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
      throw Error("cpu allocator: out of host memory allocating " + std::to_string(bytes) +
                  " bytes");
    count_alloc(bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    if (!p) return;
    std::free(p);
    count_free(bytes);
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

}  // namespace trident
