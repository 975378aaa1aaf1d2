// Tensors on a GPU: storage from the CUDA allocator (counted), host <-> device
// and device <-> device copies, zeros, views and grow-only buffers, each
// checked bit for bit against the host tensor it came from.
#include <cstring>

#include "harness.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace gpu_test;
namespace k = trident::kernels;
using trident::Tensor;

namespace {

Tensor host_random(std::vector<int64_t> shape, const char* name) {
  Tensor t(std::move(shape));
  const auto v = randn(size_t(t.numel()), name);
  std::memcpy(t.ptr(), v.data(), t.bytes());
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.bytes()) == 0;
}

}  // namespace

GPU_TEST("clone to the device and back is exact; the allocator counts it") {
  const k::Ctx ctx = dc.ctx();
  const size_t before = dc.allocator().bytes_in_use();
  Tensor h = host_random({37, 53}, "tensor");
  {
    Tensor d = k::clone(ctx, h);
    expect(d.device().is_cuda(), "clone lives on " + d.device().str());
    expect(d.shape() == h.shape(), "clone keeps the shape");
    expect(dc.allocator().bytes_in_use() >= before + h.bytes(), "device bytes counted");
    expect(same_bits(k::to_host(ctx, d), h), "host -> device -> host");
    Tensor d2 = k::zeros(ctx, {37, 53});
    expect(same_bits(k::to_host(ctx, d2), Tensor({37, 53})), "zeros on the device");
    k::copy(ctx, d2, d);
    expect(same_bits(k::to_host(ctx, d2), h), "device -> device copy");
    Tensor rows = d.rows(5, 9);
    expect(same_bits(k::to_host(ctx, rows), h.rows(5, 9).clone()), "a device view");
  }
  expect(dc.allocator().bytes_in_use() == before, "every device byte returned");
}

GPU_TEST("reserve grows a device buffer and keeps it when large enough") {
  const k::Ctx ctx = dc.ctx();
  Tensor buf;
  k::reserve(ctx, buf, 1000);
  expect(buf.device().is_cuda() && buf.numel() >= 1000, "reserve 1000");
  const void* p = buf.data_ptr();
  k::reserve(ctx, buf, 500);
  expect(buf.data_ptr() == p, "a smaller request keeps the buffer");
  k::reserve(ctx, buf, 5000);
  expect(buf.numel() >= 5000, "reserve 5000 grows");
}
