// Shared pieces of the CUDA kernels: the Ctx's handles as CUDA types, bf16
// loads and stores, warp and block reductions, and per-call scratch memory.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "trident/kernels/cuda/check.hpp"
#include "trident/kernels/cuda/ops.hpp"
#include "trident/kernels/cuda/plan.hpp"
#include "trident/kernels/cuda/runtime.hpp"

namespace trident::kernels::cuda {

inline cudaStream_t stream_of(const Ctx& c) { return static_cast<cudaStream_t>(c.stream); }
inline cublasHandle_t blas_of(const Ctx& c) {
  TRIDENT_CHECK(c.blas != nullptr, "CUDA op called with a Ctx without a cuBLAS handle");
  return static_cast<cublasHandle_t>(c.blas);
}

static_assert(sizeof(Bf16) == sizeof(__nv_bfloat16), "Bf16 must be the 16 bits of a bfloat16");
inline const __nv_bfloat16* dev(const Bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
inline __nv_bfloat16* dev(Bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

__device__ __forceinline__ float load_f(const float* p) { return *p; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }

constexpr unsigned kFullMask = 0xffffffffu;

template <class T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `red` is shared memory of 32 elements.
template <class T>
__device__ T block_sum(T x, T* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = x;
  __syncthreads();
  T total = lane < warps ? red[lane] : T(0);
  return warp_sum(total);
}
__device__ inline float block_max(float x, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) red[warp] = x;
  __syncthreads();
  return warp_max(lane < warps ? red[lane] : -INFINITY);
}

// Scratch device memory for one call: the Ctx's workspace when it has one
// (and the caller allows it: an op whose output may itself be workspace
// memory must not), else a stream-ordered allocation freed (in stream order)
// at scope exit.
class Scratch {
 public:
  Scratch(const Ctx& c, size_t bytes, bool may_use_workspace = true) : stream_(stream_of(c)) {
    if (bytes == 0) return;
    if (c.workspace && may_use_workspace) {
      p_ = c.workspace->get(bytes);
    } else {
      CUDA_CHECK(cudaMallocAsync(&p_, bytes, stream_));
      owned_ = true;
    }
  }
  ~Scratch() {
    if (owned_) (void)cudaFreeAsync(p_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  cudaStream_t stream_;
  void* p_ = nullptr;
  bool owned_ = false;
};

}  // namespace trident::kernels::cuda
