// SwiGLU MLP on a block of tokens: y = (silu(x·Wgᵀ) ⊙ (x·Wuᵀ)) · Wdᵀ.
//
// Shared by the MoE experts and the dense FFN. Row-major fp32; every weight
// is stored [out, in] like a linear layer's: w_gate and w_up [f, d], w_down
// [d, f]; x and y [T, d]. Forward keeps the two pre-activations
// (gate = x·Wgᵀ, up = x·Wuᵀ, [T, f] each) because backward
// needs them and recomputing them costs two of the three GEMMs.
#pragma once
#include <cstdint>

#include "trident/kernels/context.hpp"

namespace trident::kernels {

// y is overwritten; gate and up ([T, f] each) receive the pre-activations.
void swiglu_forward(const Ctx& ctx, const float* x, int64_t T, int64_t d, int64_t f,
                    const float* w_gate, const float* w_up, const float* w_down, float* y,
                    float* gate, float* up);

// Given dy [T, d]: dx [T, d] is overwritten (nullptr: not wanted) and the
// weight gradients are ACCUMULATED (+=), so one call per token block adds up.
void swiglu_backward(const Ctx& ctx, const float* x, const float* gate, const float* up,
                     const float* dy, int64_t T, int64_t d, int64_t f, const float* w_gate,
                     const float* w_up, const float* w_down, float* dx, float* dw_gate,
                     float* dw_up, float* dw_down);

}  // namespace trident::kernels
