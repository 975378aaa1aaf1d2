// Tensor views of the ep transports' row buffers: their boxes in shared
// windows and the pieces of MPI buffers. The public calls take tensors;
// the transports move the bytes behind them and hand rows back as views,
// on which the kernels' tensor ops run. Nothing is copied.
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

// The first n rows [n, d] of a buffer (kernels::reserve'd, any shape).
inline Tensor first_rows(const Tensor& buffer, int64_t n, int64_t d) {
  return buffer.view(0, {n, d});
}

// d of a row tensor that should hold n rows: its last dimension, checked
// (f32, n * d elements); `what` names it in the error.
int64_t row_width(const Tensor& t, int64_t n, const char* what);

// to[0, n) = from[0, n), f32 on ctx's device (nothing when they coincide).
void copy_floats(const kernels::Ctx& ctx, const float* from, float* to, int64_t n);

}  // namespace trident::ep
