// The tensor-core forward of bf16 flash attention (attention_tc.cu), used by
// attention.cu for the head dims it supports.
#pragma once
#include <cuda_bf16.h>

#include "trident/kernels/attention.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels::cuda {

// Runs the forward (resume: continue the given out/lse) on tensor cores and
// returns true, or returns false without doing anything when the shape is
// not one it handles (plan::attn_tc_supported).
bool attention_forward_tc(const Ctx& c, const AttnShape& s, const __nv_bfloat16* q,
                          const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                          float* lse, bool resume);

}  // namespace trident::kernels::cuda
