// MoE token kernels of kernels/moe.hpp on the GPU: top-k per row, the
// expert-major gather, the weighted combine and their backward passes. Every
// sum over a token's k copies runs in slot order, as on the CPU, so a token's
// result does not depend on where its copies were computed.
#include "common.cuh"

namespace trident::kernels::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// One thread per token: insertion into the k-long sorted list in idx itself
// (k is small); strict comparison keeps the lower expert index on ties.
__global__ void topk_kernel(const float* scores, int64_t T, int E, int k, int* idx) {
  GRID_STRIDE(t, T) {
    const float* s = scores + t * E;
    int* out = idx + t * k;
    int n = 0;
    for (int e = 0; e < E; ++e) {
      int pos = n;
      while (pos > 0 && s[e] > s[out[pos - 1]]) --pos;
      if (pos >= k) continue;
      for (int m = min(n, k - 1); m > pos; --m) out[m] = out[m - 1];
      out[pos] = e;
      if (n < k) ++n;
    }
  }
}

__global__ void gather_kernel(const float* x, int64_t d, const int64_t* src_row, int64_t n,
                              float* out) {
  GRID_STRIDE(e, n * d) out[e] = x[src_row[e / d] * d + e % d];
}

// y[t, c] = sum over slots j (in order) of w[t, j] * rows[row[t, j], c];
// w null: weights 1 (the scatter-add of the gather's backward).
__global__ void combine_kernel(const float* rows, int64_t d, const int64_t* row,
                               const float* weight, int64_t T, int k, float* y) {
  GRID_STRIDE(e, T * d) {
    const int64_t t = e / d, c = e % d;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;
      acc += (weight ? weight[t * k + j] : 1.0f) * rows[r * d + c];
    }
    y[e] = acc;
  }
}

// One warp per (token, slot): drows[row] = w * dy[t], dweight = <dy[t], rows[row]>
// accumulated in fp64 as on the CPU.
__global__ void combine_backward_kernel(const float* rows, const float* dy, int64_t d,
                                        const int64_t* row, const float* weight, int64_t T, int k,
                                        float* drows, float* dweight) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= T * k) return;
  const int64_t t = w / k, r = row[w];
  if (r < 0) {
    if (lane == 0) dweight[w] = 0.0f;
    return;
  }
  double dot = 0.0;
  for (int64_t c = lane; c < d; c += 32) {
    dot += double(dy[t * d + c]) * double(rows[r * d + c]);
    drows[r * d + c] = weight[w] * dy[t * d + c];
  }
  dot = warp_sum(dot);
  if (lane == 0) dweight[w] = float(dot);
}

#undef GRID_STRIDE

unsigned warp_blocks(int64_t warps) {
  return unsigned((warps * 32 + plan::kThreads - 1) / plan::kThreads);
}

}  // namespace

void topk_rows(const Ctx& c, const float* scores, int64_t T, int E, int k, int* idx) {
  if (T == 0) return;
  TRIDENT_CHECK(k >= 1 && k <= E, "topk_rows: k must be in 1..E");
  topk_kernel<<<plan::grid_for(T), plan::kThreads, 0, stream_of(c)>>>(scores, T, E, k, idx);
  CUDA_CHECK_LAUNCH();
}

void gather_rows(const Ctx& c, const float* x, int64_t d, const int64_t* src_row, int64_t n,
                 float* out) {
  if (n * d == 0) return;
  gather_kernel<<<plan::grid_for(n * d), plan::kThreads, 0, stream_of(c)>>>(x, d, src_row, n, out);
  CUDA_CHECK_LAUNCH();
}

void combine_rows(const Ctx& c, const float* rows, int64_t d, const int64_t* row,
                  const float* weight, int64_t T, int k, float* y) {
  if (T * d == 0) return;
  combine_kernel<<<plan::grid_for(T * d), plan::kThreads, 0, stream_of(c)>>>(rows, d, row, weight,
                                                                             T, k, y);
  CUDA_CHECK_LAUNCH();
}

void combine_rows_backward(const Ctx& c, const float* rows, const float* dy, int64_t d,
                           const int64_t* row, const float* weight, int64_t T, int k, float* drows,
                           float* dweight) {
  if (T * k == 0) return;
  combine_backward_kernel<<<warp_blocks(T * k), plan::kThreads, 0, stream_of(c)>>>(
      rows, dy, d, row, weight, T, k, drows, dweight);
  CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(const Ctx& c, const float* drows, int64_t d, const int64_t* row, int64_t T,
                      int k, float* dx) {
  combine_rows(c, drows, d, row, nullptr, T, k, dx);
}

}  // namespace trident::kernels::cuda
