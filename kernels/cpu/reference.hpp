// The plain CPU references of the tuned CPU kernels (llm.c's CPU reference
// beside each kernel): the definition written as loops, one (query, head)
// row at a time, accumulated in fp64, with no tiling, blocking or vector
// code. The tuned kernels (attention.cpp) are tested against them with
// random inputs and an asserted relative tolerance
// (tests/unit/kernels/test_attention.cpp), and the dev harness
// (tests/dev/attention_variants.cpp) validates every variant against them
// before timing it. Host memory only; slow (O(Tq * Tk * D) per head, with
// whole score rows), so for tests and the harness, never for training.
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
