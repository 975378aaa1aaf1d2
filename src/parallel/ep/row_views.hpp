// Tensor views of the ep layer's row buffers: the callers' pointers (the
// layer's and the dispatcher's public calls take them), the transports'
// boxes and shared windows. The kernels' tensor ops run on these views;
// nothing is copied, and the memory stays the caller's.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "trident/core/emulated.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"

namespace trident::ep {

// The `shape` elements of `dtype` at p, on ctx's device; on the emulated
// device, memory outside its arena is labelled host memory, so that the op
// refuses it as it would refuse a host pointer on a GPU.
inline Tensor view_of(const kernels::Ctx& ctx, const void* p, std::vector<int64_t> shape,
                      DType dtype = DType::f32) {
  const Device where =
      ctx.device.is_emulated() && p && !emulated::contains(p) ? Device::cpu() : ctx.device;
  return Tensor::borrow(const_cast<void*>(p), std::move(shape), where, dtype);
}

// rows x d f32 at p.
inline Tensor row_view(const kernels::Ctx& ctx, const float* p, int64_t rows, int64_t d) {
  return view_of(ctx, p, {rows, d});
}

// The permute's gather (kernels::gather_rows): out [n, d] = the rows
// index[0, n) (i64 on ctx's device) of x [T, d].
void gather_send_rows(const kernels::Ctx& ctx, const float* x, int64_t T, const int64_t* index,
                      int64_t n, float* out, int64_t d);
// to[0, n) = from[0, n), f32 on ctx's device (nothing when they coincide).
void copy_floats(const kernels::Ctx& ctx, const float* from, float* to, int64_t n);

}  // namespace trident::ep
