// Tensors for a Ctx: allocation from its allocator, and copies that pick the
// host or the device path from where the tensors live.
#include "trident/kernels/tensor_ops.hpp"

#include <cstring>
#include <string>

#include "trident/core/emulated.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/ops.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/runtime.hpp"
#endif

namespace trident::kernels {

Allocator& allocator_of(const Ctx& ctx) {
  if (ctx.alloc) return *ctx.alloc;
  if (ctx.device.is_emulated()) return emulated::allocator();
  TRIDENT_CHECK(ctx.device.is_cpu(),
                "kernels: a " + ctx.device.str() + " Ctx without an allocator makes no tensors");
  return cpu_allocator();
}

Tensor empty(const Ctx& ctx, std::vector<int64_t> shape, DType dtype) {
  return Tensor::empty(std::move(shape), allocator_of(ctx), dtype);
}

Tensor zeros(const Ctx& ctx, std::vector<int64_t> shape) {
  Tensor t = empty(ctx, std::move(shape));
  fill(ctx, t.ptr(), t.numel(), 0.0f);
  return t;
}

void reserve(const Ctx& ctx, Tensor& t, int64_t n) {
  if (t.numel() < n) t = empty(ctx, {n});
}

namespace {

// Bytes from src to dst where each lives (host or ctx's device). The
// emulated device's copies are host copies with its guard lifted: the
// explicit transfers that a GPU would make.
void copy_bytes(const Ctx& ctx, void* dst, Device to, const void* src, Device from, size_t bytes) {
  if (bytes == 0) return;
  if (to.is_cpu() && from.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (!to.is_cuda() && !from.is_cuda()) {
    const emulated::Guard lifted;
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef TRIDENT_HAVE_CUDA
  if (to.is_cpu())
    cuda::copy_to_host(ctx, dst, src, bytes);
  else if (from.is_cpu())
    cuda::copy_to_device(ctx, dst, src, bytes);
  else
    cuda::copy_device(ctx, dst, src, bytes);
#else
  (void)ctx;
  throw Error("kernels: a copy between " + from.str() + " and " + to.str() +
              " in a build without CUDA");
#endif
}

void check_same_layout(const Tensor& dst, const Tensor& src, const char* what) {
  TRIDENT_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(),
                std::string(what) + ": " + dst.shape_str() + " " + dtype_name(dst.dtype()) +
                    " <- " + src.shape_str() + " " + dtype_name(src.dtype()));
}

}  // namespace

void copy(const Ctx& ctx, Tensor& dst, const Tensor& src) {
  check_same_layout(dst, src, "kernels::copy");
  copy_bytes(ctx, dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.bytes());
}

Tensor clone(const Ctx& ctx, const Tensor& src) {
  Tensor t = empty(ctx, src.shape(), src.dtype());
  copy_bytes(ctx, t.data_ptr(), t.device(), src.data_ptr(), src.device(), src.bytes());
  return t;
}

Tensor to_host(const Ctx& ctx, const Tensor& src) {
  Tensor t = Tensor::empty(src.shape(), cpu_allocator(), src.dtype());
  copy_bytes(ctx, t.data_ptr(), t.device(), src.data_ptr(), src.device(), src.bytes());
  return t;
}

Tensor from_host(const Ctx& ctx, const void* host, std::vector<int64_t> shape, DType dtype) {
  Tensor t = empty(ctx, std::move(shape), dtype);
  copy_bytes(ctx, t.data_ptr(), t.device(), host, Device::cpu(), t.bytes());
  return t;
}

void synchronize(const Ctx& ctx, double timeout_s) {
  if (!ctx.device.is_cuda()) return;
#ifdef TRIDENT_HAVE_CUDA
  cuda::synchronize(ctx, timeout_s, "work on " + ctx.device.str() + "'s stream");
#else
  (void)timeout_s;
  throw Error("kernels: " + ctx.device.str() + " in a build without CUDA");
#endif
}

}  // namespace trident::kernels
