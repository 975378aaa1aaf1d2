// runtime.backend -> the device of this rank, and the DeviceContext that owns
// the resources of a Ctx on it.
#include "trident/kernels/backend.hpp"

#include <algorithm>
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

namespace {

#ifdef TRIDENT_HAVE_CUDA
const DeviceRuntime kRuntime{cuda::device_count, cuda::set_current_device, cuda::current_device};
#else
const DeviceRuntime kRuntime{
    [] { return 0; },
    [](int device) {
      throw Error("cuda:" + std::to_string(device) + " made current in a build without CUDA");
    },
    [] { return 0; }};
#endif
const DeviceRuntime* fake_runtime = nullptr;  // set by tests only

}  // namespace

const DeviceRuntime& device_runtime() { return fake_runtime ? *fake_runtime : kRuntime; }

void set_device_runtime_for_testing(const DeviceRuntime* fake) { fake_runtime = fake; }

bool device_runtime_is_fake() { return fake_runtime != nullptr; }

int visible_cuda_devices() { return device_runtime().count(); }

void make_current(Device device) {
  if (device.is_cuda()) device_runtime().set_current(device.index);
}

int current_device_index() { return visible_cuda_devices() > 0 ? device_runtime().current() : 0; }

Device select_device(Backend backend, int device_index) {
  if (backend == Backend::cpu) return Device::cpu();
  if (backend == Backend::emulated) return Device::emulated();
  if (!built_with_cuda()) {
    if (backend == Backend::automatic) return Device::cpu();
    throw InputError(
        "runtime.backend: 'cuda' asked for, but this trident was built without the CUDA backend "
        "(rebuild where nvcc is found, or set runtime.backend = \"cpu\" or \"auto\")");
  }
  const int n = visible_cuda_devices();
  if (n > 0) return Device::cuda(std::max(0, device_index) % n);
  if (backend == Backend::automatic) return Device::cpu();
  throw InputError(
      "runtime.backend: 'cuda' asked for, but this rank sees no CUDA device (check "
      "CUDA_VISIBLE_DEVICES and the driver)");
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

DeviceContext::DeviceContext(Device device, bool tf32) : backend_(std::make_unique<Backend>()) {
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
  ctx_.tf32 = tf32;
#else
  (void)tf32;
  throw Error("DeviceContext: " + device.str() + " asked for in a build without CUDA");
#endif
}

DeviceContext::~DeviceContext() = default;

}  // namespace trident::kernels
