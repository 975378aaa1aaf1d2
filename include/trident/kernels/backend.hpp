// Backend selection: runtime.backend decides, once per rank, the device its
// kernels run on; a DeviceContext then owns what a Ctx on that device points
// to (allocator, workspace, stream and BLAS handle) and hands the same Ctx to
// every layer.
//
//   "cpu"   the host kernels (kernels/cpu)
//   "cuda"  CUDA device local_rank % (visible devices); an input error when
//           the build has no CUDA backend or this rank sees no device
//   "auto"  CUDA when the build has it and a device is visible, else the host
#pragma once
#include <memory>

#include "trident/core/allocator.hpp"
#include "trident/core/config.hpp"
#include "trident/core/device.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels {

// True when this binary was built with the CUDA backend.
bool built_with_cuda();

// CUDA devices this process sees through the CUDA runtime: 0 in a build
// without the CUDA backend, without a driver, or with none visible. (The
// topology's count, topo/devices.hpp, loads the runtime itself so that a
// CPU build still reports a node's GPUs.)
int visible_cuda_devices();

// The device runtime.backend asks for on the rank with this node-local rank.
// Throws InputError ("runtime.backend: ...", one line) when it cannot be met.
Device select_device(Backend backend, int local_rank);

class DeviceContext {
 public:
  explicit DeviceContext(Device device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  const Ctx& ctx() const { return ctx_; }
  Device device() const { return ctx_.device; }
  Allocator& allocator() const { return *alloc_; }

 private:
  struct Backend;
  std::unique_ptr<Backend> backend_;
  Allocator* alloc_ = nullptr;
  Ctx ctx_;
};

}  // namespace trident::kernels
