// Ctx: what every kernel call runs with. The first argument of every op in
// include/trident/kernels/*.hpp.
//
//   device     where the op runs; every pointer passed with this Ctx lives there
//   stream     cudaStream_t on CUDA (kernels are enqueued, not waited for);
//              unused on the CPU, where an op has finished when it returns
//   blas       cublasHandle_t on CUDA, bound to `stream`; unused on the CPU
//   workspace  scratch memory that an op may use for the duration of the call
//              (grown on demand, never shrunk); null: the op allocates its own
//   alloc      where tensors made for this Ctx come from (kernels/tensor_ops.hpp:
//              activations, caches, ring buffers); null: the host allocator,
//              which only a host Ctx may use
//   tf32       CUDA: fp32 GEMMs may run on the tensor cores in TF32
//              (train.tf32); false: pedantic fp32. Unused elsewhere
//
// The handles are void* so that this header, and the layers above kernels,
// compile without the CUDA headers. A Ctx is owned by whoever runs a stage
// (one per device and stream); it is not thread-safe.
#pragma once
#include <cstddef>

#include "trident/core/allocator.hpp"
#include "trident/core/device.hpp"

namespace trident::kernels {

// Scratch memory of one device: get(n) returns at least n bytes, valid until
// the next get() on the same Workspace. Grows to the largest request.
class Workspace {
 public:
  explicit Workspace(Allocator& alloc) : alloc_(&alloc) {}
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* get(size_t bytes);
  size_t capacity() const { return bytes_; }
  Device device() const { return alloc_->device(); }

 private:
  Allocator* alloc_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct Ctx {
  Device device = Device::cpu();
  void* stream = nullptr;
  void* blas = nullptr;
  Workspace* workspace = nullptr;
  Allocator* alloc = nullptr;
  bool tf32 = false;
};

// The allocator of ctx (ctx.alloc, or the host's for a host Ctx without one).
Allocator& allocator_of(const Ctx& ctx);

}  // namespace trident::kernels
