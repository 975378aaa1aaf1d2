// DeviceStaging for a Ctx's device: the emulated arena's copies (host copies
// with its guard lifted, host buffers of plain memory) and a CUDA device's
// (on the Ctx's stream, through reused pinned host buffers).
#include "trident/kernels/staging.hpp"

#include <cstring>
#include <functional>
#include <string>

#include "trident/core/emulated.hpp"
#include "trident/core/error.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include <cuda_runtime.h>

#include "trident/kernels/cuda/check.hpp"
#include "trident/kernels/cuda/pinned_pool.hpp"
#include "trident/kernels/cuda/runtime.hpp"
#endif

namespace trident::kernels {
namespace {

class EmulatedStaging final : public DeviceStaging {
 public:
  Device device() const override { return Device::emulated(); }
  bool on_device(const void* p) const override { return emulated::contains(p); }
  void to_host(void* host, const void* dev, size_t bytes) override {
    const emulated::Guard lifted;
    std::memcpy(host, dev, bytes);
  }
  void to_device(void* dev, const void* host, size_t bytes) override {
    const emulated::Guard lifted;
    std::memcpy(dev, host, bytes);
  }
};

#ifdef TRIDENT_HAVE_CUDA
// Pinned host memory for the staging of ctx's device: page-locked buffers
// (portable: any device may copy from them), fences on ctx's stream.
std::shared_ptr<cuda::PinnedPool> pinned_pool(const Ctx& ctx) {
  cuda::PinnedPool::Hooks hooks;
  hooks.pin = [](size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return p;
  };
  hooks.unpin = [](void* p) { (void)cudaFreeHost(p); };
  hooks.fence = [stream = ctx.stream] {
    auto done = std::make_shared<cuda::Event>();
    done->record(stream);
    return std::function<bool()>([done] { return done->ready(); });
  };
  return cuda::PinnedPool::make(std::move(hooks));
}

// A GPU's staging: host buffers from a pool of pinned memory, copies queued
// on the Ctx's stream. A copy to the host waits (with the deadline) for the
// copy alone: into pinned memory it is asynchronous, so the work queued
// before it needs no wait of its own. A copy to the device does not wait:
// the stream runs it before any later op reads the data, and the pool keeps
// its host buffer until it has run.
class CudaStaging final : public DeviceStaging {
 public:
  CudaStaging(const Ctx& ctx, double timeout_s)  // a copy: the handles, not the Ctx object
      : ctx_(ctx), timeout_s_(timeout_s), pool_(pinned_pool(ctx)) {}
  HostBuffer host_buffer(size_t bytes) override { return pool_->get(bytes); }
  Device device() const override { return ctx_.device; }
  bool on_device(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // an unregistered host pointer: clear the error
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  }
  void to_host(void* host, const void* dev, size_t bytes) override {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost,
                               static_cast<cudaStream_t>(ctx_.stream)));
    cuda::synchronize(ctx_, timeout_s_,
                      "staging copy of " + std::to_string(bytes) + " bytes to the host");
  }
  void to_device(void* dev, const void* host, size_t bytes) override {
    cuda::copy_to_device(ctx_, dev, host, bytes);
  }

 private:
  Ctx ctx_;
  double timeout_s_;
  std::shared_ptr<cuda::PinnedPool> pool_;
};
#endif

}  // namespace

std::shared_ptr<DeviceStaging> device_staging(const Ctx& ctx, double timeout_s) {
  switch (ctx.device.type) {
    case DeviceType::cpu:
      return nullptr;
    case DeviceType::emulated:
      return std::make_shared<EmulatedStaging>();
    case DeviceType::cuda:
#ifdef TRIDENT_HAVE_CUDA
      return std::make_shared<CudaStaging>(ctx, timeout_s);
#else
      break;
#endif
  }
  throw Error("kernels::device_staging: " + ctx.device.str() + " in a build without its backend");
}

}  // namespace trident::kernels
