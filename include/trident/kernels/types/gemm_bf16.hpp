// The host-side sizes of the CPU's native bf16 GEMM (kernels/cpu/gemm_bf16.cpp,
// share/trident/cpu-kernels.md#native-bf16): what it keeps per thread, for
// the planner's memory model (plain host arithmetic), and the packed form of
// a bf16 weight that the native rows read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels {

// Bytes the native bf16 GEMM keeps per thread (host vectors, outside the
// training allocator; they grow to the largest call and stay) after calls
// whose op(B) has at most max_n columns and whose bf16 results past one K
// block (gemm_bf16_out with K > 512) have at most max_wide elements: op(B)'s
// packed K block, op(A)'s packed row block and that f32 result.
size_t gemm_bf16_buffer_bytes(int64_t max_n, int64_t max_wide);

// Bytes of a bf16 weight [out, in] packed both ways for the native GEMM
// (PackedBf16Weight; 0 where there is no native bf16 GEMM): about 4 per
// element, its columns padded to the register tile's 32.
size_t gemm_bf16_packed_weight_bytes(int64_t out, int64_t in);

// The packed forms of a bf16 weight copy w16 [out, in] that the CPU's
// native bf16 rows read instead of packing the weight in every call
// (cpu-kernels.md#native-bf16): host vectors outside the allocator, made
// when the native path is on for a CPU tensor (else nothing), repacked by
// refresh() after every write of w16, and found by w16's data pointer while
// this object lives. The same words as per-call packing: the same sums.
class PackedBf16Weight {
 public:
  PackedBf16Weight(const Ctx& ctx, const Tensor& w16);
  ~PackedBf16Weight();
  PackedBf16Weight(const PackedBf16Weight&) = delete;
  PackedBf16Weight& operator=(const PackedBf16Weight&) = delete;
  void refresh();
  size_t bytes() const { return 4 * (nt_.size() + nn_.size()); }

 private:
  Tensor w_;
  std::vector<uint32_t> nt_, nn_;
};

}  // namespace trident::kernels
