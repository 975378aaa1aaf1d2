// The implementations of the MoE and router ops (moe_backend_ops.inc), as
// the public ops route to them: trident::kernels::cpu (kernels/cpu, always
// built) and trident::kernels::cuda (kernels/cuda, under TRIDENT_HAVE_CUDA).
// Model and parallel code call the public ops in trident::kernels, never
// these.
#pragma once
#include <cstdint>

#include "trident/kernels/context.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"

namespace trident::kernels::cpu {
#include "trident/kernels/moe_backend_ops.inc"
}  // namespace trident::kernels::cpu

// kernels/cuda (moe.cu, router.cu), built under TRIDENT_HAVE_CUDA.
namespace trident::kernels::cuda {
#include "trident/kernels/moe_backend_ops.inc"
}  // namespace trident::kernels::cuda
