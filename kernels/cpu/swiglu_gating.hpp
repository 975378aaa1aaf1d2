// SwiGLU's element-wise gating passes (swiglu.cpp), shared by the f32 kernel
// and the native bf16 one (swiglu_bf16.cpp).
#pragma once
#include <cstddef>

namespace trident::kernels::cpu {

// h = silu(a) * u over n elements.
void gated(const float* __restrict a, const float* __restrict u, float* __restrict h, size_t n);
// From g = dL/dh: d(gate) into dgate, d(up) over g.
void gated_backward(const float* __restrict a, const float* __restrict u, float* __restrict g,
                    float* __restrict dgate, size_t n);

}  // namespace trident::kernels::cpu
