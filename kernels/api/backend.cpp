// runtime.backend -> the device of this rank, and the DeviceContext that owns
// the resources of a Ctx on it.
#include "trident/kernels/backend.hpp"

#include <string>

#include "trident/core/emulated.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/backends.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/runtime.hpp"
#endif

namespace trident::kernels {

bool built_with_cuda() {
#ifdef TRIDENT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int visible_cuda_devices() {
#ifdef TRIDENT_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

Device select_device(Backend backend, int local_rank) {
  if (backend == Backend::cpu) return Device::cpu();
  if (backend == Backend::emulated) return Device::emulated();
  if (!built_with_cuda()) {
    if (backend == Backend::automatic) return Device::cpu();
    throw InputError(
        "runtime.backend: 'cuda' asked for, but this trident was built without the CUDA backend "
        "(rebuild where nvcc is found, or set runtime.backend = \"cpu\" or \"auto\")");
  }
  const int n = visible_cuda_devices();
  if (n > 0) return Device::cuda(local_rank % n);
  if (backend == Backend::automatic) return Device::cpu();
  throw InputError("runtime.backend: 'cuda' asked for, but this rank (local rank " +
                   std::to_string(local_rank) +
                   ") sees no CUDA device (check CUDA_VISIBLE_DEVICES and the driver)");
}

// The CUDA backend's own context owns the stream, cuBLAS handle, allocator
// and workspace of a device; the host and the emulated device need only an
// allocator (the host's, or the emulated arena) and a workspace.
struct DeviceContext::Backend {
#ifdef TRIDENT_HAVE_CUDA
  std::unique_ptr<cuda::StreamContext> cuda;
#endif
  std::unique_ptr<Workspace> workspace;
};

DeviceContext::DeviceContext(Device device) : backend_(std::make_unique<Backend>()) {
  if (device.is_cpu() || device.is_emulated()) {
    alloc_ = device.is_cpu() ? &cpu_allocator() : &emulated::allocator();
    backend_->workspace = std::make_unique<Workspace>(*alloc_);
    ctx_ = Ctx{device, nullptr, nullptr, backend_->workspace.get(), alloc_};
    return;
  }
#ifdef TRIDENT_HAVE_CUDA
  backend_->cuda = std::make_unique<cuda::StreamContext>(device.index);
  alloc_ = &backend_->cuda->allocator();
  ctx_ = backend_->cuda->ctx();
#else
  throw Error("DeviceContext: " + device.str() + " asked for in a build without CUDA");
#endif
}

DeviceContext::~DeviceContext() = default;

}  // namespace trident::kernels
