// SwiGLU's element-wise gating passes: gated and gated_backward (swiglu.cpp,
// libmvec's expf) of the f32 kernel and the staged bf16 row, and their
// forms on exp2_fast (exp2_fast.hpp) of the native bf16 one (swiglu_bf16.cpp;
// AVX-512 F and DQ, which every CPU it runs on has; elsewhere the f32 ones).
#pragma once
#include <cstddef>

namespace trident::kernels::cpu {

// h = silu(a) * u over n elements.
void gated(const float* __restrict a, const float* __restrict u, float* __restrict h, size_t n);
// From g = dL/dh: d(gate) into dgate, d(up) over g.
void gated_backward(const float* __restrict a, const float* __restrict u, float* __restrict g,
                    float* __restrict dgate, size_t n);
// The same on the inlined exp2_fast (sigmoid within about 3e-6 relative of
// the f32 passes', far below the bf16 rounding of what they feed).
void gated_fast(const float* __restrict a, const float* __restrict u, float* __restrict h,
                size_t n);
void gated_backward_fast(const float* __restrict a, const float* __restrict u, float* __restrict g,
                         float* __restrict dgate, size_t n);

}  // namespace trident::kernels::cpu
