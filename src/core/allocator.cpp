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

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
      throw Error("cpu allocator: out of host memory allocating " + std::to_string(bytes) +
                  " bytes");
    count_alloc(p, bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    if (!p) return;
    count_free(p, bytes);  // before the address can be handed out again
    std::free(p);
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

}  // namespace trident
