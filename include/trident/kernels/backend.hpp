// Backend selection: runtime.backend decides, once per rank, the device its
// kernels run on; a DeviceContext then owns what a Ctx on that device points
// to (allocator, workspace, stream and BLAS handle) and hands the same Ctx to
// every layer.
//
//   "cpu"   the host kernels (kernels/cpu)
//   "cuda"  the CUDA device the topology chose for this rank (TRIDENT_DEVICE,
//           else local rank % visible devices); an input error when the
//           build has no CUDA backend or this rank sees no device
//   "auto"  CUDA when the build has it and a device is visible, else the host
//
// The rank's device is chosen once, from the topology, and made current
// (make_current) before any communicator or allocation exists
// (build_communicators, topo/topology.hpp): NCCL makes its communicators on
// the current device, and the trainer computes on it (current_device_index).
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

// The CUDA runtime calls that choose a rank's device, as a table so that a
// test can stand in for a node's GPUs on a machine without any
// (tests/mpi/topo/test_device_binding.cpp). The real one: cudaGetDeviceCount
// (0 without a driver or a device), cudaSetDevice, cudaGetDevice; in a build
// without CUDA, no devices.
struct DeviceRuntime {
  int (*count)();
  void (*set_current)(int device);
  int (*current)();
};
const DeviceRuntime& device_runtime();
// Tests: replaces the table (null: the real one again).
void set_device_runtime_for_testing(const DeviceRuntime* fake);
bool device_runtime_is_fake();

// The device runtime.backend asks for on a rank whose topology chose CUDA
// device `device_index` (any index wraps around the visible devices).
// Throws InputError ("runtime.backend: ...", one line) when it cannot be met.
Device select_device(Backend backend, int device_index);

// Makes `device` this thread's current device (a CUDA device: set_current;
// the host and the emulated device: nothing).
void make_current(Device device);
// This thread's current CUDA device (0 when none was made current or there
// is none).
int current_device_index();

class DeviceContext {
 public:
  // tf32: the Ctx's fp32 GEMMs may use TF32 (train.tf32; CUDA only).
  explicit DeviceContext(Device device, bool tf32 = false);
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
