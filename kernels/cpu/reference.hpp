// The plain CPU references of the tuned CPU kernels (llm.c's CPU reference
// beside each kernel): the definition written as loops, one row at a time,
// accumulated in fp64, with no tiling, blocking or vector code. The tuned
// kernels are tested against them with random inputs and an asserted
// relative tolerance (attention: ctest test_attention_kernels; the small ops:
// test_reference, the SwiGLU backward, RoPE and AdamW: test_step_reference), and the dev harness
// (tests/unit/kernels/attention_variants.cpp) validates every attention
// variant against them before timing it. Host memory only; slow (attention:
// O(Tq * Tk * D) per head, with whole score rows), so for tests and the
// harness, never for training.
#pragma once
#include <cstdint>

#include "trident/kernels/attention.hpp"

namespace trident::kernels::cpu::reference {

// attention_forward of attention.hpp: out [Tq, H, D], lse [Tq, H]
// (overwritten; a row without a visible key: out 0, lse -inf).
void attention_forward(const AttnShape& s, const float* q, const float* k, const float* v,
                       float* out, float* lse);

// attention_backward of attention.hpp: dq, dk, dv ACCUMULATED. The softmax
// is recomputed from q and k (out and lse are the kernel's interface, not
// read here), so the reference does not trust the forward it checks.
void attention_backward(const AttnShape& s, const float* q, const float* k, const float* v,
                        const float* dout, float* dq, float* dk, float* dv);

}  // namespace trident::kernels::cpu::reference

namespace trident::kernels::cpu::reference {

// rmsnorm_forward / rmsnorm_backward of ops.hpp (dx overwritten, dw
// accumulated when not null), row statistics in fp64 in index order.
void rmsnorm_forward(const float* x, const float* w, int64_t T, int64_t d, float eps, float* y,
                     float* rstd);
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t T,
                      int64_t d, float* dx, float* dw);

// cross_entropy of ops.hpp: the summed loss of the target rows, dlogits =
// scale * (softmax - onehot) on them and 0 elsewhere; softmax in fp64.
double cross_entropy(const float* logits, const int32_t* targets, int64_t T, int64_t V, float scale,
                     float* dlogits);

// swiglu_forward of swiglu.hpp: gate = x W_gateᵀ, up = x W_upᵀ, y = (silu(gate)
// * up) W_downᵀ, each dot product in fp64.
void swiglu_forward(const float* x, int64_t T, int64_t d, int64_t f, const float* w_gate,
                    const float* w_up, const float* w_down, float* y, float* gate, float* up);

}  // namespace trident::kernels::cpu::reference
