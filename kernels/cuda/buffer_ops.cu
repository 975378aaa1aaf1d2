// The buffer ops of the interface (kernels/ops.hpp) on the device: copy and
// fill, which model and parallel code use instead of loops over memory.
#include "common.cuh"
#include "trident/kernels/cuda/runtime.hpp"

namespace trident::kernels::cuda {
namespace {

__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

}  // namespace

void copy(const Ctx& c, float* dst, const float* src, int64_t n) {
  copy_device(c, dst, src, size_t(n) * sizeof(float));
}

void fill(const Ctx& c, float* x, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(x, n, value);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
