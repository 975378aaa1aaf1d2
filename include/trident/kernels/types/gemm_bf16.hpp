// The host-side sizes of the CPU's native bf16 GEMM (kernels/cpu/gemm_bf16.cpp,
// share/trident/cpu-kernels.md#native-bf16): what it keeps per thread, for
// the planner's memory model (plain host arithmetic), and the packed form of
// a GEMM weight that the native rows read.
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

// Bytes of a GEMM weight [out, in] packed both ways for the native GEMM
// (PackedBf16Weight; 0 where there is no native bf16 GEMM): about 4 per
// element, its columns padded to the register tile's 32.
size_t gemm_bf16_packed_weight_bytes(int64_t out, int64_t in);

// Whether a CPU run in this process packs its bf16 GEMM weights
// (PackedBf16Weight has forms): the native bf16 path is on (TRIDENT_CPU_BF16,
// kernels::set_cpu_bf16_path and the CPU). model::GemmPrecision then keeps no
// bf16 copy of them, and the planner counts the packed forms instead.
bool cpu_bf16_packs_weights();

// The packed forms of a GEMM weight w [out, in] (f32, rounded to bf16 as it
// is packed, or bf16) that the CPU's native bf16 rows read instead of
// packing the weight in every call (cpu-kernels.md#native-bf16): host
// vectors outside the allocator, made when the native path is on for a CPU
// tensor (else none: has_forms() is false), repacked by refresh() after
// every write of w. The linear and SwiGLU ops take it as an optional
// operand beside w (functional.hpp), which it must be the packed form of
// (source(): the tensor last packed); the same words as per-call packing:
// the same sums.
class PackedBf16Weight {
 public:
  PackedBf16Weight(const Ctx& ctx, const Tensor& w);
  PackedBf16Weight(const PackedBf16Weight&) = delete;
  PackedBf16Weight& operator=(const PackedBf16Weight&) = delete;
  // Packs source() again, or w (of the same shape and dtype, which becomes
  // source(): a weight whose tensor was replaced, as the parameter store
  // rebinds the masters into its buffer).
  void refresh();
  void refresh(const Tensor& w);
  size_t bytes() const { return 4 * (nt_.size() + nn_.size()); }
  bool has_forms() const { return !nt_.empty(); }
  // The weight it packs (its shape, dtype and buffer), borrowed: the
  // packing does not keep the weight's memory alive (a parameter store that
  // rebinds it frees the old tensor; refresh(w) then names the new one).
  const Tensor& source() const { return w_; }
  // Wᵀ packed as op(B) of y = x Wᵀ and W as op(B) of dx = dy W (the words
  // pack_bf16_b writes); null without forms.
  const uint32_t* nt() const { return nt_.empty() ? nullptr : nt_.data(); }
  const uint32_t* nn() const { return nn_.empty() ? nullptr : nn_.data(); }

 private:
  Tensor w_;
  std::vector<uint32_t> nt_, nn_;
};

// The packed forms of a SwiGLU's three weights (null: that weight is packed
// in each call).
struct SwigluPacked {
  const PackedBf16Weight *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
};

}  // namespace trident::kernels
