// DeviceStaging for a Ctx's device: the emulated arena's copies (host copies
// with its guard lifted) and a CUDA device's (on the Ctx's stream).
#include "trident/kernels/staging.hpp"

#include <cstring>

#include "trident/core/emulated.hpp"
#include "trident/core/error.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include <cuda_runtime.h>

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
class CudaStaging final : public DeviceStaging {
 public:
  explicit CudaStaging(const Ctx& ctx) : ctx_(ctx) {}  // a copy: the handles, not the Ctx object
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
    cuda::copy_to_host(ctx_, host, dev, bytes);
  }
  void to_device(void* dev, const void* host, size_t bytes) override {
    cuda::copy_to_device(ctx_, dev, host, bytes);
    // the host buffer is freed when the operation is: the copy must be done
    cuda::synchronize(ctx_, 300.0, "staging copy to the device");
  }

 private:
  Ctx ctx_;
};
#endif

}  // namespace

std::shared_ptr<DeviceStaging> device_staging(const Ctx& ctx) {
  switch (ctx.device.type) {
    case DeviceType::cpu:
      return nullptr;
    case DeviceType::emulated:
      return std::make_shared<EmulatedStaging>();
    case DeviceType::cuda:
#ifdef TRIDENT_HAVE_CUDA
      return std::make_shared<CudaStaging>(ctx);
#else
      break;
#endif
  }
  throw Error("kernels::device_staging: " + ctx.device.str() + " in a build without its backend");
}

}  // namespace trident::kernels
