// runtime.backend -> the device of this rank, and the DeviceContext that owns
// the resources of a Ctx on it.
#include "trident/kernels/backend.hpp"

#include <string>

#include "trident/core/error.hpp"
#include "trident/kernels/backends.hpp"

namespace trident::kernels {

bool built_with_cuda() {
#ifdef TRIDENT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

int visible_cuda_devices() {
#ifdef TRIDENT_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace

Device select_device(Backend backend, int local_rank) {
  if (backend == Backend::cpu) return Device::cpu();
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

DeviceContext::DeviceContext(Device device) {
  ctx_.device = device;
  alloc_ = &cpu_allocator();
#ifdef TRIDENT_HAVE_CUDA
  if (device.is_cuda()) {
    const cuda::DeviceResources r = cuda::device_resources(device.index);
    ctx_.stream = r.stream;
    ctx_.blas = r.blas;
    alloc_ = r.allocator;
  }
#else
  if (device.is_cuda())
    throw Error("DeviceContext: " + device.str() + " asked for in a build without CUDA");
#endif
  workspace_ = std::make_unique<Workspace>(*alloc_);
  ctx_.workspace = workspace_.get();
}

DeviceContext::~DeviceContext() = default;

}  // namespace trident::kernels
