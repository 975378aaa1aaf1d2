// The two implementations of the op interface, as the routing in
// kernels/api sees them: trident::kernels::cpu (kernels/cpu, always built)
// and trident::kernels::cuda (kernels/cuda, built under TRIDENT_HAVE_CUDA).
// Both declare exactly the list in backend_ops.inc. Model and parallel code
// call the public ops in trident::kernels, never these.
#pragma once
#include <cstdint>

#include "trident/kernels/attention.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"

namespace trident::kernels::cpu {
#include "trident/kernels/backend_ops.inc"
}  // namespace trident::kernels::cpu

namespace trident::kernels::cuda {
#include "trident/kernels/backend_ops.inc"

// Besides the ops, what the CUDA backend provides to backend selection
// (kernels/backend.hpp): the number of visible devices (0 when there is no
// driver or no device), and the per-process stream, cuBLAS handle and
// allocator of device `index` that a Ctx on it runs with.
int device_count();
struct DeviceResources {
  void* stream = nullptr;
  void* blas = nullptr;
  Allocator* allocator = nullptr;
};
DeviceResources device_resources(int index);
}  // namespace trident::kernels::cuda
