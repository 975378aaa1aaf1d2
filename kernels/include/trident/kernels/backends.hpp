// The two implementations of the op interface, as the routing in
// kernels/api sees them: trident::kernels::cpu (kernels/cpu, always built)
// and trident::kernels::cuda (kernels/cuda, built under TRIDENT_HAVE_CUDA).
// Both declare exactly the list in backend_ops.inc (the CUDA backend's own
// header, kernels/cuda/ops.hpp, adds its bf16 variants and MoE ops). Model
// and parallel code call the public ops in trident::kernels, never these.
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
}  // namespace trident::kernels::cuda
