// The plain references of the rest of the training step's tuned CPU kernels
// (reference.hpp has attention, RMSNorm, cross-entropy and the SwiGLU
// forward): the SwiGLU backward, RoPE forward and backward and the AdamW
// step, each the definition written as loops in index order, accumulated in
// fp64, with no GEMM, table or vector code. tests/unit/kernels/
// test_step_reference.cpp compares the tuned kernels with them on random
// inputs with asserted tolerances. Host memory only; for tests, never for
// training.
#pragma once
#include <cstdint>

#include "trident/kernels/ops.hpp"
#include "trident/kernels/types/rope.hpp"

namespace trident::kernels::cpu::reference {

// swiglu_backward of swiglu.hpp, from the forward's gate and up [T, f]:
// with h = silu(gate) * up, dh = dy W_down; d(gate) = dh * up * silu'(gate),
// d(up) = dh * silu(gate). dx [T, d] overwritten (nullptr: not wanted);
// dw_gate, dw_up [f, d] and dw_down [d, f] ACCUMULATED.
void swiglu_backward(const float* x, const float* gate, const float* up, const float* dy, int64_t T,
                     int64_t d, int64_t f, const float* w_gate, const float* w_up,
                     const float* w_down, float* dx, float* dw_gate, float* dw_up, float* dw_down);

// rope_forward / rope_backward of ops.hpp on x [T, H, D] in place: pair
// (i, i + D/2) of every head turned by pos[t] * rope_inv_freq(freqs, i, D)
// (the backward by minus that angle), angle, cos, sin and rotation in fp64.
void rope_forward(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  const RopeFreqs& freqs);
void rope_backward(float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   const RopeFreqs& freqs);

// adamw_step of ops.hpp, as the AdamW paper writes it (step counted from 1):
// g' = grad_scale g; m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2;
// p -= lr (wd p [when decay] + m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps)).
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h,
                int64_t step, float grad_scale, bool decay);

}  // namespace trident::kernels::cpu::reference
