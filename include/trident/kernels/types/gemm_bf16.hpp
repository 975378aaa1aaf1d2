// The host-side sizes of the CPU's native bf16 GEMM (kernels/cpu/gemm_bf16.cpp,
// share/trident/cpu-kernels.md#native-bf16): what it keeps per thread, for
// the planner's memory model. Plain host arithmetic, no kernel.
#pragma once
#include <cstddef>
#include <cstdint>

namespace trident::kernels {

// Bytes the native bf16 GEMM keeps per thread (host vectors, outside the
// training allocator; they grow to the largest call and stay) after calls
// whose op(B) has at most max_n columns and whose bf16 results past one K
// block (gemm_bf16_out with K > 512) have at most max_wide elements: op(B)'s
// packed K block, op(A)'s packed row block and that f32 result.
size_t gemm_bf16_buffer_bytes(int64_t max_n, int64_t max_wide);

}  // namespace trident::kernels
